"""`Module`: the container every layer and model is built from.

A module owns three kinds of state, each registered by plain attribute assignment:

* **parameters**: a leaf `Tensor` with ``requires_grad=True``
  (``self.weight = Tensor(w, requires_grad=True)``);
* **children**: another `Module` (``self.fc = Linear(4, 8)``);
* **buffers**: NumPy arrays registered with `Module.register_buffer` (masks, running statistics).
  Buffers are never parameters; only buffers registered with ``persistent=True`` appear in
  `state_dict`.

Anything else, including a `Tensor` with ``requires_grad=False`` and the result of an operation (a
Tensor with a backward function, e.g. ``self.cached = self.weight * 2``), is an ordinary Python
attribute: it is not a parameter, the optimizer never sees it, and it is not saved. (A result kept
across training steps is part of each step's graph: ``backward(retain_graph=False)``, which the
Trainer uses, consumes it in the first step, so recompute it in ``forward``, as in PyTorch.)
Reassigning a name replaces its registration (a parameter name given a `Module` becomes a child;
given ``None`` it becomes a plain attribute), and ``del module.name`` removes it.

Parameters are listed in PyTorch's order: a module's own parameters in assignment order, then each
child's, children in assignment order. A parameter or module reachable twice (tied weights, a shared
block) is listed once, under the first name met in that order.

>>> import numpy as np
>>> from glassllm import Tensor
>>> class Affine(Module):
...     def __init__(self):
...         super().__init__()
...         self.scale = Tensor(np.ones(3, dtype=np.float32), requires_grad=True)
...         self.offset = Tensor(np.zeros(3, dtype=np.float32))  # no grad: plain attribute
...     def forward(self, x):
...         return x * self.scale + self.offset
>>> model = Affine()
>>> [name for name, _ in model.named_parameters()]
['scale']
>>> model.state_dict()["scale"].dtype
dtype('float32')
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np

from glassllm.autograd import module_calls
from glassllm.nn._state_checks import describe_unexpected, value_problems
from glassllm.tensor import Tensor


class IncompatibleKeys(NamedTuple):
    """What `Module.load_state_dict` did not match; unpacks as ``missing, unexpected`` (torch)."""

    missing_keys: list[str]
    unexpected_keys: list[str]


class Module:
    """Base class of every layer: call ``super().__init__()`` first, then assign attributes.

    ``module(*args)`` runs ``module.forward(*args)``. ``training`` (True after construction) is set
    on the whole tree by `train` and `eval`; layers such as `Dropout` read it.
    """

    training: bool
    # Empty defaults read by __call__, never written to (glassllm.nn.hooks.register)
    _forward_hooks: dict = {}  # noqa: RUF012
    _forward_pre_hooks: dict = {}  # noqa: RUF012
    _is_hook_point = False  # HookPoint: hidden from repr, an attribute of its parent too

    def __init__(self) -> None:
        # object.__setattr__ because our own __setattr__ needs these dicts to exist.
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_non_persistent_buffers", set())
        object.__setattr__(self, "training", True)

    # ------------------------------------------------------------------ attribute registration

    def __setattr__(self, name: str, value: Any) -> None:
        registries = self.__dict__.get("_parameters")
        if registries is None:
            if isinstance(value, (Tensor, Module)):
                raise AttributeError(
                    f"cannot assign {type(value).__name__} {name!r} before Module.__init__(): "
                    f"call super().__init__() first in {type(self).__name__}.__init__"
                )
            object.__setattr__(self, name, value)
            return
        if isinstance(value, Tensor) and value.requires_grad and value._backward is None:
            _check_registered_name(name)
            self._unregister(name, keep="_parameters")
            self._parameters[name] = value
        elif isinstance(value, Module):
            _check_registered_name(name)
            self._unregister(name, keep="_modules")
            self._modules[name] = value
            if value._is_hook_point:  # read in every forward: found without __getattr__
                object.__setattr__(self, name, value)
        elif name in self._buffers and (value is None or isinstance(value, np.ndarray)):
            self._buffers[name] = value  # updating a buffer keeps it a buffer (and its persistence)
        else:
            self._unregister(name, keep=None)
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails; read self.__dict__ directly so that a half-built
        # object (e.g. during copy or unpickling) cannot recurse into __getattr__.
        state = self.__dict__
        for registry in ("_parameters", "_modules", "_buffers"):
            entries = state.get(registry)
            if entries is not None and name in entries:
                return entries[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        for registry in ("_parameters", "_modules", "_buffers"):
            entries = self.__dict__.get(registry)
            if entries is not None and name in entries:
                del entries[name]
                self._non_persistent_buffers.discard(name)
                self.__dict__.pop(name, None)  # a hook point's copy
                return
        object.__delattr__(self, name)

    def __dir__(self) -> list[str]:
        return sorted(
            set(super().__dir__()) | set(self._parameters) | set(self._modules) | set(self._buffers)
        )

    def _unregister(self, name: str, keep: str | None) -> None:
        """Drop ``name`` from every registry but ``keep`` (and from plain attributes), so a name has
        exactly one meaning after reassignment."""
        for registry in ("_parameters", "_modules", "_buffers"):
            if registry != keep:
                self.__dict__[registry].pop(name, None)
        if keep != "_buffers":
            self._non_persistent_buffers.discard(name)
        self.__dict__.pop(name, None)

    def register_buffer(
        self, name: str, array: np.ndarray | None, persistent: bool = False
    ) -> None:
        """Register ``array`` as non-trainable state under ``name`` (readable as ``self.name``).

        Buffers never appear in `parameters`. Unlike PyTorch, buffers are *non-persistent by
        default*: in glassllm they hold derived state (causal masks, caches) that construction
        rebuilds, and a checkpoint should hold only what training learned. Pass ``persistent=True``
        for state that must travel with the weights (e.g. running statistics); it then appears in
        `state_dict` and `load_state_dict` copies into it in place. Assigning an ndarray (or None)
        to a buffer's name later replaces its value and keeps it a buffer.
        """
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot register a buffer before Module.__init__() is called")
        if not isinstance(name, str):
            raise TypeError(f"buffer name must be a str, got {type(name).__name__}")
        _check_registered_name(name)
        if array is not None and not isinstance(array, np.ndarray):
            raise TypeError(
                f"buffer {name!r} must be a numpy ndarray or None, got {type(array).__name__}"
            )
        if name in self._parameters or name in self._modules:
            kind = "parameter" if name in self._parameters else "submodule"
            raise KeyError(f"cannot register buffer {name!r}: a {kind} already has that name")
        if name in self.__dict__:
            raise KeyError(
                f"cannot register buffer {name!r}: a plain attribute already has that name"
            )
        self._buffers[name] = array
        if persistent:
            self._non_persistent_buffers.discard(name)
        else:
            self._non_persistent_buffers.add(name)

    # ------------------------------------------------------------------ running

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        outer = module_calls.current  # the ops made below keep this call: glassllm.graph's folds
        module_calls.current = (self, outer)
        try:
            if not (self._forward_pre_hooks or self._forward_hooks):
                return self.forward(*args, **kwargs)
            from glassllm.nn.hooks import call_with_hooks  # hooks.py imports this module

            return call_with_hooks(self, args, kwargs)
        finally:
            module_calls.current = outer

    def register_forward_hook(self, hook: Callable, *, prepend: bool = False) -> Any:
        """Call ``hook(module, args, output)`` after each ``forward``; a result other than None
        replaces the output. Returns a `RemovableHandle` (PyTorch's rules: `glassllm.nn.hooks`)."""
        from glassllm.nn.hooks import register

        return register(self, "_forward_hooks", hook, prepend)

    def register_forward_pre_hook(self, hook: Callable, *, prepend: bool = False) -> Any:
        """Call ``hook(module, args)`` before each ``forward``; a result other than None
        replaces the positional arguments (a non-tuple becomes a 1-tuple); a `RemovableHandle`."""
        from glassllm.nn.hooks import register

        return register(self, "_forward_pre_hooks", hook, prepend)

    # ------------------------------------------------------------------ traversal

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """Yield ``(dotted name, module)`` for this module (name ``prefix``, "" by default) and
        every descendant, depth first in assignment order; a module reachable twice is yielded
        once."""
        seen: set[int] = set()
        stack: list[tuple[str, Module]] = [(prefix, self)]
        while stack:  # iterative: deep trees cannot hit the recursion limit
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            yield name, module
            children = reversed(module._modules.items())  # popped in assignment order
            stack.extend((f"{name}.{key}" if name else key, child) for key, child in children)

    def modules(self) -> Iterator[Module]:
        return (module for _, module in self.named_modules())

    def named_children(self) -> Iterator[tuple[str, Module]]:
        """Yield ``(name, child)`` for direct children, in assignment order, each module once."""
        seen: set[int] = set()
        for name, child in self._modules.items():
            if id(child) not in seen:
                seen.add(id(child))
                yield name, child

    def children(self) -> Iterator[Module]:
        return (child for _, child in self.named_children())

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        """Yield ``(dotted name, parameter)``: own parameters first, then each child's, children in
        assignment order (so ``blocks.0.attn.qkv.weight``). A shared parameter is yielded once,
        under the first name met."""
        seen: set[int] = set()
        for module_name, module in self.named_modules(prefix):
            for name, param in module._parameters.items():
                if id(param) not in seen:
                    seen.add(id(param))
                    yield (f"{module_name}.{name}" if module_name else name), param

    def parameters(self) -> Iterator[Tensor]:
        return (param for _, param in self.named_parameters())

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, np.ndarray]]:
        """Yield ``(dotted name, array)`` for every buffer that is not None, each array once."""
        seen: set[int] = set()
        for module_name, module in self.named_modules(prefix):
            for name, array in module._buffers.items():
                if array is not None and id(array) not in seen:
                    seen.add(id(array))
                    yield (f"{module_name}.{name}" if module_name else name), array

    def buffers(self) -> Iterator[np.ndarray]:
        return (array for _, array in self.named_buffers())

    def apply(self, fn: Callable[[Module], Any]) -> Module:
        """Call ``fn(module)`` on every module in the tree (children before parents, as PyTorch)."""
        for module in reversed(list(self.modules())):
            fn(module)
        return self

    # ------------------------------------------------------------------ modes and gradients

    def train(self, mode: bool = True) -> Module:
        """Set ``training = mode`` on this module and every descendant; return self."""
        if not isinstance(mode, bool):
            raise TypeError(f"train(mode) expects a bool, got {type(mode).__name__}")
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self) -> Module:
        """Same as ``train(False)``: dropout becomes the identity."""
        return self.train(False)

    def evaluating(self) -> contextlib.AbstractContextManager[None]:
        """``with model.evaluating():`` runs the body in eval mode, then gives every module of
        the tree back its own mode (a mixed tree stays mixed), also when the body raises.

        >>> import glassllm.nn as nn
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))
        >>> _ = model[1].eval()  # one module in eval mode already
        >>> with model.evaluating():
        ...     [m.training for m in model.modules()]
        [False, False, False]
        >>> [m.training for m in model.modules()]
        [True, True, False]
        """
        return eval_mode(self)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Set every parameter's ``grad`` to None (the next backward starts from nothing); with
        ``set_to_none=False`` fill the gradient arrays with zeros instead (torch's signature)."""
        clear_grads(self.parameters(), set_to_none)

    def num_parameters(self) -> int:
        """Number of scalars in the parameters, a shared parameter counted once."""
        return sum(int(param.size) for param in self.parameters())

    # ------------------------------------------------------------------ state dict

    def _state_targets(self) -> dict[str, np.ndarray]:
        """The arrays `state_dict` reads and `load_state_dict` writes: parameters' ``.data`` in
        `named_parameters` order, then persistent buffers; each array once."""
        targets: dict[str, np.ndarray] = {
            name: param.data for name, param in self.named_parameters()
        }
        seen = {id(param) for param in self.parameters()}
        for module_name, module in self.named_modules():
            for name, array in module._buffers.items():
                if array is None or name in module._non_persistent_buffers or id(array) in seen:
                    continue
                seen.add(id(array))
                targets[f"{module_name}.{name}" if module_name else name] = array
            for name, array in module._computed_state().items():
                targets[f"{module_name}.{name}" if module_name else name] = array
        return targets

    def _computed_state(self) -> dict[str, np.ndarray]:
        """Arrays a layer computes when read instead of holding them, read-only: `state_dict`
        saves them, `load_state_dict` refuses them (`QuantizedLinear`'s weight); none here."""
        return {}

    def _aliases(self) -> dict[str, str]:
        """Map each later name of a shared parameter to the name it is stored under."""
        first_name: dict[int, str] = {}
        aliases: dict[str, str] = {}
        for module_name, module in self.named_modules():
            for name, param in module._parameters.items():
                full = f"{module_name}.{name}" if module_name else name
                if id(param) in first_name:
                    aliases[full] = first_name[id(param)]
                else:
                    first_name[id(param)] = full
        return aliases

    def state_dict(self) -> dict[str, np.ndarray]:
        """Return ``{dotted name: copy of the array}`` for every parameter and persistent buffer.

        Copies, so later training does not change a saved state. A shared (tied) parameter is stored
        once, under its first name in `named_parameters` order. The names are the tensor names a
        safetensors checkpoint uses.
        """
        return {name: np.array(array, copy=True) for name, array in self._state_targets().items()}

    def check_state_dict(
        self, state_dict: Mapping[str, np.ndarray], strict: bool = True
    ) -> list[str]:
        """Every reason `load_state_dict` would refuse ``state_dict``, one line each; ``[]`` if
        it would load. Nothing is changed and nothing is copied.

        Each value must be an ndarray of exactly its target's shape and dtype (no silent casts),
        the target must be writeable, and with ``strict=True`` no key may be missing or
        unexpected. Shape, dtype and type problems count even with ``strict=False`` (as in
        PyTorch). Raises ``TypeError`` if ``state_dict`` is not a mapping.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(
                "load_state_dict expects a mapping of name -> ndarray, "
                f"got {type(state_dict).__name__}"
            )
        targets = self._state_targets()
        problems: list[str] = []
        for key, value in state_dict.items():
            if key in targets:
                problems += value_problems(key, value, targets[key])
        if strict:
            missing = [name for name in targets if name not in state_dict]
            unexpected = [key for key in state_dict if key not in targets]
            if missing:
                problems.append("missing keys: " + ", ".join(missing))
            if unexpected:
                described = describe_unexpected(unexpected, self._aliases())
                problems.append("unexpected keys: " + ", ".join(described))
        return problems

    def load_state_dict(
        self, state_dict: Mapping[str, np.ndarray], strict: bool = True
    ) -> IncompatibleKeys:
        """Copy ``state_dict``'s arrays into the parameters and persistent buffers, in place.

        Everything is checked first with `check_state_dict`; every problem found goes into one
        ``ValueError`` and the module is left unchanged. Values are copied with `np.copyto`
        into the existing arrays, so the caller's arrays are never kept and tied weights stay
        tied. With ``strict=False`` missing and unexpected keys are tolerated, nothing else.

        Returns ``IncompatibleKeys(missing_keys, unexpected_keys)`` (empty after a strict load).
        """
        problems = self.check_state_dict(state_dict, strict)
        if problems:
            raise ValueError(
                f"cannot load state dict into {type(self).__name__} ({len(problems)} problem"
                f"{'s' if len(problems) != 1 else ''}; nothing was changed):\n  "
                + "\n  ".join(problems)
            )
        targets = self._state_targets()
        for key, target in targets.items():
            if key in state_dict:
                np.copyto(target, state_dict[key])
        missing = [name for name in targets if name not in state_dict]
        unexpected = [key for key in state_dict if key not in targets]
        return IncompatibleKeys(missing, unexpected)

    # ------------------------------------------------------------------ printing

    def extra_repr(self) -> str:
        """The text inside this module's parentheses in `repr`; layers override it."""
        return ""

    def __repr__(self) -> str:
        own = self._parameters.items()
        own_summary = ", ".join(f"{name} {tuple(p.shape)}" for name, p in own)
        own_count = sum(int(p.size) for _, p in own)
        header = f"{type(self).__name__}({self.extra_repr()}"
        shown = {name: m for name, m in self._modules.items() if not m._is_hook_point}
        if not shown:
            if own_summary:
                return f"{header})  # {own_summary}: {_count(own_count)}"
            return header + ")"
        lines = [header + (f"  # own: {own_summary}" if own_summary else "")]
        for name, child in shown.items():
            child_text = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {child_text}")
        lines.append(f")  # {_count(self.num_parameters())} in total")
        return "\n".join(lines)


def clear_grads(params: Iterable[Tensor], set_to_none: bool = True) -> None:
    """``zero_grad`` of `Module` and `Optimizer`: ``grad = None``, or zeros written in place (a
    read-only gradient, e.g. a broadcast view a user assigned, is replaced by a zero array)."""
    if not isinstance(set_to_none, bool):
        raise TypeError(f"set_to_none must be a bool, got {type(set_to_none).__name__}")
    for param in params:
        if set_to_none or param.grad is None:
            param.grad = None
        elif param.grad.flags.writeable:
            param.grad.fill(0)
        else:
            param.grad = np.zeros(param.grad.shape, dtype=param.grad.dtype)


def _count(n: int) -> str:
    return f"{n:,} parameter{'s' if n != 1 else ''}"


def _check_registered_name(name: str) -> None:
    # Dotted names are how nesting is spelt in state_dict keys, so a dot inside one name is
    # ambiguous.
    if not name or "." in name:
        raise KeyError(f"invalid attribute name {name!r} for a parameter, buffer or submodule")


@contextmanager
def eval_mode(modules: Module | Iterable[Module]) -> Iterator[None]:
    """Eval mode for ``modules`` (a module's whole tree, or a list of modules) while the body
    runs; each module's previous mode comes back after, also when the body raises.

    `Module.evaluating` is this for one tree. A list lets a caller that enters eval mode often
    (generation, once per token) walk the tree once and pass the list: walking it per token cost
    a quarter of a cached decoding step. PyTorch has no such helper (``torch.inference_mode``
    is about gradients); ``was_training = m.training; m.eval(); ...; m.train(was_training)`` is
    the usual hand-written form, which flattens a mixed tree to the root's mode.
    """
    modules = list(modules.modules()) if isinstance(modules, Module) else list(modules)
    modes = [module.training for module in modules]
    for module in modules:
        object.__setattr__(module, "training", False)  # as Module.train: not a registration
    try:
        yield
    finally:
        for module, mode in zip(modules, modes, strict=True):
            object.__setattr__(module, "training", mode)

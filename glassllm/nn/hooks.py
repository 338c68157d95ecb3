"""Forward hooks: run code on a module's inputs or output, and `HookPoint`, a named site in a
model where a hook reads or replaces the tensor passing through.

`Module.register_forward_pre_hook` and `Module.register_forward_hook` follow PyTorch's rules:

* ``pre_hook(module, args)`` runs before ``forward``; returning something other than None
  replaces the positional arguments (a value that is not a tuple becomes a 1-tuple);
* ``hook(module, args, output)`` runs after it, ``args`` being the arguments forward received;
  returning something other than None replaces the output, and the next hook sees the
  replacement;
* hooks run in registration order (``prepend=True`` puts one first); keyword arguments go to
  ``forward`` and are not shown to the hooks (torch's default ``with_kwargs=False``);
* each registration returns a `RemovableHandle`; ``handle.remove()`` undoes it (twice is a
  no-op), and ``with handle:`` removes it at the end of the block. An exception in a hook
  propagates to the caller and leaves the hooks registered as they were.

A replacement is an ordinary graph node, so gradients flow through ``output * 2`` as through any
operation. With nothing registered, ``module(x)`` costs one check of two empty dicts more than
``module.forward(x)``.

>>> import numpy as np
>>> from glassllm import Tensor
>>> point = HookPoint()
>>> handle = point.register_forward_hook(lambda module, args, out: out * 2)
>>> point(Tensor(np.ones(2, dtype=np.float32))).data.tolist()
[2.0, 2.0]
>>> handle.remove()
>>> point(Tensor(np.ones(2, dtype=np.float32))).data.tolist()
[1.0, 1.0]
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from glassllm.nn.module import Module
from glassllm.tensor import Tensor

ForwardHook = Callable[[Module, tuple, Any], Any]
ForwardPreHook = Callable[[Module, tuple], Any]

_next_id = itertools.count()
# Hooks attached to HookPoints through `register`, in every model: while there are none
# (training, plain sampling), a layer's check of its points is the read of this one number.
# (Hooks that arrive on a copy of a module, deepcopy or pickle, are not counted.)
_point_hooks = 0


class RemovableHandle:
    """Undoes one hook registration: ``remove()`` (idempotent), or use it as a context manager."""

    def __init__(self, hooks: dict[int, Callable], on_point: bool = False) -> None:
        self.id = next(_next_id)
        self._hooks = hooks  # the module's dict (not the module: a handle does not keep it)
        self._on_point = on_point

    def remove(self) -> None:
        global _point_hooks
        if self._hooks.pop(self.id, None) is not None and self._on_point:
            _point_hooks -= 1

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.remove()


def register(module: Module, attribute: str, hook: Callable, prepend: bool) -> RemovableHandle:
    """Add ``hook`` to ``module``'s dict ``attribute`` (``_forward_hooks`` or
    ``_forward_pre_hooks``). The class holds an empty dict as the default; the first
    registration gives the instance its own, so the class's is never written to."""
    global _point_hooks
    if not callable(hook):
        raise TypeError(f"a hook must be callable, got {type(hook).__name__}")
    hooks = module.__dict__.get(attribute)
    if hooks is None:
        hooks = {}
        object.__setattr__(module, attribute, hooks)  # not a registration (Module.__setattr__)
    handle = RemovableHandle(hooks, on_point=module._is_hook_point)
    if module._is_hook_point:
        _point_hooks += 1
    if prepend:
        rest = list(hooks.items())
        hooks.clear()
        hooks[handle.id] = hook
        hooks.update(rest)
    else:
        hooks[handle.id] = hook
    return handle


def call_with_hooks(module: Module, args: tuple, kwargs: dict) -> Any:
    """``module(*args, **kwargs)`` with its pre-hooks and forward hooks (`Module.__call__` comes
    here only when one is registered). The hooks are read into a tuple first, so a hook may
    remove itself (or add another, which runs from the next call)."""
    for hook in tuple(module._forward_pre_hooks.values()):
        result = hook(module, args)
        if result is not None:
            args = result if isinstance(result, tuple) else (result,)
    output = module.forward(*args, **kwargs)
    for hook in tuple(module._forward_hooks.values()):
        result = hook(module, args, output)
        if result is not None:
            output = result
    return output


class HookPoint(Module):
    """The identity, ``point(x) is x``, at a named site of a model: a forward hook on it reads or
    replaces the tensor passing through (TransformerLens's ``HookPoint``).

    ``name`` is the site's name in its model (``blocks.0.attn.hook_q``; set by the model, "" for
    a point on its own). ``side``: the forward computes this value only for the hooks (an
    attention pattern the fused op never materialises, a norm's scale): a hook may read it at
    no cost to the forward's arithmetic, and a replacement switches that layer to the unfused
    computation that consumes it. A point is hidden from its parent's ``repr``.
    """

    _is_hook_point = True

    def __init__(self, side: bool = False) -> None:
        super().__init__()
        self.name = ""
        self.side = bool(side)

    def __call__(self, x: Any) -> Any:  # Module.__call__ without the forward call: the common path
        if self._forward_hooks or self._forward_pre_hooks:
            return call_with_hooks(self, (x,), {})
        return x

    def forward(self, x: Any) -> Any:
        return x

    @property
    def active(self) -> bool:
        """Whether a hook is attached (a layer computes a `side` value only then)."""
        return bool(self._forward_hooks or self._forward_pre_hooks)

    def extra_repr(self) -> str:
        return repr(self.name) if self.name else ""


def any_active(points: tuple[HookPoint, ...]) -> bool:
    """Whether any of ``points`` has a hook: what a layer checks before its hooked path."""
    if not _point_hooks:
        return False
    for point in points:
        if point._forward_hooks or point._forward_pre_hooks:
            return True
    return False


def straight_through(original: Tensor, data: Any) -> Tensor:
    """A Tensor holding ``data`` (an array of ``original``'s shape) whose gradient passes to
    ``original`` unchanged: how a NumPy replacement joins the graph (exactly ``data``, where
    ``original + (data - original)`` would round)."""
    return Tensor.from_op(data, (original,), lambda g: (g,)).named("hook_replacement")

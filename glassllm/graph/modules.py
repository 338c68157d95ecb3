"""Which module produced each node of a graph, so a drawing can fold a module into one box.

The engine does not know modules: an operation is an operation wherever it ran. But
`Module.__call__` notes itself while its forward runs, and each tracked result keeps the call
it was made in (``Tensor._module_call``: the module and the calls around it). `module_tags`
turns that into dotted paths from the outermost module that ran (``blocks.0.attn``; its own
operations ``""``), and labels each parameter of it with its owner's path and its name: so
``write_html(loss)`` of a GPT's loss is drawn folded, with nothing to switch on.

`record_modules` is the older, explicit way, still honoured first where it recorded (it can name
the outermost module too: ``prefix``). Inside ``with record_modules(model):`` every sub-module
gets a forward pre-hook and a forward hook (`glassllm.nn.hooks`) for the length of the block;
when a module returns, the operations between its inputs and its output that no inner module
claimed are tagged with its dotted path, and each parameter leaf with its owner's path and its
own name. `export_graph` reads the tags into each node's ``module`` (and labels parameters by
name), and `write_html`'s page draws each module as one box that opens on click.

Tags live in a weak dictionary: a tensor that dies takes its tag with it.

>>> import numpy as np
>>> from glassllm import Tensor, nn
>>> from glassllm.graph import export_graph
>>> layer = nn.Linear(2, 2)
>>> with record_modules(layer, prefix="fc"):
...     y = layer(Tensor(np.ones((1, 2), dtype=np.float32))).sum()
>>> [(n["module"], n["label"] or n["op"]) for n in export_graph(y)["nodes"]]
[('', 'const'), ('fc', 'weight'), ('fc', 'bias'), ('fc', 'linear'), ('', 'sum')]
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

from glassllm.nn.module import Module
from glassllm.tensor import Tensor

# tensor -> (module path, label); a parameter's label is its name, an operation's "".
_tags: weakref.WeakKeyDictionary[Tensor, tuple[str, str]] = weakref.WeakKeyDictionary()


def module_of(tensor: Tensor) -> tuple[str, str]:
    """``(module path, label)`` that `record_modules` recorded for ``tensor``; ``("", "")``
    when none was."""
    return _tags.get(tensor, ("", ""))


def module_tags(tensors: list[Tensor]) -> list[tuple[str, str]]:
    """``(module path, label)`` of each tensor: `record_modules`' tag where it made one, else
    from the module call an operation was made in (a path in the outermost module of that call;
    an operation made outside every module ``""``), and for a parameter of such an outermost
    module its owner's path and its name."""
    paths: dict[int, dict[int, str]] = {}  # id(outermost module) -> {id(module): path}
    owners: dict[int, tuple[str, str]] = {}  # id(parameter) -> (owner path, name)
    of_call: dict[int, str] = {}

    def path_of(call: tuple[Module, Any]) -> str:
        chain = []
        while call is not None:
            chain.append(call[0])
            call = call[1]
        root = chain[-1]
        if id(root) not in paths:
            paths[id(root)] = {id(m): path for path, m in root.named_modules()}
            for name, parameter in root.named_parameters():
                owners.setdefault(id(parameter), tuple(name.rpartition(".")[::2]))
        known = paths[id(root)]  # a module called but not registered takes its caller's path
        return next(known[id(m)] for m in chain if id(m) in known)

    tags = [_tags.get(t) for t in tensors]
    for i, tensor in enumerate(tensors):
        call = getattr(tensor, "_module_call", None)  # unset on leaves and constants
        if tags[i] is None and call is not None:
            if id(call) not in of_call:
                of_call[id(call)] = path_of(call)
            tags[i] = (of_call[id(call)], "")
    return [tag or owners.get(id(t), ("", "")) for tag, t in zip(tags, tensors, strict=True)]


def _tensors(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


def _within(path: str, owner: str) -> bool:
    return path == owner or path.startswith(owner + ".")


def _claim(path: str, inputs: set[int], outputs: list[Tensor]) -> None:
    """Tag every untagged tensor between ``inputs`` and ``outputs`` with ``path``; walk through
    tensors an inner module claimed, stop at the inputs and at anything tagged outside."""
    seen: set[int] = set()
    stack = list(outputs)
    while stack:
        tensor = stack.pop()
        if id(tensor) in seen or id(tensor) in inputs:
            continue
        seen.add(id(tensor))
        tag = _tags.get(tensor)
        if tag is None:
            if tensor._backward is None and tensor.requires_grad:
                continue  # a leaf from outside (an input passed another way): not this module's
            _tags[tensor] = (path, "")
        elif not _within(tag[0], path) or tensor._backward is None:
            continue  # another module's tensor, or a parameter (tagged by its owner)
        stack.extend(tensor.parents)


@contextlib.contextmanager
def record_modules(model: Module, prefix: str = "") -> Iterator[Module]:
    """Within the block, tag each operation of ``model``'s forward with the module that ran it
    and each parameter with its owner and name. ``prefix`` names ``model`` itself; without
    one, its own operations stay untagged, drawn at the top level. The hooks are removed on
    leaving, even after an exception."""
    if not isinstance(model, Module):
        raise TypeError(f"record_modules needs a glassllm Module, got {type(model).__name__}")
    for name, parameter in model.named_parameters():
        owner, _, label = name.rpartition(".")
        _tags[parameter] = (f"{prefix}.{owner}".strip(".") if prefix else owner, label)
    handles = []
    pending: dict[int, list[set[int]]] = {}  # module id -> inputs of its calls in progress
    try:
        for path, module in model.named_modules(prefix):
            if not path or getattr(module, "_is_hook_point", False):
                continue

            def before(module: Module, args: tuple) -> None:
                pending.setdefault(id(module), []).append({id(t) for t in _tensors(args)})

            def after(module: Module, args: tuple, output: Any, path: str = path) -> None:
                inputs = pending[id(module)].pop()
                _claim(path, inputs, _tensors(output))

            handles.append(module.register_forward_pre_hook(before))
            handles.append(module.register_forward_hook(after))
        yield model
    finally:
        for handle in handles:
            handle.remove()

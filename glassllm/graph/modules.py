"""Which module produced each node of a graph, so a drawing can fold a module into one box.

The engine does not know modules: an operation is an operation wherever it ran. Inside
``with record_modules(model):`` every sub-module gets a forward pre-hook and a forward hook
(`glassllm.nn.hooks`) for the length of the block; when a module returns, the operations between
its inputs and its output that no inner module claimed are tagged with its dotted path
(``blocks.0.attn``), and each parameter leaf with its owner's path and its own name. Outside the
block nothing is registered, so a forward pays nothing for this. `export_graph` reads the tags
into each node's ``module`` (and labels parameters by name), and `write_html`'s page draws
each module as one box that opens on click.

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
    """``(module path, label)`` recorded for ``tensor``; ``("", "")`` when none was."""
    return _tags.get(tensor, ("", ""))


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

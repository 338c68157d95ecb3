"""Export the autograd graph below a Tensor as plain data: nodes with values and gradients, edges.

`export_graph(root)` walks ``root.parents`` iteratively (a deep chain cannot hit Python's recursion
limit) and returns a JSON-serialisable dict::

    {"nodes": [{"id", "label", "op", "shape", "dtype", "value", "grad", "requires_grad"}, ...],
     "edges": [[parent_id, child_id], ...], "root": root_id}

Nodes are listed parents first (a topological order); ``id`` is the position in that list.
``value`` and ``grad`` hold the numbers in full (nested lists) for tensors of at most
``max_full`` elements and statistics ``{"min", "max", "mean", "std", "rms"}`` beyond that;
non-finite numbers become the strings ``"nan"``, ``"inf"``, ``"-inf"`` (JSON has no such
numbers). ``grad`` is None where no gradient was computed (a constant, or no backward run yet).

Tensors do not record the name of the operation that made them; the op name is read from the
vector-Jacobian product the operation left on its output: ``Tensor.__mul__.<locals>.vjp`` ->
``*``, ``Tensor.exp.<locals>.<lambda>`` -> ``exp``, ``softmax.<locals>.vjp`` -> ``softmax``.
A leaf is ``"leaf"`` (it requires grad: a parameter or input) or ``"const"``.

>>> import numpy as np
>>> from glassllm import Tensor
>>> x = Tensor(np.array(2.0), requires_grad=True)
>>> y = (x * x).tanh()
>>> y.backward()
>>> graph = export_graph(y, names={"x": x})
>>> [(n["label"], n["op"]) for n in graph["nodes"]]
[('x', 'leaf'), ('', '*'), ('', 'tanh')]
>>> graph["edges"]
[[0, 1], [0, 1], [1, 2]]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from glassllm._text import finite_for_json
from glassllm.autograd import graph_consumed
from glassllm.tensor import Tensor

# Tensors with at most this many elements are shown in full; larger ones as statistics.
MAX_FULL = 16
# A graph larger than this is refused: a drawing of it would be unreadable and slow.
MAX_NODES = 5000

_SYMBOLS = {
    "__add__": "+",
    "__sub__": "-",
    "__mul__": "*",
    "__truediv__": "/",
    "__pow__": "**",
    "__matmul__": "@",
    "__neg__": "neg",
    "__getitem__": "[]",
    "_extremum": "max/min",
}


def op_name(tensor: Tensor) -> str:
    """The name of the operation that produced ``tensor`` (see the module docstring)."""
    backward = tensor._backward
    if backward is None:
        return "leaf" if tensor.requires_grad else "const"
    qualname = getattr(backward, "__qualname__", type(backward).__name__)
    owner = qualname.split(".<locals>.")[0]  # "Tensor.__mul__", "softmax"
    name = owner.rsplit(".", 1)[-1]
    return _SYMBOLS.get(name, name)


def export_graph(
    root: Tensor, names: Mapping[str, Tensor] | None = None, max_full: int = MAX_FULL
) -> dict[str, Any]:
    """Nodes and edges of the graph that produced ``root`` (see the module docstring).

    ``names`` labels chosen tensors (``{"x1": x1}``); others get an empty label. A tensor is one
    node however often it is used; an edge is listed once per use (``x * x`` has two edges).
    A graph that ``backward(retain_graph=False)`` has consumed is a ValueError.
    """
    if not isinstance(root, Tensor):
        raise TypeError(f"export_graph needs a Tensor, got {type(root).__name__}")
    labels = {id(t): name for name, t in (names or {}).items()}
    order = _parents_first(root)
    if any(t._backward is graph_consumed for t in order):
        raise ValueError(
            "export_graph: backward(retain_graph=False) has consumed this graph; export it "
            "before that backward, or keep it with retain_graph=True (the default)"
        )
    ids = {id(t): i for i, t in enumerate(order)}
    nodes = [
        {
            "id": i,
            "label": labels.get(id(t), ""),
            "op": op_name(t),
            "shape": list(t.shape),
            "dtype": str(t.dtype),
            "value": summarize(t.data, max_full),
            "grad": None if t.grad is None else summarize(t.grad, max_full),
            "requires_grad": t.requires_grad,
        }
        for i, t in enumerate(order)
    ]
    edges = [[ids[id(p)], ids[id(t)]] for t in order for p in t.parents]
    return {"nodes": nodes, "edges": edges, "root": ids[id(root)]}


def _parents_first(root: Tensor) -> list[Tensor]:
    """Every tensor reachable through ``parents`` (constants included), each after its parents."""
    order: list[Tensor] = []
    visited: set[int] = set()
    stack: list[tuple[Tensor, bool]] = [(root, False)]
    while stack:
        node, parents_done = stack.pop()
        if parents_done:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        if len(visited) > MAX_NODES:
            raise ValueError(
                f"the graph has more than {MAX_NODES} nodes; export a smaller expression"
            )
        stack.append((node, True))
        for parent in reversed(node.parents):  # first parent visited first
            if id(parent) not in visited:
                stack.append((parent, False))
    return order


def summarize(array: np.ndarray, max_full: int = MAX_FULL) -> Any:
    """``array`` as nested lists when small, else ``{"min", "max", "mean", "std", "rms"}``."""
    array = np.asarray(array)
    if array.size <= max_full:
        if np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_:
            return finite_for_json(array.astype(np.float64).tolist(), spelled=True)
        return array.tolist()
    values = array.astype(np.float64, copy=False)
    with np.errstate(invalid="ignore", over="ignore"):
        stats = {
            "min": float(np.min(values)),
            "max": float(np.max(values)),
            "mean": float(np.mean(values)),
            "std": float(np.std(values)),
            "rms": float(np.sqrt(np.mean(values * values))),
        }
    return finite_for_json(stats, spelled=True)

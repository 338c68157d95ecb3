"""Export the autograd graph below a Tensor as plain data: nodes with values and gradients, edges.

`export_graph(root)` walks ``root.parents`` iteratively (a deep chain cannot hit Python's recursion
limit) and returns a JSON-serialisable dict::

    {"nodes": [{"id", "label", "op", "module", "shape", "dtype", "value", "grad",
                "requires_grad"}, ...],
     "edges": [[parent_id, child_id], ...], "root": root_id}

Nodes are listed parents first (a topological order); ``id`` is the position in that list.
``value`` and ``grad`` hold the numbers in full (nested lists) for tensors of at most
``max_full`` elements and statistics ``{"min", "max", "mean", "std", "rms"}`` beyond that;
non-finite numbers become the strings ``"nan"``, ``"inf"``, ``"-inf"`` (JSON has no such
numbers). ``grad`` is None where no gradient was computed (a constant, or no backward run yet).

The op name is the one the operation gave its result (``Tensor.from_op(..., name="softmax")``,
stored as ``tensor.op``: ``*``, ``exp``, ``layer_norm``). An operation built without a name (a
user's own) is named from its vector-Jacobian product's ``__qualname__``: ``my_op.<locals>.vjp``
-> ``my_op``. A leaf is ``"leaf"`` (it requires grad: a parameter or input) or ``"const"``.

``module`` is the dotted path of the module whose forward produced the node (``blocks.0.attn``,
`glassllm.graph.modules`), ``""`` outside any; a parameter of the model is labelled by its name
(``weight``) unless ``names`` labels it.

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
from glassllm.autograd import graph_consumed, topological_order
from glassllm.graph.modules import module_tags
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
    if tensor.op is not None:
        return tensor.op
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
    modules = module_tags(order)
    if not any(path for (path, _), t in zip(modules, order, strict=True) if t._backward):
        # Not recorded (parameters keep the tags of an earlier recorded forward): no modules.
        modules = [("", "")] * len(order)
    if any(t._backward is graph_consumed for t in order):
        raise ValueError(
            "export_graph: backward(retain_graph=False) has consumed this graph; export it "
            "before that backward, or keep it with retain_graph=True (the default)"
        )
    ids = {id(t): i for i, t in enumerate(order)}
    nodes = [
        {
            "id": i,
            "label": labels.get(id(t), modules[i][1]),
            "op": op_name(t),
            "module": modules[i][0],
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
    return topological_order(
        root, only_requires_grad=False, first_parent_first=True, max_nodes=MAX_NODES
    )


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

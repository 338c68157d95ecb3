"""Gradient-mode switch and the reverse-mode traversal.

The engine does the bookkeeping; operations do the maths. An operation hands the
engine its ``backward``, the vector-Jacobian product (VJP) that returns one
gradient per parent (``Tensor.from_op``); the engine orders the graph, adds
contributions that arrive along shared paths, stores each intermediate's gradient
and accumulates into leaves.
Reverse mode as in Baydin et al., "Automatic differentiation in machine
learning: a survey", JMLR 18(153), 2018.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from glassllm import _heap

if TYPE_CHECKING:
    from glassllm.tensor import Tensor

# Module-global, not thread- or coroutine-local: a `no_grad` block in one thread
# switches tracking off for every thread of the process. Do not overlap training
# and inference in one process expecting the scopes to be isolated.
_grad_enabled = True


class _ModuleCalls(threading.local):
    """The `Module.__call__` running now, ``(module, the call around it)`` or None: set by
    ``Module.__call__``, read by each tracked result (``Tensor._module_call``), so a drawing of
    the graph can fold each module into one box (`glassllm.graph.modules`). Per thread, unlike
    ``_grad_enabled``: two threads' forwards interleaving would otherwise leave a stale call."""

    current: tuple[Any, Any] | None = None


module_calls = _ModuleCalls()


def is_grad_enabled() -> bool:
    """Whether operations currently record the graph."""
    return _grad_enabled


class no_grad:
    """Context manager (and decorator) that switches graph recording off.

    Results built inside keep neither parents nor backward functions and have
    ``requires_grad=False``. Existing tensors keep their ``requires_grad`` and
    ``grad``; a leaf created inside with ``requires_grad=True`` keeps it. On exit,
    normal or by exception, the previous mode comes back, so scopes nest.
    """

    def __init__(self) -> None:
        self._saved: list[bool] = []

    def __enter__(self) -> no_grad:
        global _grad_enabled
        self._saved.append(_grad_enabled)
        _grad_enabled = False
        return self

    def __exit__(self, *exc_info: Any) -> bool:
        global _grad_enabled
        _grad_enabled = self._saved.pop()
        return False

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with no_grad():
                return fn(*args, **kwargs)

        return wrapper


def topological_order(
    root: Tensor,
    *,
    only_requires_grad: bool = True,
    first_parent_first: bool = False,
    max_nodes: int | None = None,
) -> list[Tensor]:
    """The nodes below ``root``, each after all of its parents (iterative DFS).

    Iterative on purpose: a recursive sort hits Python's recursion limit on a
    chain of a few thousand operations. Parents are visited in their stored
    order, so the order is deterministic.

    The engine's backward walks only nodes that require grad, visiting a node's last parent
    first (the order its gradients have always been added in, so the bits stay); the graph
    export walks every node (constants included) with ``only_requires_grad=False`` and
    ``first_parent_first=True``, and refuses more than ``max_nodes`` with a ValueError.
    """
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
        if max_nodes is not None and len(visited) > max_nodes:
            raise ValueError(
                f"the graph has more than {max_nodes} nodes; export a smaller expression"
            )
        stack.append((node, True))
        parents = reversed(node.parents) if first_parent_first else node.parents
        for parent in parents:
            if (parent.requires_grad or not only_requires_grad) and id(parent) not in visited:
                stack.append((parent, False))
    return order


def run_backward(
    root: Tensor,
    seed: np.ndarray,
    retain_intermediate_grads: bool = True,
    retain_graph: bool = True,
) -> None:
    """Propagate ``seed`` (d loss / d root) through the graph below ``root``.

    Leaves (nodes without a backward function) accumulate into ``.grad``
    across calls; every intermediate's ``.grad`` is replaced by this
    traversal's value (``None`` where nothing reached it), or by ``None`` when
    ``retain_intermediate_grads`` is false: each intermediate gradient is then
    freed once its VJP has run, so the step's peak holds the activations and
    only the gradients still in flight, not every gradient at once. Contributions are
    added with out-of-place ``+`` because a VJP may return the very array it
    received (``add`` does), so two nodes can legitimately share one array.

    ``retain_graph=False`` consumes the graph as it goes, as PyTorch's backward does by
    default: once a node's VJP has run, the node drops its backward function (and with it the
    arrays that function saved) and its links to its parents, so an intermediate result that
    nothing but the graph held is freed as soon as it has been passed back. The peak then holds
    only the activations not yet passed back. A later backward that reaches a consumed node
    raises RuntimeError. (What the caller still holds, such as the logits, stays alive.)

    All-or-nothing: the gradients are computed first and written only once the
    whole traversal has succeeded, so a VJP that raises (or returns a gradient
    of the wrong shape) leaves every ``.grad`` as it was. With ``retain_graph=False`` the nodes
    passed before the failing one stay consumed; the failing node is left as it was.
    """
    order = topological_order(root)
    # why: the first training-sized graph switches glibc to keeping freed step buffers mapped, so
    # a plain loss.backward() loop does not page-fault them back every step (glassllm._heap).
    _heap.tune_allocator_for(order)
    pending: dict[int, np.ndarray] = {id(root): seed}
    reached: list[tuple[Tensor, np.ndarray | None]] = []
    while order:
        node = order.pop()  # popped, not iterated: a consumed node can be freed right away
        grad = pending.pop(id(node), None)
        is_leaf = node._backward is None
        if retain_intermediate_grads or is_leaf or node.grad is not None:
            reached.append((node, grad if retain_intermediate_grads or is_leaf else None))
        if grad is None or is_leaf:
            continue
        parents = node.parents
        arrivals = _checked(node, node._backward(grad))
        if not retain_graph:  # after the checks: a failing node keeps its graph and its name
            node._backward, node.parents = graph_consumed, ()
        for parent, contribution in zip(parents, arrivals, strict=True):
            if contribution is None:
                continue
            key = id(parent)
            previous = pending.get(key)
            pending[key] = contribution if previous is None else previous + contribution
        del parents, arrivals, grad  # before the next VJP allocates

    for node, grad in reached:
        if node._backward is not None:
            node.grad = grad
        elif grad is not None:
            # A leaf owns its gradient: copy, so later in-place edits (clipping,
            # an optimizer) cannot reach arrays that other nodes still hold.
            node.grad = (
                np.array(grad, dtype=_grad_dtype(node), copy=True)
                if node.grad is None
                else node.grad + grad
            )


def _checked(node: Tensor, contributions: tuple) -> list[np.ndarray | None]:
    """A VJP's gradients, one per parent, as arrays of the parent's shape and (for a float
    parent) dtype; None for a parent that gets none or does not require grad."""
    if len(contributions) != len(node.parents):
        raise ValueError(
            f"backward {_op_name(node)} of a node with {len(node.parents)} parents returned "
            f"{len(contributions)} gradients"
        )
    arrivals: list[np.ndarray | None] = []
    for parent, contribution in zip(node.parents, contributions, strict=True):
        if contribution is None or not parent.requires_grad:
            arrivals.append(None)
            continue
        contribution = np.asarray(contribution)
        if contribution.shape != parent.data.shape:
            raise ValueError(
                f"backward {_op_name(node)} returned a gradient of shape "
                f"{contribution.shape} for a parent of shape {parent.data.shape}"
            )
        if contribution.dtype != parent.data.dtype and _is_inexact(parent):
            contribution = contribution.astype(parent.data.dtype)
        arrivals.append(contribution)
    return arrivals


def graph_consumed(grad: np.ndarray) -> tuple:
    """The backward function of a node that ``backward(retain_graph=False)`` has passed."""
    raise RuntimeError(
        "backward reached a node whose graph an earlier backward(retain_graph=False) consumed; "
        "keep the graph with retain_graph=True (the default) to traverse it more than once"
    )


def _op_name(node: Tensor) -> str:
    """The op's name (``Tensor.from_op(..., name=)``), else its backward's qualified name."""
    if node.op is not None:
        return node.op
    return getattr(node._backward, "__qualname__", type(node._backward).__name__)


def _is_inexact(node: Tensor) -> bool:
    return np.issubdtype(node.data.dtype, np.inexact)


def _grad_dtype(node: Tensor) -> np.dtype | None:
    # Gradients take the data's dtype; integer leaves (accepted, but not a
    # differentiation target) keep whatever dtype their gradient arrived in.
    return node.data.dtype if _is_inexact(node) else None

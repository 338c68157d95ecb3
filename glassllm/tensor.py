"""The Tensor: an ndarray that remembers how it was made.

Each operation below computes its output and, right beside it, ``backward``: the
vector-Jacobian product that maps ``g = dL/d(output)`` to one gradient per input.
The engine (``glassllm.autograd``) orders the graph and adds the contributions up;
the fused functions live in ``glassllm.functional``.

Every operation, built in or your own, makes its result with
``Tensor.from_op(data, parents, backward)``. For ``y = sin(x)``, ``dL/dx = g cos(x)``:

>>> import numpy as np
>>> from glassllm import Tensor
>>> def sin(x: Tensor) -> Tensor:
...     def backward(g):                      # one entry per parent
...         return (g * np.cos(x.data),)
...     return Tensor.from_op(np.sin(x.data), (x,), backward)
>>> x = Tensor([0.0, np.pi], requires_grad=True)
>>> sin(x).sum().backward()
>>> x.grad
array([ 1., -1.])

``backward(g)`` returns a tuple with, for each parent, an ndarray of that parent's
shape (or ``None`` for no gradient); the engine accumulates, the op never touches
``.grad``. Capture arrays and parents in the closure, never the output Tensor: the
reference cycle would keep the graph alive until the garbage collector runs.
``unbroadcast`` undoes broadcasting; ``glassllm.gradcheck`` checks an operation
against finite differences.

Limitations, by design: no higher-order autograd (``backward`` builds no graph);
only the operations here and in ``glassllm.functional`` are tracked
(``np.sin(t.data)`` breaks the chain; ``np.sin(t)`` raises ``TypeError``, since a
Tensor opts out of NumPy's ufuncs); ``backward`` closures read the forward's arrays,
so finish ``backward`` before mutating ``.data``; integer data has no discrete
differentiation (train float32 or float64) and complex data no conjugation rules;
no comparisons or truth values (compare with NumPy on ``.data``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from glassllm import autograd
from glassllm._axes import Axis, expand_reduced, normalize_axes

Backward = Callable[[np.ndarray], Sequence[np.ndarray | None]]


class Tensor:
    """An n-dimensional array with reverse-mode automatic differentiation.

    ``Tensor(data, parents=(), backward=None, requires_grad=False)`` converts
    ``data`` with ``np.asarray`` (no dtype imposed, not always a copy). Ordinary
    use passes only ``data`` and ``requires_grad``; ``parents`` and ``backward``
    are how operations are built (see the module docstring and ``from_op``). Read
    values through ``.data``; ``float(t.data)`` for a scalar.

    The one tracking gate: a result given ``parents`` or ``backward`` keeps them only
    when ``requires_grad`` is true and not under ``no_grad``; otherwise it is a constant.
    A leaf keeps its flag even under ``no_grad``. ``backward`` is stored as ``_backward``
    (``backward()`` is the method that starts the traversal).
    """

    # _module_call: (module, outer call) whose forward made a tracked result (graph drawings)
    __slots__ = ("data", "grad", "requires_grad", "parents", "_backward", "op", "_module_call")
    __slots__ += ("__weakref__",)
    # NumPy defers to us: `ndarray + Tensor` calls Tensor.__radd__ and returns a Tensor.
    __array_ufunc__ = None

    def __init__(
        self,
        data: Any,
        parents: Sequence[Tensor] = (),
        backward: Backward | None = None,
        requires_grad: bool = False,
    ) -> None:
        if isinstance(data, Tensor):
            raise TypeError("Tensor(data) got a Tensor; pass its .data or use the Tensor itself")
        self.data: np.ndarray = np.asarray(data)
        self.grad: np.ndarray | None = None
        parents = tuple(parents)
        if parents or backward is not None:
            for parent in parents:
                if not isinstance(parent, Tensor):
                    raise TypeError(f"parents must be Tensors, got {type(parent).__name__}")
            if not (requires_grad and autograd._grad_enabled):
                parents, backward, requires_grad = (), None, False
            else:  # the module whose forward made it (graph drawings fold by it); unset on leaves
                self._module_call = autograd.module_calls.current
        self.parents: tuple[Tensor, ...] = parents
        self._backward: Backward | None = backward
        self.requires_grad: bool = bool(requires_grad)
        self.op: str | None = None  # the operation's name (`from_op`); None for a leaf

    @classmethod
    def from_op(
        cls, data: Any, parents: Sequence[Tensor], backward: Backward, name: str | None = None
    ) -> Tensor:
        """An operation's result: ``Tensor(data, parents, backward, requires_grad=r)`` with
        ``r = any(p.requires_grad for p in parents)``.

        ``name`` (``"layer_norm"``, ``"*"``) is kept as ``.op`` on a tracked result (see
        `named`); without it, the graph export and the engine's error messages read the name
        off ``backward``'s ``__qualname__``."""
        out = cls(data, parents, backward, any(p.requires_grad for p in parents))
        return out if name is None else out.named(name)

    def named(self, name: str) -> Tensor:
        """``self`` with ``.op = name`` when it records an operation (a constant keeps None).

        The built-in operations name their results so, ``Tensor.from_op(...).named("gelu")``,
        rather than through ``from_op``'s ``name``: code that wraps ``from_op`` with its
        three-argument signature (a test's spy, a user's tracer) keeps seeing every op."""
        if self._backward is not None:
            self.op = name
        return self

    # ----------------------------------------------------------- attributes
    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def size(self) -> int:
        return self.data.size

    def __len__(self) -> int:
        return len(self.data)

    def __bool__(self) -> bool:
        raise TypeError("a Tensor has no truth value; test its .data with NumPy (.data.all())")

    def __repr__(self) -> str:
        body = np.array2string(self.data, separator=", ", prefix="Tensor(")
        extras = [f"dtype={self.data.dtype}"]
        if self.requires_grad:
            extras.append("requires_grad=True")
        return f"Tensor({body}, {', '.join(extras)})"

    # ------------------------------------------------------------- backward
    def backward(
        self, grad: Any = None, retain_intermediate_grads: bool = True, retain_graph: bool = True
    ) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad``; ``grad`` is the seed dL/d(self)
        (the output's shape; ``None``: ones, the gradient of the sum). No-op without requires_grad.

        Training passes both flags False: ``retain_intermediate_grads=False`` frees each
        intermediate ``.grad`` once passed on, ``retain_graph=False`` what each op saved once its
        VJP has run (`autograd.run_backward`; a second backward then raises RuntimeError)."""
        if not self.requires_grad:
            return
        if grad is None:
            seed = np.ones_like(self.data)
        else:
            seed = np.asarray(grad.data if isinstance(grad, Tensor) else grad)
            if seed.shape != self.data.shape:
                raise ValueError(
                    f"backward: gradient shape {seed.shape} does not match output shape "
                    f"{self.data.shape}"
                )
            if np.issubdtype(self.data.dtype, np.inexact):
                seed = seed.astype(self.data.dtype, copy=False)
        autograd.run_backward(self, seed, retain_intermediate_grads, retain_graph)

    # ------------------------------------------------------------ arithmetic
    def _operand(self, other: Any) -> Tensor:
        """``other`` as a Tensor; a Python scalar takes this tensor's dtype rules."""
        if isinstance(other, Tensor):
            return other
        if isinstance(other, (bool, int, float, complex)):
            # NumPy 2 treats Python scalars as "weak": float32 + 2.0 stays float32.
            return Tensor(np.asarray(other, dtype=np.result_type(self.data, other)))
        return Tensor(other)

    def __add__(self, other: Any) -> Tensor:
        """d(a+b) = da + db; broadcast replicas are summed back by ``unbroadcast``."""
        a, b = self, self._operand(other)

        def backward(g: np.ndarray):
            return (
                unbroadcast(g, a.shape) if a.requires_grad else None,
                unbroadcast(g, b.shape) if b.requires_grad else None,
            )

        return Tensor.from_op(a.data + b.data, (a, b), backward).named("+")

    def __radd__(self, other: Any) -> Tensor:
        return self._operand(other) + self

    def __neg__(self) -> Tensor:
        """d(-a) = -da."""
        a = self
        return Tensor.from_op(-a.data, (a,), lambda g: (-g,)).named("neg")

    def __sub__(self, other: Any) -> Tensor:
        """d(a-b) = da - db."""
        a, b = self, self._operand(other)

        def backward(g: np.ndarray):
            return (
                unbroadcast(g, a.shape) if a.requires_grad else None,
                -unbroadcast(g, b.shape) if b.requires_grad else None,
            )

        return Tensor.from_op(a.data - b.data, (a, b), backward).named("-")

    def __rsub__(self, other: Any) -> Tensor:
        return self._operand(other) - self

    def __mul__(self, other: Any) -> Tensor:
        """d(ab) = b da + a db."""
        a, b = self, self._operand(other)

        def backward(g: np.ndarray):
            return (
                unbroadcast(g * b.data, a.shape) if a.requires_grad else None,
                unbroadcast(g * a.data, b.shape) if b.requires_grad else None,
            )

        return Tensor.from_op(a.data * b.data, (a, b), backward).named("*")

    def __rmul__(self, other: Any) -> Tensor:
        return self._operand(other) * self

    def __truediv__(self, other: Any) -> Tensor:
        """d(a/b) = da / b - (a/b) db / b."""
        a, b = self, self._operand(other)
        out = a.data / b.data

        def backward(g: np.ndarray):
            g_over_b = g / b.data
            return (
                unbroadcast(g_over_b, a.shape) if a.requires_grad else None,
                unbroadcast(-g_over_b * out, b.shape) if b.requires_grad else None,
            )

        return Tensor.from_op(out, (a, b), backward).named("/")

    def __rtruediv__(self, other: Any) -> Tensor:
        return self._operand(other) / self

    def __pow__(self, other: Any) -> Tensor:
        """d(a^b) = b a^(b-1) da + a^b log(a) db (the log only when b needs a gradient)."""
        a, b = self, self._operand(other)
        out = a.data**b.data

        def backward(g: np.ndarray):
            grad_a = grad_b = None
            # At a zero base the formulas give 0 * inf = nan where the function is
            # flat: a^0 in a, and 0^b in b for b >= 0. Take 0 there, as torch does.
            if a.requires_grad:
                with np.errstate(divide="ignore", invalid="ignore"):
                    local = b.data * a.data ** (b.data - 1)
                grad_a = unbroadcast(g * np.where(b.data == 0, 0.0, local), a.shape)
            if b.requires_grad:
                with np.errstate(divide="ignore", invalid="ignore"):
                    local = out * np.log(a.data)
                flat = (a.data == 0) & (b.data >= 0)
                grad_b = unbroadcast(g * np.where(flat, 0.0, local), b.shape)
            return grad_a, grad_b

        return Tensor.from_op(out, (a, b), backward).named("**")

    def __rpow__(self, other: Any) -> Tensor:
        return self._operand(other) ** self

    def __matmul__(self, other: Any) -> Tensor:
        """C = A @ B (NumPy semantics): dA = G Bᵀ, dB = Aᵀ G, summed over broadcast batch axes.

        A 1-D operand is promoted to a matrix (a row on the left, a column on the
        right) for the VJP and the added axis is dropped again afterwards.
        """
        a, b = self, self._operand(other)
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError("matmul: input operand does not have enough dimensions (0-d)")

        def backward(g: np.ndarray):
            a2 = a.data if a.ndim > 1 else a.data[None, :]
            b2 = b.data if b.ndim > 1 else b.data[:, None]
            g2 = g
            if a.ndim == 1:
                g2 = np.expand_dims(g2, -1 if b.ndim == 1 else -2)
            if b.ndim == 1:
                g2 = np.expand_dims(g2, -1)
            grad_a = grad_b = None
            if a.requires_grad:
                grad_a = unbroadcast(g2 @ np.swapaxes(b2, -1, -2), a2.shape).reshape(a.shape)
            if b.requires_grad:
                if b2.ndim == 2 and a2.ndim > 2:
                    # Fold the batch into rows: one big matmul instead of a
                    # batched one followed by a sum over the batch.
                    k, m = a2.shape[-1], g2.shape[-1]
                    grad_b = a2.reshape(-1, k).T @ g2.reshape(-1, m)
                else:
                    grad_b = unbroadcast(np.swapaxes(a2, -1, -2) @ g2, b2.shape)
                grad_b = grad_b.reshape(b.shape)
            return grad_a, grad_b

        return Tensor.from_op(a.data @ b.data, (a, b), backward).named("@")

    # ------------------------------------------------------------ reductions
    def sum(self, axis: Axis = None, keepdims: bool = False) -> Tensor:
        """Every summed entry receives the upstream gradient: dx = broadcast(g)."""
        a = self
        axes = normalize_axes(axis, a.ndim)

        def backward(g: np.ndarray):
            return (expand_reduced(g, axes, keepdims, a.shape),)

        return Tensor.from_op(a.data.sum(axis=axes, keepdims=keepdims), (a,), backward).named("sum")

    def mean(self, axis: Axis = None, keepdims: bool = False) -> Tensor:
        """mean = sum / n, so dx = broadcast(g) / n."""
        axes = normalize_axes(axis, self.ndim)
        count = int(np.prod([self.shape[i] for i in axes])) if axes else 1
        return self.sum(axis=axes, keepdims=keepdims) * (1.0 / count if count else float("nan"))

    def max(self, axis: Axis = None, keepdims: bool = False) -> Tensor:
        """The gradient goes to the maxima, split evenly between ties (as torch.amax)."""
        return self._extremum(np.max, axis, keepdims)

    def min(self, axis: Axis = None, keepdims: bool = False) -> Tensor:
        """The gradient goes to the minima, split evenly between ties (as torch.amin)."""
        return self._extremum(np.min, axis, keepdims)

    def _extremum(self, reduce: Callable, axis: Axis, keepdims: bool) -> Tensor:
        a = self
        axes = normalize_axes(axis, a.ndim)
        kept = reduce(a.data, axis=axes, keepdims=True)

        def backward(g: np.ndarray):
            # The gradient's dtype, not the data's: integer data still splits ties evenly.
            winners = (a.data == kept).astype(np.result_type(g.dtype, a.dtype, np.float16))
            winners /= winners.sum(axis=axes, keepdims=True)
            return (winners * expand_reduced(g, axes, keepdims, a.shape),)

        out = kept if keepdims else np.squeeze(kept, axis=axes)
        return Tensor.from_op(out, (a,), backward).named("max/min")

    def var(self, axis: Axis = None, keepdims: bool = False, ddof: int = 0) -> Tensor:
        """v = Σ(x - x̄)² / (n - ddof); dx = 2 (x - x̄) g / (n - ddof) (the x̄ term cancels).

        NumPy's convention: ``ddof=0`` (population variance) by default, unlike
        torch.var's unbiased default.
        """
        a = self
        axes = normalize_axes(axis, a.ndim)
        count = int(np.prod([a.shape[i] for i in axes])) if axes else 1
        # As NumPy: no degrees of freedom left (n - ddof <= 0, an empty axis) gives nan or
        # inf, forward and backward, rather than a ZeroDivisionError in the VJP.
        dof = max(count - ddof, 0)
        centered = a.data - a.data.mean(axis=axes, keepdims=True)
        out = (centered * centered).sum(axis=axes, keepdims=keepdims) / dof

        def backward(g: np.ndarray):
            upstream = expand_reduced(g, axes, keepdims, a.shape)
            return (centered * (2.0 / dof if dof else float("nan")) * upstream,)

        return Tensor.from_op(out, (a,), backward).named("var")

    # ------------------------------------------------------------ shape ops
    def reshape(self, *shape: int | Sequence[int]) -> Tensor:
        """Reshape (ints or one tuple, -1 allowed); the VJP reshapes back."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        a = self
        out = a.data.reshape(shape)
        return Tensor.from_op(out, (a,), lambda g: (g.reshape(a.shape),)).named("reshape")

    def transpose(self, *axes: int | Sequence[int]) -> Tensor:
        """Permute axes (none given: reverse them, as NumPy); the VJP applies the inverse."""
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        a = self
        perm = tuple(range(a.ndim))[::-1] if not axes else axes
        out = a.data.transpose(perm)  # NumPy validates the axes: an out-of-range one must not wrap
        inverse = tuple(np.argsort([ax % a.ndim for ax in perm]))
        return Tensor.from_op(out, (a,), lambda g: (g.transpose(inverse),)).named("transpose")

    def __getitem__(self, index: Any) -> Tensor:
        """Basic and advanced indexing. The VJP scatters g back; a repeated
        integer index receives the sum of its contributions (``np.add.at``)."""
        a = self
        index = _unwrap_index(index)

        def backward(g: np.ndarray):
            grad = np.zeros_like(a.data)
            if _is_basic_index(index):
                grad[index] = g  # basic indexing selects each element at most once
            else:
                np.add.at(grad, index, g)
            return (grad,)

        return Tensor.from_op(a.data[index], (a,), backward).named("[]")

    def __setitem__(self, index: Any, value: Any) -> None:
        raise TypeError(
            "Tensor does not support item assignment (it would corrupt the graph); "
            "build a new Tensor, e.g. with glassllm.functional.where"
        )

    # ------------------------------------------------------------ elementwise
    def exp(self) -> Tensor:
        """d exp(x) = exp(x) dx: the VJP reuses the output."""
        a, out = self, np.exp(self.data)
        return Tensor.from_op(out, (a,), lambda g: (g * out,)).named("exp")

    def log(self) -> Tensor:
        """d log(x) = dx / x."""
        a = self
        return Tensor.from_op(np.log(a.data), (a,), lambda g: (g / a.data,)).named("log")

    def sqrt(self) -> Tensor:
        """d sqrt(x) = dx / (2 sqrt(x)): the VJP reuses the output."""
        a, out = self, np.sqrt(self.data)
        return Tensor.from_op(out, (a,), lambda g: (g * 0.5 / out,)).named("sqrt")

    def tanh(self) -> Tensor:
        """d tanh(x) = (1 - tanh²(x)) dx."""
        a, out = self, np.tanh(self.data)
        return Tensor.from_op(out, (a,), lambda g: (g * (1.0 - out * out),)).named("tanh")

    def sigmoid(self) -> Tensor:
        """σ(x) = 1/(1 + e^-x) = e^x/(1 + e^x); dσ = σ(1 - σ) dx.

        With ``e = exp(-|x|) <= 1`` (no overflow): ``1/(1 + e)`` for x >= 0, ``e/(1 + e)``
        for x < 0. Not ``(1 + tanh(x/2))/2``, which cancels for x << 0 (float32 loses
        2e-4 relative at x = -10 and gives 0 at x = -20).
        """
        a = self
        with np.errstate(under="ignore"):  # e^-|x| -> 0 is the right limit
            e = np.exp(-np.abs(a.data))
            out = np.where(a.data >= 0, 1.0, e)
            out /= 1.0 + e

        def backward(g: np.ndarray):
            with np.errstate(under="ignore"):
                return (g * out * (1.0 - out),)

        return Tensor.from_op(out, (a,), backward).named("sigmoid")

    def relu(self) -> Tensor:
        """relu(x) = max(x, 0); dL/dx = g [y > 0] (0 at x = 0, as torch; NaN propagates).

        ``np.maximum``, not ``x * [x > 0]`` (``-inf * 0`` is nan); the mask is rebuilt from y."""
        a, out = self, np.maximum(self.data, 0)
        return Tensor.from_op(out, (a,), lambda g: (np.multiply(g, out > 0),)).named("relu")

    def abs(self) -> Tensor:
        """d|x| = sign(x) dx, with sign(0) = 0 (as torch)."""
        a = self
        return Tensor.from_op(np.abs(a.data), (a,), lambda g: (g * np.sign(a.data),)).named("abs")


def as_tensor(x: Any, dtype: Any = None) -> Tensor:
    """A Tensor passes through; anything else becomes a constant Tensor (of ``dtype`` if given)."""
    if isinstance(x, Tensor):
        return x
    return Tensor(np.asarray(x, dtype=dtype))


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``grad`` back to ``shape`` over the axes broadcasting added or stretched: forward
    broadcasting replicates an operand, so its VJP adds the replicas' gradients up."""
    if grad.shape == shape:
        return grad
    leading = grad.ndim - len(shape)
    if leading > 0:
        grad = grad.sum(axis=tuple(range(leading)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if stretched:
        grad = grad.sum(axis=stretched, keepdims=True)
    return grad.reshape(shape)


def _unwrap_index(index: Any) -> Any:
    if isinstance(index, Tensor):
        return index.data
    if isinstance(index, tuple):
        return tuple(i.data if isinstance(i, Tensor) else i for i in index)
    return index


def _is_basic_index(index: Any) -> bool:
    """Ints, slices, None and Ellipsis only; or a single boolean mask (no repeats either)."""
    parts = index if isinstance(index, tuple) else (index,)
    if all(p is None or p is Ellipsis or isinstance(p, (int, np.integer, slice)) for p in parts):
        return True
    return not isinstance(index, tuple) and isinstance(index, np.ndarray) and index.dtype == bool

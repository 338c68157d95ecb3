"""Every Tensor operator and method, checked against two oracles.

One catalogue (``CASES``) lists each operation with the shapes it is tried on
(broadcasting pairs, 0-d tensors, size-1 axes) and the input domain it needs
(positive for ``log``, away from zero for ``abs``, distinct values for ``max``).
Each case is then checked three ways:

* analytic gradient against central finite differences in float64
  (``glassllm.gradcheck``; no PyTorch needed);
* float32 stays float32 in the output and in every gradient;
* value and vector-Jacobian product against PyTorch, in float32 (about 1e-5
  relative) and float64 (about 1e-10), skipped when torch is not installed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from glassllm import Tensor, gradcheck

# Constant ndarray operands; each case casts them to the input dtype, because a
# float64 array meeting a float32 Tensor upcasts by NumPy's own rules.
ROW3 = np.array([0.7, -1.3, 2.1])
GRID23 = np.array([[0.9, -1.1, 1.6], [-0.6, 1.4, -2.2]])
POS3 = np.array([0.8, 1.7, 1.2])
POS23 = np.array([[1.5, 0.6, 1.1], [0.9, 1.3, 0.7]])
MAT34 = np.array([[0.3, -0.5, 1.2, 0.4], [-0.8, 0.1, 0.6, -1.0], [1.1, 0.9, -0.2, 0.5]])


@dataclass
class Case:
    """One operation on one combination of input shapes.

    ``fn`` takes glassllm Tensors; ``torch_fn(torch, *tensors)`` is the same
    computation in PyTorch, or None where PyTorch has no direct equivalent.
    ``domains`` names the input distribution per input (see ``make_input``).
    """

    id: str
    fn: Callable[..., Any]
    torch_fn: Callable[..., Any] | None
    shapes: tuple[tuple[int, ...], ...]
    domains: tuple[str, ...] = field(default=())

    def domain(self, i: int) -> str:
        return self.domains[i] if i < len(self.domains) else "real"


def make_input(shape: tuple[int, ...], domain: str, rng: np.random.Generator) -> np.ndarray:
    """Float64 test data; ``domain`` keeps it where the operation is smooth."""
    if domain == "real":
        return rng.standard_normal(shape)
    if domain == "pos":  # log, sqrt, base of a real power
        return rng.uniform(0.5, 2.0, shape)
    if domain == "nonzero":  # abs, relu, denominators: no kink or pole nearby
        return rng.choice([-1.0, 1.0], shape) * rng.uniform(0.3, 2.0, shape)
    if domain == "distinct":  # max, min: no tie within a finite-difference step
        size = int(np.prod(shape, dtype=int))
        values = (rng.permutation(size) - size / 2) * 0.25 + rng.uniform(-0.05, 0.05, size)
        return values.reshape(shape)
    raise ValueError(domain)


def c(array: np.ndarray, like: Any) -> np.ndarray:
    """A constant cast to the dtype of ``like`` (a glassllm or torch tensor)."""
    dtype = like.dtype if isinstance(like, Tensor) else str(like.dtype).replace("torch.", "")
    return array.astype(dtype)


def tc(torch: Any, array: np.ndarray, like: Any) -> Any:
    return torch.as_tensor(c(array, like))


# --- binary operators, Tensor op Tensor, on broadcasting shapes ---------------
BROADCAST_PAIRS = [
    ((2, 3), (2, 3)),
    ((2, 3), (3,)),
    ((4, 1, 3), (2, 1)),
    ((), (2, 3)),
    ((2, 3), ()),
    ((1,), (3, 1)),
    ((1, 1), ()),
    ((), ()),
]

BINARY = {
    "add": (lambda a, b: a + b, ("real", "real")),
    "sub": (lambda a, b: a - b, ("real", "real")),
    "mul": (lambda a, b: a * b, ("real", "real")),
    "div": (lambda a, b: a / b, ("real", "nonzero")),
    "pow": (lambda a, b: a**b, ("pos", "real")),
}

CASES: list[Case] = []
for name, (op, domains) in BINARY.items():
    for sa, sb in BROADCAST_PAIRS:
        CASES.append(
            Case(f"{name}-{sa}-{sb}", op, lambda t, a, b, op=op: op(a, b), (sa, sb), domains)
        )

# --- Python scalars and ndarrays on either side (reflected forms) -------------
SCALAR_AND_ARRAY = [
    ("t+2.5", lambda a: a + 2.5, None, "real"),
    ("2.5+t", lambda a: 2.5 + a, None, "real"),
    ("t-2.5", lambda a: a - 2.5, None, "real"),
    ("2.5-t", lambda a: 2.5 - a, None, "real"),
    ("t*2.5", lambda a: a * 2.5, None, "real"),
    ("2.5*t", lambda a: 2.5 * a, None, "real"),
    ("3*t", lambda a: 3 * a, None, "real"),
    ("t/2.5", lambda a: a / 2.5, None, "real"),
    ("2.5/t", lambda a: 2.5 / a, None, "nonzero"),
    ("t**3", lambda a: a**3, None, "real"),
    ("t**2", lambda a: a**2, None, "real"),
    ("t**2.5", lambda a: a**2.5, None, "pos"),
    ("t**-1.5", lambda a: a**-1.5, None, "pos"),
    ("t**0.5", lambda a: a**0.5, None, "pos"),
    ("2.5**t", lambda a: 2.5**a, None, "real"),
    ("2**t", lambda a: 2**a, None, "real"),
    ("-t", lambda a: -a, None, "real"),
]
for label, op, _, domain in SCALAR_AND_ARRAY:
    for shape in [(2, 3), (), (1,)]:
        CASES.append(Case(f"{label}-{shape}", op, lambda t, a, op=op: op(a), (shape,), (domain,)))

ARRAY_OPERAND = [
    # (label, glassllm fn, torch fn, tensor shape, tensor domain)
    ("arr+t", lambda a: c(ROW3, a) + a, lambda t, a: tc(t, ROW3, a) + a, (2, 3), "real"),
    ("arr-t", lambda a: c(GRID23, a) - a, lambda t, a: tc(t, GRID23, a) - a, (3,), "real"),
    ("arr*t", lambda a: c(GRID23, a) * a, lambda t, a: tc(t, GRID23, a) * a, (), "real"),
    ("arr/t", lambda a: c(GRID23, a) / a, lambda t, a: tc(t, GRID23, a) / a, (1, 3), "nonzero"),
    ("arr**t", lambda a: c(POS23, a) ** a, lambda t, a: tc(t, POS23, a) ** a, (2, 1), "real"),
    ("t+arr", lambda a: a + c(GRID23, a), lambda t, a: a + tc(t, GRID23, a), (3,), "real"),
    ("t-arr", lambda a: a - c(ROW3, a), lambda t, a: a - tc(t, ROW3, a), (2, 3), "real"),
    ("t*arr", lambda a: a * c(ROW3, a), lambda t, a: a * tc(t, ROW3, a), (2, 1), "real"),
    ("t/arr", lambda a: a / c(POS3, a), lambda t, a: a / tc(t, POS3, a), (), "real"),
    ("t**arr", lambda a: a ** c(GRID23, a), lambda t, a: a ** tc(t, GRID23, a), (3,), "pos"),
    ("t@arr", lambda a: a @ c(MAT34, a), lambda t, a: a @ tc(t, MAT34, a), (2, 3), "real"),
]
for label, op, torch_op, shape, domain in ARRAY_OPERAND:
    CASES.append(Case(f"{label}-{shape}", op, torch_op, (shape,), (domain,)))

# --- elementwise methods -------------------------------------------------------
UNARY = {
    "exp": ("real", lambda t, a: a.exp()),
    "log": ("pos", lambda t, a: a.log()),
    "sqrt": ("pos", lambda t, a: a.sqrt()),
    "tanh": ("real", lambda t, a: a.tanh()),
    "sigmoid": ("real", lambda t, a: a.sigmoid()),
    "relu": ("nonzero", lambda t, a: a.relu()),
    "abs": ("nonzero", lambda t, a: a.abs()),
}
for name, (domain, torch_op) in UNARY.items():
    for shape in [(), (1,), (2, 3), (2, 1, 3)]:
        CASES.append(
            Case(
                f"{name}-{shape}",
                lambda a, name=name: getattr(a, name)(),
                torch_op,
                (shape,),
                (domain,),
            )
        )

# --- matmul: 1-D, 2-D, batched with broadcast batch dimensions ----------------
MATMUL_SHAPES = [
    ((3,), (3,)),
    ((2, 3), (3,)),
    ((3,), (3, 4)),
    ((2, 3), (3, 4)),
    ((1, 3), (3, 1)),
    ((5, 2, 3), (3, 4)),
    ((3,), (2, 3, 4)),
    ((2, 3), (5, 3, 4)),
    ((2, 1, 2, 3), (3, 3, 4)),
    ((4, 2, 3), (1, 3, 2)),
]
for sa, sb in MATMUL_SHAPES:
    CASES.append(Case(f"matmul-{sa}-{sb}", lambda a, b: a @ b, lambda t, a, b: a @ b, (sa, sb)))


# --- reductions ----------------------------------------------------------------
def torch_reduce(torch: Any, name: str, a: Any, axis: Any, keepdims: bool) -> Any:
    if axis is None:
        axis = tuple(range(a.dim()))
    if a.dim() == 0:
        out = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax, "min": torch.amin}.get(name)
        return a * 0.0 if name == "var" else out(a)
    dims = axis if isinstance(axis, tuple) else (axis,)
    if name == "var":
        return torch.var(a, dim=dims, correction=0, keepdim=keepdims)
    fn = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax, "min": torch.amin}[name]
    return fn(a, dim=dims, keepdim=keepdims)


REDUCTION_AXES = [None, 0, 1, -1, (0, 2), (-1, 0), (0, 1, 2)]
for name in ["sum", "mean", "max", "min", "var"]:
    domain = "distinct" if name in ("max", "min") else "real"
    for axis in REDUCTION_AXES:
        for keepdims in (False, True):
            CASES.append(
                Case(
                    f"{name}-axis={axis}-keepdims={keepdims}",
                    lambda a, name=name, axis=axis, keepdims=keepdims: getattr(a, name)(
                        axis=axis, keepdims=keepdims
                    ),
                    lambda t, a, name=name, axis=axis, keepdims=keepdims: torch_reduce(
                        t, name, a, axis, keepdims
                    ),
                    ((2, 3, 4),),
                    (domain,),
                )
            )
    # 0-d input, size-1 axes, and the positional-axis / default forms.
    CASES.append(
        Case(
            f"{name}-0d",
            lambda a, name=name: getattr(a, name)(),
            lambda t, a, name=name: torch_reduce(t, name, a, None, False),
            ((),),
            (domain,),
        )
    )
    CASES.append(
        Case(
            f"{name}-size1-axis0",
            lambda a, name=name: getattr(a, name)(0),
            lambda t, a, name=name: torch_reduce(t, name, a, 0, False),
            ((1, 3),),
            (domain,),
        )
    )
    CASES.append(
        Case(
            f"{name}-size1-axis1-keepdims",
            lambda a, name=name: getattr(a, name)(axis=1, keepdims=True),
            lambda t, a, name=name: torch_reduce(t, name, a, 1, True),
            ((3, 1),),
            (domain,),
        )
    )
CASES.append(Case("sum-axis=()", lambda a: a.sum(axis=()), None, ((2, 3),)))

# --- reshape and transpose -------------------------------------------------------
SHAPE_OPS = [
    ("reshape(6)", lambda a: a.reshape(6), lambda t, a: a.reshape(6), (2, 3)),
    ("reshape((3,2))", lambda a: a.reshape((3, 2)), lambda t, a: a.reshape((3, 2)), (2, 3)),
    ("reshape(3,-1)", lambda a: a.reshape(3, -1), lambda t, a: a.reshape(3, -1), (2, 3)),
    ("reshape(-1)", lambda a: a.reshape(-1), lambda t, a: a.reshape(-1), (2, 3, 4)),
    ("reshape(4,1,6)", lambda a: a.reshape(4, 1, 6), lambda t, a: a.reshape(4, 1, 6), (2, 3, 4)),
    ("0d.reshape(1,1)", lambda a: a.reshape(1, 1), lambda t, a: a.reshape(1, 1), ()),
    ("reshape(())", lambda a: a.reshape(()), lambda t, a: a.reshape(()), (1, 1)),
    ("transpose()", lambda a: a.transpose(), lambda t, a: a.permute(1, 0), (2, 3)),
    ("transpose()-3d", lambda a: a.transpose(), lambda t, a: a.permute(2, 1, 0), (2, 3, 4)),
    (
        "transpose(1,0,2)",
        lambda a: a.transpose(1, 0, 2),
        lambda t, a: a.permute(1, 0, 2),
        (2, 3, 4),
    ),
    (
        "transpose((2,0,1))",
        lambda a: a.transpose((2, 0, 1)),
        lambda t, a: a.permute(2, 0, 1),
        (2, 3, 4),
    ),
    (
        "transpose(-1,0,1)",
        lambda a: a.transpose(-1, 0, 1),
        lambda t, a: a.permute(-1, 0, 1),
        (2, 3, 4),
    ),
    ("transpose()-1d", lambda a: a.transpose(), lambda t, a: a, (3,)),
    ("transpose()-0d", lambda a: a.transpose(), lambda t, a: a, ()),
]
for label, op, torch_op, shape in SHAPE_OPS:
    CASES.append(Case(f"{label}-{shape}", op, torch_op, (shape,)))

# --- indexing: basic, advanced, repeated indices, boolean masks ----------------
MASK34 = np.array(
    [[True, False, True, True], [False, False, True, False], [True, True, False, True]]
)
ROWS3 = np.array([True, False, True])
INDEXING = [
    ("[1]", lambda a: a[1], lambda t, a: a[1], (3, 4)),
    ("[-1]", lambda a: a[-1], lambda t, a: a[-1], (3, 4)),
    ("[1,2]", lambda a: a[1, 2], lambda t, a: a[1, 2], (3, 4)),
    ("[1:3]", lambda a: a[1:3], lambda t, a: a[1:3], (3, 4)),
    ("[::2]", lambda a: a[::2], lambda t, a: a[::2], (3, 4)),
    ("[::-1]", lambda a: a[::-1], lambda t, a: a.flip(0), (3, 4)),
    ("[None]", lambda a: a[None], lambda t, a: a[None], (3, 4)),
    ("[...,1]", lambda a: a[..., 1], lambda t, a: a[..., 1], (3, 4)),
    ("[:,None,1:]", lambda a: a[:, None, 1:], lambda t, a: a[:, None, 1:], (3, 4)),
    ("[0,...,None]", lambda a: a[0, ..., None], lambda t, a: a[0, ..., None], (2, 3, 4)),
    (
        "[int array, repeats]",
        lambda a: a[np.array([0, 2, 0, 0])],
        lambda t, a: a[t.as_tensor(np.array([0, 2, 0, 0]))],
        (3, 4),
    ),
    (
        "[2-d int array]",
        lambda a: a[np.array([[0, 1], [1, 1]])],
        lambda t, a: a[t.as_tensor(np.array([[0, 1], [1, 1]]))],
        (3, 4),
    ),
    ("[list]", lambda a: a[[0, 0, 1]], lambda t, a: a[[0, 0, 1]], (3, 4)),
    (
        "[arr,arr]",
        lambda a: a[np.array([0, 1, 0]), np.array([1, 1, 1])],
        lambda t, a: a[t.as_tensor(np.array([0, 1, 0])), t.as_tensor(np.array([1, 1, 1]))],
        (3, 4),
    ),
    (
        "[1,arr]",
        lambda a: a[1, np.array([0, 0, 2])],
        lambda t, a: a[1, t.as_tensor(np.array([0, 0, 2]))],
        (3, 4),
    ),
    (
        "[:,arr]",
        lambda a: a[:, np.array([3, 3])],
        lambda t, a: a[:, t.as_tensor(np.array([3, 3]))],
        (3, 4),
    ),
    ("[bool mask]", lambda a: a[MASK34], lambda t, a: a[t.as_tensor(MASK34)], (3, 4)),
    ("[bool rows]", lambda a: a[ROWS3], lambda t, a: a[t.as_tensor(ROWS3)], (3, 4)),
    ("0d[()]", lambda a: a[()], lambda t, a: a[()], ()),
    ("0d[None]", lambda a: a[None], lambda t, a: a[None], ()),
    ("0d[...]", lambda a: a[...], lambda t, a: a[...], ()),
]
for label, op, torch_op, shape in INDEXING:
    CASES.append(Case(f"index{label}-{shape}", op, torch_op, (shape,)))

# --- a few compositions (shared inputs, chained broadcasting) -------------------
CASES += [
    Case(
        "mlp",
        lambda x, w, b: ((x @ w + b).tanh() * x.sum(axis=-1, keepdims=True)).mean(),
        lambda t, x, w, b: ((x @ w + b).tanh() * x.sum(dim=-1, keepdim=True)).mean(),
        ((2, 3), (3, 3), (3,)),
    ),
    Case(
        "normalise",
        lambda x: (
            (x - x.mean(axis=-1, keepdims=True)) / (x.var(axis=-1, keepdims=True) + 1e-5).sqrt()
        ),
        lambda t, x: (
            (x - x.mean(dim=-1, keepdim=True))
            / (t.var(x, dim=-1, correction=0, keepdim=True) + 1e-5).sqrt()
        ),
        ((2, 4),),
    ),
    Case(
        "softmax-by-hand",
        lambda x: (
            (x - x.max(axis=-1, keepdims=True)).exp()
            / (x - x.max(axis=-1, keepdims=True)).exp().sum(axis=-1, keepdims=True)
        ),
        lambda t, x: t.softmax(x, dim=-1),
        ((3, 4),),
        ("distinct",),
    ),
    Case(
        "reuse",
        lambda x: x * x.sigmoid() + x.abs().sqrt() * x[0],
        lambda t, x: x * x.sigmoid() + x.abs().sqrt() * x[0],
        ((3,),),
        ("nonzero",),
    ),
]

IDS = [case.id for case in CASES]
TORCH_CASES = [case for case in CASES if case.torch_fn is not None]
assert len(set(IDS)) == len(IDS), "case ids must be unique"


def inputs_for(case: Case, dtype: type, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        make_input(shape, case.domain(i), rng).astype(dtype) for i, shape in enumerate(case.shapes)
    ]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gradient_matches_finite_differences(case: Case) -> None:
    inputs = [Tensor(x, requires_grad=True) for x in inputs_for(case, np.float64)]
    assert gradcheck(case.fn, inputs) is True


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_value_matches_numpy_float64(case: Case) -> None:
    """The forward is the NumPy expression on ``.data`` (the ops add no maths of their own)."""
    arrays = inputs_for(case, np.float64)
    out = case.fn(*[Tensor(x) for x in arrays])
    assert isinstance(out, Tensor)
    expected = case.fn(*[_Plain(x) for x in arrays])
    np.testing.assert_allclose(out.data, np.asarray(expected), rtol=1e-12, atol=1e-14)
    assert out.data.shape == np.shape(expected)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_float32_stays_float32(case: Case) -> None:
    inputs = [Tensor(x, requires_grad=True) for x in inputs_for(case, np.float32)]
    out = case.fn(*inputs)
    assert out.dtype == np.float32, f"forward made {out.dtype}"
    assert out.requires_grad
    out.backward()
    for i, x in enumerate(inputs):
        assert x.grad is not None, f"input {i} got no gradient"
        assert x.grad.dtype == np.float32, f"gradient of input {i} is {x.grad.dtype}"
        assert x.grad.shape == x.shape


@pytest.mark.parametrize(
    "dtype,rtol,atol",
    [(np.float32, 1e-5, 1e-6), (np.float64, 1e-10, 1e-12)],
    ids=["float32", "float64"],
)
@pytest.mark.parametrize("case", TORCH_CASES, ids=[case.id for case in TORCH_CASES])
def test_value_and_vjp_match_torch(
    case: Case, dtype: type, rtol: float, atol: float, torch: Any
) -> None:
    arrays = inputs_for(case, dtype)
    ours = [Tensor(x.copy(), requires_grad=True) for x in arrays]
    theirs = [torch.tensor(x, requires_grad=True) for x in arrays]
    out = case.fn(*ours)
    out_t = case.torch_fn(torch, *theirs)
    assert out.shape == tuple(out_t.shape)
    np.testing.assert_allclose(out.data, out_t.detach().numpy(), rtol=rtol, atol=atol)
    assert out.dtype == dtype

    upstream = np.random.default_rng(1).standard_normal(out.shape).astype(dtype)
    out.backward(upstream)
    out_t.backward(torch.tensor(upstream))
    for i, (x, x_t) in enumerate(zip(ours, theirs, strict=True)):
        assert x.grad.dtype == dtype, f"input {i}"
        np.testing.assert_allclose(
            x.grad, x_t.grad.numpy(), rtol=rtol, atol=atol, err_msg=f"input {i}"
        )


class _Plain:
    """A bare ndarray wrapper with the Tensor method names, for the NumPy reference values."""

    __array_ufunc__ = None

    def __init__(self, data: Any) -> None:
        self.data = np.asarray(data)

    @staticmethod
    def _unwrap(other: Any) -> Any:
        return other.data if isinstance(other, _Plain) else other

    def _bin(fn: Callable[[Any, Any], Any], reflected: bool = False) -> Callable:  # noqa: N805
        def method(self: _Plain, other: Any) -> _Plain:
            o = _Plain._unwrap(other)
            return _Plain(fn(o, self.data) if reflected else fn(self.data, o))

        return method

    __add__, __radd__ = _bin(np.add), _bin(np.add, True)
    __sub__, __rsub__ = _bin(np.subtract), _bin(np.subtract, True)
    __mul__, __rmul__ = _bin(np.multiply), _bin(np.multiply, True)
    __truediv__, __rtruediv__ = _bin(np.divide), _bin(np.divide, True)
    __pow__, __rpow__ = _bin(np.power), _bin(np.power, True)
    __matmul__ = _bin(np.matmul)

    def __neg__(self) -> _Plain:
        return _Plain(-self.data)

    def __getitem__(self, index: Any) -> _Plain:
        return _Plain(self.data[index])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.data

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    def reshape(self, *shape: Any) -> _Plain:
        return _Plain(self.data.reshape(*shape))

    def transpose(self, *axes: Any) -> _Plain:
        return _Plain(self.data.transpose(*axes))

    def exp(self) -> _Plain:
        return _Plain(np.exp(self.data))

    def log(self) -> _Plain:
        return _Plain(np.log(self.data))

    def sqrt(self) -> _Plain:
        return _Plain(np.sqrt(self.data))

    def tanh(self) -> _Plain:
        return _Plain(np.tanh(self.data))

    def sigmoid(self) -> _Plain:
        return _Plain(1.0 / (1.0 + np.exp(-self.data)))

    def relu(self) -> _Plain:
        return _Plain(np.maximum(self.data, 0.0))

    def abs(self) -> _Plain:
        return _Plain(np.abs(self.data))

    def sum(self, axis: Any = None, keepdims: bool = False) -> _Plain:
        return _Plain(np.sum(self.data, axis=axis, keepdims=keepdims))

    def mean(self, axis: Any = None, keepdims: bool = False) -> _Plain:
        return _Plain(np.mean(self.data, axis=axis, keepdims=keepdims))

    def max(self, axis: Any = None, keepdims: bool = False) -> _Plain:
        return _Plain(np.max(self.data, axis=axis, keepdims=keepdims))

    def min(self, axis: Any = None, keepdims: bool = False) -> _Plain:
        return _Plain(np.min(self.data, axis=axis, keepdims=keepdims))

    def var(self, axis: Any = None, keepdims: bool = False) -> _Plain:
        return _Plain(np.var(self.data, axis=axis, keepdims=keepdims))

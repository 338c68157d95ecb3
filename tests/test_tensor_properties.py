"""Shape rules over random shapes (hypothesis): broadcasting gradients and
reductions follow NumPy, whatever the shapes.

The expected gradients are computed independently of ``unbroadcast``: by
walking every output position and adding its contribution to the operand
entry it was replicated from.
"""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, mutually_broadcastable_shapes

from glassllm import Tensor

SETTINGS = settings(max_examples=60, deadline=None)


def source_index(out_index: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    """The entry of an operand of ``shape`` that broadcasting copied to ``out_index``."""
    tail = out_index[len(out_index) - len(shape) :] if shape else ()
    return tuple(0 if n == 1 else i for i, n in zip(tail, shape, strict=True))


def replica_sum(values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Add every replica's value back onto the entry it came from."""
    total = np.zeros(shape)
    for out_index in itertools.product(*(range(n) for n in values.shape)):
        total[source_index(out_index, shape)] += values[out_index]
    return total


BINARY = {
    "add": (lambda a, b: a + b, lambda g, a, b: (g, g)),
    "sub": (lambda a, b: a - b, lambda g, a, b: (g, -g)),
    "mul": (lambda a, b: a * b, lambda g, a, b: (g * b, g * a)),
    "div": (lambda a, b: a / b, lambda g, a, b: (g / b, -g * a / b**2)),
}


@SETTINGS
@given(
    shapes=mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=3),
    op=st.sampled_from(sorted(BINARY)),
    seed=st.integers(0, 2**16),
)
def test_broadcast_gradient_is_the_sum_over_replicas(shapes, op, seed):
    (shape_a, shape_b), out_shape = shapes.input_shapes, shapes.result_shape
    rng = np.random.default_rng(seed)
    a_data = rng.standard_normal(shape_a)
    b_data = rng.uniform(0.5, 2.0, shape_b)
    a, b = Tensor(a_data, requires_grad=True), Tensor(b_data, requires_grad=True)
    forward, local = BINARY[op]
    out = forward(a, b)
    assert out.shape == out_shape
    upstream = rng.standard_normal(out_shape)
    out.backward(upstream)

    a_full, b_full = np.broadcast_to(a_data, out_shape), np.broadcast_to(b_data, out_shape)
    per_replica_a, per_replica_b = local(upstream, a_full, b_full)
    assert a.grad.shape == shape_a and b.grad.shape == shape_b
    np.testing.assert_allclose(
        a.grad,
        replica_sum(np.broadcast_to(per_replica_a, out_shape), shape_a),
        rtol=1e-12,
        atol=1e-12,
    )
    np.testing.assert_allclose(
        b.grad,
        replica_sum(np.broadcast_to(per_replica_b, out_shape), shape_b),
        rtol=1e-12,
        atol=1e-12,
    )


@SETTINGS
@given(shapes=mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=3))
def test_broadcast_gradient_keeps_float32(shapes):
    shape_a, shape_b = shapes.input_shapes
    a = Tensor(np.ones(shape_a, dtype=np.float32), requires_grad=True)
    b = Tensor(np.full(shape_b, 2.0, dtype=np.float32), requires_grad=True)
    (a * b + a / b - 1.5).backward()
    assert a.grad.dtype == np.float32 and b.grad.dtype == np.float32
    assert a.grad.shape == shape_a and b.grad.shape == shape_b


@st.composite
def shape_and_axis(draw):
    shape = draw(array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=3))
    ndim = len(shape)
    if ndim == 0:
        axis = None
    else:
        kind = draw(st.sampled_from(["none", "int", "tuple"]))
        if kind == "none":
            axis = None
        elif kind == "int":
            axis = draw(st.integers(-ndim, ndim - 1))
        else:
            chosen = draw(st.lists(st.integers(0, ndim - 1), unique=True, max_size=ndim))
            # Mix in negative spellings of the same axes.
            axis = tuple(ax - ndim if draw(st.booleans()) else ax for ax in chosen)
    return shape, axis, draw(st.booleans())


def _reduced_axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else axis
    return tuple(sorted(ax % ndim for ax in axes))


@SETTINGS
@given(
    spec=shape_and_axis(),
    name=st.sampled_from(["sum", "mean", "max", "min", "var"]),
    seed=st.integers(0, 2**16),
)
def test_reduction_shapes_values_and_gradients_follow_numpy(spec, name, seed):
    shape, axis, keepdims = spec
    rng = np.random.default_rng(seed)
    data = rng.permutation(int(np.prod(shape))).reshape(shape) + rng.uniform(-0.1, 0.1, shape)
    x = Tensor(data, requires_grad=True)
    out = getattr(x, name)(axis=axis, keepdims=keepdims)
    expected = getattr(np, name)(data, axis=axis, keepdims=keepdims)
    assert out.shape == np.shape(expected)
    np.testing.assert_allclose(out.data, expected, rtol=1e-12, atol=1e-12)

    upstream = rng.standard_normal(out.shape)
    out.backward(upstream)
    assert x.grad.shape == shape
    axes = _reduced_axes(axis, len(shape))
    spread = np.broadcast_to(upstream if keepdims else np.expand_dims(upstream, axes), shape)
    count = int(np.prod([shape[i] for i in axes]))
    if name == "sum":
        np.testing.assert_allclose(x.grad, spread, rtol=1e-12)
    elif name == "mean":
        np.testing.assert_allclose(x.grad, spread / count, rtol=1e-12)
    elif name == "var":
        centered = data - data.mean(axis=axes, keepdims=True)
        np.testing.assert_allclose(x.grad, 2.0 * centered * spread / count, rtol=1e-9, atol=1e-12)
    else:  # distinct values: the whole gradient goes to the one extremum
        winners = data == getattr(np, name)(data, axis=axes, keepdims=True)
        np.testing.assert_allclose(x.grad, np.where(winners, spread, 0.0), rtol=1e-12)


@SETTINGS
@given(spec=shape_and_axis(), name=st.sampled_from(["max", "min"]), seed=st.integers(0, 2**16))
def test_tied_extrema_share_the_gradient_evenly(spec, name, seed):
    shape, axis, keepdims = spec
    data = np.random.default_rng(seed).integers(0, 3, shape).astype(np.float64)  # many ties
    x = Tensor(data, requires_grad=True)
    getattr(x, name)(axis=axis, keepdims=keepdims).sum().backward()
    axes = _reduced_axes(axis, len(shape))
    winners = data == getattr(np, name)(data, axis=axes, keepdims=True)
    ties = winners.sum(axis=axes, keepdims=True)
    np.testing.assert_allclose(x.grad, np.where(winners, 1.0 / ties, 0.0), rtol=1e-12)
    np.testing.assert_allclose(x.grad.sum(axis=axes), 1.0)


@SETTINGS
@given(
    rows=st.integers(1, 4),
    ids=st.lists(st.integers(0, 3), min_size=0, max_size=8),
    seed=st.integers(0, 2**16),
)
def test_repeated_integer_indices_accumulate(rows, ids, seed):
    ids = np.array([i % rows for i in ids], dtype=np.int64)
    rng = np.random.default_rng(seed)
    x = Tensor(rng.standard_normal((rows, 2)), requires_grad=True)
    upstream = rng.standard_normal((len(ids), 2))
    x[ids].backward(upstream)
    expected = np.zeros((rows, 2))
    for k, i in enumerate(ids):
        expected[i] += upstream[k]
    np.testing.assert_allclose(x.grad, expected, rtol=1e-12, atol=1e-15)


@SETTINGS
@given(shape=array_shapes(min_dims=0, max_dims=4, max_side=3), data=st.data())
def test_reshape_and_transpose_round_trip_gradients(shape, data):
    axes = data.draw(st.permutations(range(len(shape))))
    x = Tensor(np.arange(float(np.prod(shape))).reshape(shape), requires_grad=True)
    y = x.transpose(*axes) if axes else x.transpose()
    assert y.shape == np.transpose(x.data, axes or None).shape
    z = y.reshape(-1)
    upstream = np.arange(float(z.size)) + 1.0
    z.backward(upstream)
    np.testing.assert_array_equal(
        x.grad, np.transpose(upstream.reshape(y.shape), np.argsort(axes) if axes else None)
    )

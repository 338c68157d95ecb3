"""glassllm.functional without PyTorch: finite-difference gradients (float64, broadcasting
shapes, 0-d and size-1 axes), stability at extreme logits and fully masked rows, dtype
preservation, error messages, dropout statistics, erf accuracy, shape rules (hypothesis)
and the docstring examples."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import glassllm
import glassllm.functional as F
import glassllm.kernels.embedding as kernel_embedding
from glassllm import Tensor, gradcheck, no_grad


def leaf(shape, seed=0, low=None, dtype=np.float64, scale=1.0):
    """A leaf that requires grad, normal values (or uniform in [low, -low] when low given)."""
    rng = np.random.default_rng(seed)
    data = rng.standard_normal(shape) * scale if low is None else rng.uniform(low, -low, shape)
    return Tensor(np.asarray(data, dtype=dtype), requires_grad=True)


# ------------------------------------------------------------------ gradients (float64)


def test_gradcheck_concatenate():
    a, b, c = leaf((2, 3)), leaf((1, 3), 1), Tensor(np.ones((2, 3)))  # c constant
    assert gradcheck(lambda a, b: F.concatenate([a, b, c], axis=0), [a, b])
    assert gradcheck(lambda a, b: F.concatenate([a, b], axis=-2), [a, b])
    x, y = leaf((2, 1)), leaf((2, 2), 1)
    assert gradcheck(lambda x, y: F.concatenate((x, y), axis=-1), [x, y])


def test_gradcheck_stack():
    scalars = [leaf((), i) for i in range(3)]  # 0-d inputs stack to (3,)
    assert gradcheck(lambda *t: F.stack(t), scalars)
    a, b = leaf((2, 3)), leaf((2, 3), 1)
    for axis in (0, 1, 2, -1):
        assert gradcheck(lambda a, b, axis=axis: F.stack([a, b], axis=axis), [a, b])


def test_gradcheck_where_broadcasts_cond_and_operands():
    cond = np.random.default_rng(5).random((2, 1, 3)) > 0.5
    a, b = leaf((3,)), leaf((2, 4, 1), 1)
    assert gradcheck(lambda a, b: F.where(cond, a, b), [a, b])
    scalar = leaf(())
    assert gradcheck(lambda a, s: F.where(cond, a, s), [a, scalar])
    assert gradcheck(lambda a: F.where(cond, a, 0.0), [a])


@pytest.mark.parametrize(
    "shape,axis,keepdims",
    [
        ((2, 3, 4), -1, False),
        ((2, 3, 4), 0, True),
        ((2, 3, 4), (0, 2), False),
        ((2, 1, 3), None, False),
        ((3, 1), -1, True),
        ((), None, False),
    ],
)
def test_gradcheck_logsumexp(shape, axis, keepdims):
    assert gradcheck(lambda x: F.logsumexp(x, axis=axis, keepdims=keepdims), [leaf(shape)])


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax])
@pytest.mark.parametrize(
    "shape,axis",
    [((2, 3, 4), -1), ((2, 3, 4), 0), ((2, 3, 4), 1), ((3, 1), -1), ((4,), 0), ((), None)],
)
def test_gradcheck_softmax_family(fn, shape, axis):
    assert gradcheck(lambda x: fn(x, axis=axis), [leaf(shape, scale=2.0)])


@pytest.mark.parametrize("ignore", [None, -100, 2])
def test_gradcheck_cross_entropy(ignore):
    targets = (
        np.array([[0, 4, 2], [-100, 1, 2]]) if ignore == -100 else np.array([[0, 4, 2], [3, 1, 2]])
    )
    logits = leaf((2, 3, 5), scale=2.0)
    assert gradcheck(lambda z: F.cross_entropy(z, targets, ignore_index=ignore), [logits])


def test_gradcheck_cross_entropy_single_position_and_constant_target_tensor():
    assert gradcheck(
        lambda z: F.cross_entropy(z, np.array(2)), [leaf((4,))]
    )  # (C,) with 0-d target
    targets = Tensor(np.array([1, 0, 1]))
    assert gradcheck(lambda z: F.cross_entropy(z, targets), [leaf((3, 2))])


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("shape", [(), (2, 3), (1, 4, 1)])
def test_gradcheck_gelu(approximate, shape, op_path):
    assert gradcheck(lambda x: F.gelu(x, approximate=approximate), [leaf(shape, scale=2.0)])


def test_gradcheck_relu_away_from_the_kink():
    x = Tensor(np.array([[-1.5, -0.2, 0.3], [0.7, -2.0, 1.1]]), requires_grad=True)
    assert gradcheck(F.relu, [x])
    assert gradcheck(F.relu, [Tensor(np.array(0.5), requires_grad=True)])


def test_gradcheck_layer_norm(op_path):
    x, w, b = leaf((2, 3, 4)), leaf((4,), 1), leaf((4,), 2)
    assert gradcheck(lambda x, w, b: F.layer_norm(x, w, b), [x, w, b])
    assert gradcheck(lambda x: F.layer_norm(x), [x])
    assert gradcheck(lambda x, w: F.layer_norm(x, weight=w, eps=1e-3), [leaf((4,)), w])
    assert gradcheck(lambda x, b: F.layer_norm(x, bias=b), [leaf((1, 4)), b])


def test_gradcheck_dropout_with_a_fixed_mask():
    x = leaf((3, 4))
    assert gradcheck(lambda x: F.dropout(x, 0.4, rng=np.random.default_rng(7)), [x])


@pytest.mark.parametrize("one_hot_max_rows", [0, 1000])  # the sort path, the one-hot path
def test_gradcheck_embedding_with_repeated_ids(monkeypatch, one_hot_max_rows, op_path):
    monkeypatch.setattr(kernel_embedding, "ONE_HOT_MAX_ROWS", one_hot_max_rows)
    ids = np.array([[3, 0, 3], [1, 3, 0]])  # 3 three times, 0 twice, 2 never
    weight = leaf((4, 3))
    assert gradcheck(lambda w: F.embedding(ids, w), [weight])
    assert gradcheck(lambda w: F.embedding(np.array(2), w), [weight])  # 0-d ids -> (3,)
    weight.grad = None
    F.embedding(ids, weight).backward(np.ones((2, 3, 3)))
    np.testing.assert_array_equal(weight.grad[:, 0], [2.0, 1.0, 0.0, 3.0])


def test_gradcheck_linear(op_path):
    x, w, b = leaf((2, 3, 4)), leaf((4, 5), 1), leaf((5,), 2)
    assert gradcheck(lambda x, w, b: F.linear(x, w, b), [x, w, b])
    assert gradcheck(lambda x, w: F.linear(x, w), [leaf((4,)), w])  # 1-D input
    assert gradcheck(lambda x, w: F.linear(x, w), [leaf((1, 1, 4)), w])


def test_gradcheck_attention_plain_and_broadcast_batch(op_path):
    q, k, v = leaf((2, 3, 4)), leaf((2, 5, 4), 1), leaf((2, 5, 3), 2)
    assert gradcheck(F.scaled_dot_product_attention, [q, k, v])
    # one key/value head shared by two query heads: k, v broadcast over the head axis
    q4, k4, v4 = leaf((1, 2, 3, 4)), leaf((1, 1, 3, 4), 1), leaf((1, 1, 3, 2), 2)
    assert gradcheck(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=True), [q4, k4, v4]
    )


def test_gradcheck_attention_causal_kv_cache_mask_and_dropout(op_path):
    q, k, v = leaf((2, 3, 4)), leaf((2, 5, 4), 1), leaf((2, 5, 3), 2)
    sdpa = F.scaled_dot_product_attention
    assert gradcheck(lambda q, k, v: sdpa(q, k, v, causal=True), [q, k, v])  # Tq < Tk
    mask = np.random.default_rng(3).random((1, 3, 5)) > 0.3
    mask[:, :, 0] = True
    assert gradcheck(lambda q, k, v: sdpa(q, k, v, mask=mask), [q, k, v])
    batch_mask = np.random.default_rng(4).random((4, 1, 1, 5)) > 0.3  # adds a batch axis
    batch_mask[..., 1] = True
    assert gradcheck(lambda q, k, v: sdpa(q, k, v, mask=batch_mask), [q, k, v])
    assert gradcheck(
        lambda q, k, v: sdpa(q, k, v, causal=True, dropout_p=0.3, rng=np.random.default_rng(1)),
        [q, k, v],
    )


# ------------------------------------------------------------------ fused vs composite


def test_fused_functions_match_composite_tensor_chains():
    x, w, b = leaf((3, 5)), leaf((5, 2), 1), leaf((2,), 2)
    composite = {
        "softmax": lambda x: (
            (x - x.max(axis=-1, keepdims=True)).exp()
            / (x - x.max(axis=-1, keepdims=True)).exp().sum(axis=-1, keepdims=True)
        ),
        "linear": lambda x: x @ w + b,
        "layer_norm": lambda x: (
            (x - x.mean(axis=-1, keepdims=True)) / (x.var(axis=-1, keepdims=True) + 1e-5).sqrt()
        ),
        "relu": lambda x: x.relu(),
    }
    fused = {
        "softmax": F.softmax,
        "linear": lambda x: F.linear(x, w, b),
        "layer_norm": F.layer_norm,
        "relu": F.relu,
    }
    for name in composite:
        grads = []
        for fn in (composite[name], fused[name]):
            for t in (x, w, b):
                t.grad = None
            out = fn(x)
            out.backward(np.random.default_rng(9).standard_normal(out.shape))
            grads.append((out.data, x.grad.copy()))
        np.testing.assert_allclose(grads[0][0], grads[1][0], rtol=1e-12, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(grads[0][1], grads[1][1], rtol=1e-10, atol=1e-12, err_msg=name)


def test_cross_entropy_matches_mean_of_picked_log_softmax():
    logits, targets = leaf((4, 6), scale=3.0), np.array([5, 0, 0, 2])
    expected = -np.mean(F.log_softmax(logits).data[np.arange(4), targets])
    np.testing.assert_allclose(F.cross_entropy(logits, targets).data, expected, rtol=1e-14)


def test_attention_matches_naive_formula():
    q, k, v = leaf((2, 3, 4)), leaf((2, 5, 4), 1), leaf((2, 5, 3), 2)
    out = F.scaled_dot_product_attention(q, k, v, causal=True)
    scores = q.data @ k.data.transpose(0, 2, 1) / 2.0
    allowed = np.arange(5)[None, :] <= np.arange(3)[:, None] + 2  # j <= Tk - Tq + i
    scores = np.where(allowed, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    np.testing.assert_allclose(out.data, probs @ v.data, rtol=1e-12)


@pytest.mark.parametrize(
    "qk_dtype, v_dtype, rtol", [(np.float32, np.float64, 1e-13), (np.float16, np.float32, 2e-6)]
)
def test_mixed_dtype_attention_computes_in_the_widest_dtype(qk_dtype, v_dtype, rtol):
    """Narrow q and k with a wider v: every step, the 1/sqrt(d) scale included (d = 3, not a
    power of two), is rounded in the result dtype, as the formula in that dtype gives."""
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((2, n, 3)).astype(qk_dtype) for n in (5, 7))
    v = rng.standard_normal((2, 7, 3)).astype(v_dtype)
    out = F.scaled_dot_product_attention(Tensor(q), Tensor(k), Tensor(v)).data
    wide = np.float64
    scores = q.astype(wide) @ k.astype(wide).transpose(0, 2, 1) / np.sqrt(3.0)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    assert out.dtype == v_dtype
    np.testing.assert_allclose(out, probs @ v.astype(wide), rtol=rtol, atol=rtol)


# ------------------------------------------------------------------ stability


def test_large_logits_stay_finite_in_float32():
    rng = np.random.default_rng(0)
    logits = (rng.choice([-1e4, 1e4], (4, 7)) + rng.standard_normal((4, 7))).astype(np.float32)
    targets = np.array([0, 3, 6, 2])
    for fn in (F.softmax, F.log_softmax, F.logsumexp, lambda z: F.cross_entropy(z, targets)):
        z = Tensor(logits, requires_grad=True)
        out = fn(z)
        out.backward(np.ones(out.shape, dtype=np.float32))
        assert np.isfinite(out.data).all() and np.isfinite(z.grad).all()
        assert out.dtype == z.grad.dtype == np.float32
    np.testing.assert_allclose(
        F.logsumexp(Tensor(np.float32([1e4, 1e4]))).data, 1e4 + math.log(2), rtol=1e-7
    )
    q = Tensor(np.full((1, 3, 2), 100.0, dtype=np.float32), requires_grad=True)  # scores ~1e4
    k = Tensor(np.float32([[[100, 100], [-100, -100], [100, -100]]]), requires_grad=True)
    v = Tensor(np.ones((1, 3, 2), dtype=np.float32), requires_grad=True)
    out = F.scaled_dot_product_attention(q, k, v)
    out.backward(np.ones(out.shape, dtype=np.float32))
    for t in (out.data, q.grad, k.grad, v.grad):
        assert np.isfinite(t).all()


def test_fully_masked_rows_give_zeros_not_nan():
    x = Tensor(np.array([[-np.inf, -np.inf], [0.0, -np.inf]]), requires_grad=True)
    p = F.softmax(x)
    p.backward(np.ones((2, 2)))
    np.testing.assert_array_equal(p.data, [[0.0, 0.0], [1.0, 0.0]])
    assert np.isfinite(x.grad).all()
    np.testing.assert_array_equal(F.logsumexp(x).data, [-np.inf, 0.0])
    np.testing.assert_array_equal(F.log_softmax(x).data, [[-np.inf, -np.inf], [0.0, -np.inf]])

    q, k, v = leaf((1, 4, 2)), leaf((1, 2, 2), 1), leaf((1, 2, 3), 2)
    out = F.scaled_dot_product_attention(q, k, v, causal=True)  # Tq > Tk: queries 0, 1 see nothing
    out.backward(np.ones(out.shape))
    np.testing.assert_array_equal(out.data[0, :2], 0.0)
    assert np.isfinite(out.data).all() and np.isfinite(q.grad).all() and np.isfinite(k.grad).all()
    np.testing.assert_array_equal(q.grad[0, :2], 0.0)
    mask = np.array([[False, False], [True, False], [True, True], [False, True]])
    assert np.isfinite(F.scaled_dot_product_attention(q, k, v, mask=mask).data).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_are_computed_independently(dtype):
    """Each row's shift is its own maximum: another row (here one offset by 1e3, far outside
    the others' range) changes nothing beyond BLAS's row-blocking rounding, and later positions
    in causal attention change earlier outputs not even in the last bit."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 6)).astype(dtype)
    wide = np.concatenate([x, x[:1] + 1e3]).astype(dtype)
    seed = rng.standard_normal((4, 6)).astype(dtype)
    tol = dict(rtol=1e-6, atol=1e-7) if dtype == np.float32 else dict(rtol=1e-14, atol=1e-15)
    for fn in (F.softmax, F.log_softmax):
        narrow_t, wide_t = Tensor(x, requires_grad=True), Tensor(wide, requires_grad=True)
        a, b = fn(narrow_t), fn(wide_t)
        np.testing.assert_allclose(a.data, b.data[:3], **tol)
        a.backward(seed[:3])
        b.backward(seed)
        np.testing.assert_allclose(narrow_t.grad, wide_t.grad[:3], **tol)
    lse_narrow, lse_wide = F.logsumexp(Tensor(x)).data, F.logsumexp(Tensor(wide)).data
    np.testing.assert_allclose(lse_narrow, lse_wide[:3], **tol)
    q, k, v = (rng.standard_normal((1, 5, 3)).astype(dtype) for _ in range(3))
    out = F.scaled_dot_product_attention(Tensor(q), Tensor(k), Tensor(v), causal=True).data
    later = [a.copy() for a in (q, k, v)]
    for a in later:
        a[:, 3:] += 100.0  # the future changes a lot
    changed = F.scaled_dot_product_attention(*map(Tensor, later), causal=True).data
    np.testing.assert_array_equal(out[:, :3], changed[:, :3])


def test_cross_entropy_all_ignored_is_zero_with_zero_gradient():
    logits = leaf((2, 3))
    loss = F.cross_entropy(logits, np.array([-1, -1]), ignore_index=-1)
    loss.backward()
    assert float(loss.data) == 0.0
    np.testing.assert_array_equal(logits.grad, 0.0)


def test_cross_entropy_ignores_positions():
    logits, targets = leaf((3, 4)), np.array([1, -100, 3])
    loss = F.cross_entropy(logits, targets, ignore_index=-100)
    kept = F.cross_entropy(Tensor(logits.data[[0, 2]]), targets[[0, 2]])
    np.testing.assert_allclose(loss.data, kept.data, rtol=1e-14)
    loss.backward()
    np.testing.assert_array_equal(logits.grad[1], 0.0)


def test_gelu_extreme_inputs():
    x = Tensor(np.float32([-1e4, -30.0, 0.0, 30.0, 1e4]), requires_grad=True)
    for approximate in ("tanh", "none"):
        x.grad = None
        y = F.gelu(x, approximate=approximate)
        y.backward(np.ones(5, dtype=np.float32))
        np.testing.assert_array_equal(y.data, [0.0, 0.0, 0.0, 30.0, 1e4])
        np.testing.assert_array_equal(x.grad, [0.0, 0.0, 0.5, 1.0, 1.0])


def test_layer_norm_large_offset_does_not_cancel():
    x = Tensor(np.float32([[1e4 + 1.0, 1e4 + 2.0, 1e4 + 3.0]]))
    np.testing.assert_allclose(
        F.layer_norm(x, eps=0.0).data, [[-1.2247449, 0.0, 1.2247449]], rtol=1e-6
    )


# ------------------------------------------------------------------ dtypes


def _float32_cases():
    rng = np.random.default_rng(0)
    f32 = lambda *shape: Tensor(rng.standard_normal(shape, dtype=np.float32), requires_grad=True)
    x, w, b, ids = (
        f32(2, 3, 4),
        f32(
            4,
        ),
        f32(
            4,
        ),
        np.array([[0, 1, 1], [3, 0, 2]]),
    )
    table, weight, bias = (
        f32(4, 4),
        f32(4, 5),
        f32(
            5,
        ),
    )
    return {
        "concatenate": (lambda: F.concatenate([x, x], axis=1), [x]),
        "stack": (lambda: F.stack([x, x], axis=-1), [x]),
        "where": (lambda: F.where(x.data > 0, x, 0.5), [x]),
        "logsumexp": (lambda: F.logsumexp(x, axis=(0, 2)), [x]),
        "softmax": (lambda: F.softmax(x, axis=1), [x]),
        "log_softmax": (lambda: F.log_softmax(x), [x]),
        "cross_entropy": (lambda: F.cross_entropy(x, np.array([[0, 1, 3], [2, 0, -1]]), -1), [x]),
        "gelu_tanh": (lambda: F.gelu(x), [x]),
        "gelu_none": (lambda: F.gelu(x, approximate="none"), [x]),
        "relu": (lambda: F.relu(x), [x]),
        "layer_norm": (lambda: F.layer_norm(x, w, b), [x, w, b]),
        "dropout": (lambda: F.dropout(x, 0.5, rng=np.random.default_rng(0)), [x]),
        "embedding": (lambda: F.embedding(ids, table), [table]),
        "linear": (lambda: F.linear(x, weight, bias), [x, weight, bias]),
        "attention": (
            lambda: F.scaled_dot_product_attention(x, x, x, causal=True, dropout_p=0.1),
            [x],
        ),
    }


@pytest.mark.parametrize("name", sorted(_float32_cases()))
def test_float32_in_float32_out_and_float32_gradients(name):
    fn, inputs = _float32_cases()[name]
    out = fn()
    assert out.dtype == np.float32, name
    out.backward(np.ones(out.shape, dtype=np.float32))
    for t in inputs:
        assert t.grad is not None and t.grad.dtype == np.float32, name


def test_float32_internals_make_no_float64(monkeypatch):
    """Every array a backward returns (not just what the engine casts) is already float32."""
    original = Tensor.from_op.__func__
    returned = []

    def spy(cls, data, parents, backward):
        assert np.asarray(data).dtype == np.float32
        return original(cls, data, parents, lambda g: returned.append(backward(g)) or returned[-1])

    monkeypatch.setattr(Tensor, "from_op", classmethod(spy))
    for fn, _ in _float32_cases().values():
        out = fn()
        out.backward(np.ones(out.shape, dtype=np.float32))
    for grads in returned:
        for g in grads:
            assert g is None or g.dtype == np.float32


# ------------------------------------------------------------------ dropout


def test_dropout_statistics_identity_and_reproducibility():
    x = Tensor(np.ones((200, 100), dtype=np.float32), requires_grad=True)
    y = F.dropout(x, 0.3, rng=np.random.default_rng(0))
    kept = y.data != 0
    assert abs(kept.mean() - 0.7) < 0.01
    np.testing.assert_allclose(y.data[kept], 1 / 0.7, rtol=1e-6)
    y.backward(np.full(y.shape, 2.0, dtype=np.float32))
    np.testing.assert_allclose(x.grad, 2.0 * y.data)  # the same mask
    assert F.dropout(x, 0.3, training=False) is x and F.dropout(x, 0.0) is x
    a = F.dropout(x, 0.5, rng=np.random.default_rng(3)).data
    np.testing.assert_array_equal(a, F.dropout(x, 0.5, rng=np.random.default_rng(3)).data)
    glassllm.manual_seed(11)
    first = F.dropout(x, 0.5).data
    glassllm.manual_seed(11)
    np.testing.assert_array_equal(first, F.dropout(x, 0.5).data)  # the global generator
    ones = F.dropout(x, 1.0)
    ones.backward(np.ones(ones.shape, dtype=np.float32))
    assert not ones.data.any()


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "call,error,words",
    [
        (
            lambda: F.cross_entropy(Tensor(np.zeros((2, 3))), np.array([0, 3])),
            ValueError,
            "outside [0, 3)",
        ),
        (
            lambda: F.cross_entropy(Tensor(np.zeros((2, 3))), np.array([0, -1])),
            ValueError,
            "target -1",
        ),
        (
            lambda: F.cross_entropy(Tensor(np.zeros((2, 3))), np.array([0.0, 1.0])),
            TypeError,
            "integers",
        ),
        (
            lambda: F.cross_entropy(Tensor(np.zeros((2, 3))), np.array([0, 1, 2])),
            ValueError,
            "targets shape",
        ),
        (lambda: F.embedding(np.array([4]), Tensor(np.zeros((4, 2)))), IndexError, "id 4"),
        (lambda: F.embedding(np.array([-1]), Tensor(np.zeros((4, 2)))), IndexError, "id -1"),
        (lambda: F.embedding(np.array([0.5]), Tensor(np.zeros((4, 2)))), TypeError, "integers"),
        (lambda: F.dropout(Tensor(np.ones(3)), 1.5), ValueError, "[0, 1]"),
        (lambda: F.dropout(Tensor(np.ones(3)), -0.1), ValueError, "[0, 1]"),
        (lambda: F.gelu(Tensor(np.ones(3)), approximate="exact"), ValueError, "approximate"),
        (
            lambda: F.layer_norm(Tensor(np.ones((2, 3))), Tensor(np.ones(2))),
            ValueError,
            "weight shape",
        ),
        (lambda: F.linear(Tensor(np.ones((2, 3))), Tensor(np.ones((4, 5)))), ValueError, "in=4"),
        (
            lambda: F.linear(Tensor(np.ones((2, 4))), Tensor(np.ones((4, 5))), Tensor(np.ones(4))),
            ValueError,
            "bias shape",
        ),
        (
            lambda: F.scaled_dot_product_attention(*(Tensor(np.ones((2, s))) for s in (3, 4, 4))),
            ValueError,
            "head",
        ),
        (
            lambda: F.scaled_dot_product_attention(*(Tensor(np.ones((t, 2))) for t in (2, 3, 4))),
            ValueError,
            "number of keys",
        ),
        (
            lambda: F.scaled_dot_product_attention(
                *(Tensor(np.ones((2, 2))),) * 3, mask=np.ones((2, 2))
            ),
            TypeError,
            "boolean",
        ),
        (lambda: F.where(np.ones(2), Tensor(np.ones(2)), 0.0), TypeError, "boolean"),
        (lambda: F.concatenate([]), ValueError, "at least one"),
        (lambda: F.stack(Tensor(np.ones(2))), TypeError, "sequence"),
        (lambda: F.softmax(Tensor(np.arange(3))), TypeError, "floating-point"),
    ],
)
def test_bad_input_raises_a_clear_error(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


# ------------------------------------------------------------------ erf


def test_erf_and_erfc_are_float64_accurate():
    x = np.concatenate([np.linspace(-8, 8, 4001), [0.0, 0.46875, -0.46875, 4.0, -4.0, 26.0, 30.0]])
    erf_ref = np.array([math.erf(t) for t in x])
    erfc_ref = np.array([math.erfc(t) for t in x])
    np.testing.assert_allclose(F.erf(x), erf_ref, rtol=2e-15, atol=1e-300)
    np.testing.assert_allclose(F.erfc(x), erfc_ref, rtol=4e-15, atol=1e-300)
    special = (
        F.erf(np.array([np.inf, -np.inf, np.nan])),
        F.erfc(np.array([np.inf, -np.inf, np.nan])),
    )
    np.testing.assert_array_equal(special[0], [1.0, -1.0, np.nan])
    np.testing.assert_array_equal(special[1], [0.0, 2.0, np.nan])

    # float32: computed in float32, erfc by one rational function up to |x| = 11
    x32 = np.concatenate([np.linspace(-12, 12, 4801), [1e-30, 1e4, -1e4]]).astype(np.float32)
    erf32, erfc32 = F.erf(x32), F.erfc(x32)
    assert erf32.dtype == np.float32 and erfc32.dtype == np.float32
    np.testing.assert_allclose(erf32, [math.erf(t) for t in x32], rtol=4e-7, atol=0)
    exact = np.array([math.erfc(t) for t in x32.astype(np.float64)])
    near = np.abs(x32) <= 4
    np.testing.assert_allclose(erfc32[near], exact[near], rtol=1.5e-6, atol=0)
    np.testing.assert_allclose(erfc32, exact, rtol=1e-5, atol=1e-44)  # the tail: ~x^2 ulp
    special32 = np.float32([np.inf, -np.inf, np.nan])
    np.testing.assert_array_equal(F.erf(special32), [1.0, -1.0, np.nan])
    np.testing.assert_array_equal(F.erfc(special32), [0.0, 2.0, np.nan])


# ------------------------------------------------------------------ shape rules (hypothesis)

small_shapes = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=5)


@settings(max_examples=40, deadline=None)
@given(shape=small_shapes, data=st.data())
def test_softmax_sums_to_one_on_any_axis(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    values = data.draw(hnp.arrays(np.float64, shape, elements=st.floats(-1e4, 1e4)))
    p = F.softmax(Tensor(values), axis=axis).data
    np.testing.assert_allclose(p.sum(axis=axis), 1.0, rtol=1e-12)
    assert (p >= 0).all()
    log_p = F.log_softmax(Tensor(values), axis=axis).data
    np.testing.assert_allclose(np.exp(log_p).sum(axis=axis), 1.0, rtol=1e-12)
    lse = F.logsumexp(Tensor(values), axis=axis, keepdims=True).data
    assert lse.shape == np.sum(values, axis=axis, keepdims=True).shape
    assert (lse >= values.max(axis=axis, keepdims=True)).all()


@settings(max_examples=40, deadline=None)
@given(shape=small_shapes, count=st.integers(1, 3), data=st.data())
def test_concatenate_and_stack_follow_numpy_shapes(shape, count, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    sizes = data.draw(st.lists(st.integers(0, 3), min_size=count, max_size=count))
    parts = []
    for size in sizes:
        part_shape = list(shape)
        part_shape[axis] = size
        parts.append(np.arange(math.prod(part_shape), dtype=np.float64).reshape(part_shape))
    tensors = [Tensor(p, requires_grad=True) for p in parts]
    out = F.concatenate(tensors, axis=axis)
    np.testing.assert_array_equal(out.data, np.concatenate(parts, axis=axis))
    out.backward(np.ones(out.shape))
    assert all(t.grad.shape == t.shape for t in tensors)
    stack_axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    same = [Tensor(np.full(shape, float(i)), requires_grad=True) for i in range(count)]
    stacked = F.stack(same, axis=stack_axis)
    assert stacked.shape == np.stack([t.data for t in same], axis=stack_axis).shape
    stacked.backward(np.arange(stacked.size, dtype=np.float64).reshape(stacked.shape))
    expected = np.moveaxis(
        np.arange(stacked.size, dtype=np.float64).reshape(stacked.shape), stack_axis, 0
    )
    for i, t in enumerate(same):
        np.testing.assert_array_equal(t.grad, expected[i])


@settings(max_examples=30, deadline=None)
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=3))
def test_where_broadcasts_like_numpy(shapes):
    cond_shape, a_shape, b_shape = shapes.input_shapes
    cond = np.arange(math.prod(cond_shape)).reshape(cond_shape) % 2 == 0
    a, b = (
        Tensor(np.ones(a_shape), requires_grad=True),
        Tensor(np.zeros(b_shape), requires_grad=True),
    )
    out = F.where(cond, a, b)
    assert out.shape == shapes.result_shape
    out.backward(np.ones(out.shape))
    total = a.grad.sum() + b.grad.sum()  # every output entry came from exactly one operand
    assert total == math.prod(out.shape)


# ------------------------------------------------------------------ misc


def test_no_graph_under_no_grad():
    x = leaf((2, 3))
    with no_grad():
        for out in (F.softmax(x), F.gelu(x), F.layer_norm(x), F.cross_entropy(x, np.array([0, 1]))):
            assert not out.requires_grad and out.parents == ()


def test_backward_twice_gives_twice_the_gradient():
    """The VJPs do not consume what they saved (a graph may be differentiated again)."""
    q, k, v = leaf((2, 3, 4)), leaf((2, 3, 4), 1), leaf((2, 3, 4), 2)
    loss = F.cross_entropy(
        F.scaled_dot_product_attention(F.layer_norm(q), k, v, causal=True),
        np.array([[0, 1, 3], [2, 2, 1]]),
    )
    loss.backward()
    first = q.grad.copy()
    loss.backward()
    np.testing.assert_allclose(q.grad, 2 * first, rtol=1e-14)


def test_attention_mask_of_the_wrong_shape_is_named():
    q = Tensor(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match=r"mask of shape \(3, 5\) does not broadcast"):
        F.scaled_dot_product_attention(q, q, q, mask=np.ones((3, 5), dtype=bool))

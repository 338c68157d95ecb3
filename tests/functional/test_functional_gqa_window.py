"""Grouped-query attention, the attention scale and the sliding window in
F.scaled_dot_product_attention and F.attention_probabilities: finite differences in float64,
PyTorch's sdpa (enable_gqa, scale, an explicit band mask) as the oracle, a KV cache (queries
aligned to the end), no copy of k/v per query head in the kernel, shapes (hypothesis), errors."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import optional
from hypothesis import given, settings
from hypothesis import strategies as st

import glassllm.functional as F
from glassllm import Tensor, gradcheck, kernels
from glassllm.kernels import attention as attention_kernels
from glassllm.kernels import grouped_attention as grouped_kernels

sdpa = F.scaled_dot_product_attention


def leaf(shape, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return Tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)


def band(num_queries, num_keys, window=None):
    """Allowed (True) where aligned query ``a = Tk - Tq + i`` may see key j: ``0 <= a - j <
    window`` (window None: causal only), written out entry by entry."""
    allowed = np.zeros((num_queries, num_keys), dtype=bool)
    for i in range(num_queries):
        for j in range(num_keys):
            lag = num_keys - num_queries + i - j
            allowed[i, j] = lag >= 0 and (window is None or lag < window)
    return allowed


def qkv(heads=4, kv_heads=2, queries=5, keys=5, dim=3, batch=2, seed=0, dtype=np.float64):
    return (
        leaf((batch, heads, queries, dim), seed, dtype),
        leaf((batch, kv_heads, keys, dim), seed + 1, dtype),
        leaf((batch, kv_heads, keys, dim + 1), seed + 2, dtype),
    )


# ------------------------------------------------------------------ gradients (float64)


@pytest.mark.parametrize("queries,keys", [(5, 5), (2, 6)])  # self-attention; after a cache
def test_gradcheck_grouped_query_attention(op_path, queries, keys):
    q, k, v = qkv(queries=queries, keys=keys)
    assert gradcheck(lambda q, k, v: sdpa(q, k, v, causal=True), [q, k, v])
    assert gradcheck(lambda q, k, v: sdpa(q, k, v, causal=True, window=2, scale=0.7), [q, k, v])
    head_mask = np.random.default_rng(3).random((4, queries, keys)) > 0.3  # per query head
    head_mask[..., 0] = True
    assert gradcheck(lambda q, k, v: sdpa(q, k, v, mask=head_mask), [q, k, v])
    padding = np.ones((2, 1, 1, keys), dtype=bool)
    padding[0, ..., -1] = False
    assert gradcheck(lambda q, k, v: sdpa(q, k, v, causal=True, mask=padding), [q, k, v])
    rng = lambda: np.random.default_rng(5)  # noqa: E731 (the same draw for every evaluation)
    assert gradcheck(lambda q, k, v: sdpa(q, k, v, dropout_p=0.3, rng=rng()), [q, k, v])


def test_gradcheck_window_and_scale_without_groups(op_path):
    q, k, v = qkv(heads=2, kv_heads=2, queries=3, keys=7)
    assert gradcheck(lambda q, k, v: sdpa(q, k, v, causal=True, window=3), [q, k, v])
    assert gradcheck(lambda q, k, v: sdpa(q, k, v, scale=1.0), [q, k, v])


# ------------------------------------------------------------------ PyTorch as the oracle


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("queries,keys", [(6, 6), (1, 9), (3, 9), (9, 12)])  # tiles; few, many rows
def test_matches_torch_sdpa_with_enable_gqa(op_path, dtype, window, queries, keys):
    torch = optional("torch")
    q, k, v = qkv(heads=6, kv_heads=2, queries=queries, keys=keys, dim=8, dtype=dtype)
    grad = np.random.default_rng(9).standard_normal((2, 6, queries, 9)).astype(dtype)
    tq, tk, tv = (torch.tensor(t.data, requires_grad=True) for t in (q, k, v))
    allowed = torch.tensor(band(queries, keys, window))
    want = torch.nn.functional.scaled_dot_product_attention(
        tq, tk, tv, attn_mask=allowed, scale=0.25, enable_gqa=True
    )
    want.backward(torch.tensor(grad))
    got = sdpa(q, k, v, causal=True, window=window, scale=0.25)
    got.backward(grad)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-11, atol=1e-12)
    assert got.dtype == q.grad.dtype == k.grad.dtype == v.grad.dtype == dtype
    np.testing.assert_allclose(got.data, want.detach().numpy(), **tol)
    for ours, theirs in ((q, tq), (k, tk), (v, tv)):
        np.testing.assert_allclose(ours.grad, theirs.grad.numpy(), **tol)
    probs = F.attention_probabilities(q, k, causal=True, window=window, scale=0.25)
    repeated = np.repeat(v.data, 3, axis=1)  # query head h reads kv head h // 3
    np.testing.assert_allclose(probs @ repeated, want.detach().numpy(), **tol)


def test_groups_are_contiguous_as_transformers_repeat_kv():
    """Query heads 0-2 read kv head 0 and 3-5 kv head 1 (not interleaved 0 1 0 1 ...)."""
    q, k, v = qkv(heads=6, kv_heads=2)
    got = sdpa(q, k, v).data
    for head in range(6):
        kv = slice(head // 3, head // 3 + 1)
        alone = sdpa(q[:, head : head + 1], k[:, kv], v[:, kv])
        np.testing.assert_allclose(got[:, head : head + 1], alone.data, rtol=1e-12)


def test_window_with_a_cache_matches_the_full_forward_row_for_row(op_path):
    """GPT-Neo's local layer decoding: the last query of a full forward and the same query after
    a cache of the earlier keys see the same window of keys."""
    q, k, v = qkv(heads=4, kv_heads=4, queries=8, keys=8)
    full = sdpa(q, k, v, causal=True, window=3).data
    for t in range(8):
        step = sdpa(q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], causal=True, window=3)
        np.testing.assert_allclose(step.data, full[:, :, t : t + 1], rtol=1e-12, atol=1e-14)
    probs = F.attention_probabilities(q, k, causal=True, window=3)
    np.testing.assert_array_equal(probs > 0, np.broadcast_to(band(8, 8, 3), probs.shape))
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-12)


def test_window_wider_than_the_keys_is_plain_causal_and_scale_none_is_one_over_sqrt_d():
    q, k, v = qkv(queries=4, keys=6, dim=4)
    np.testing.assert_array_equal(
        sdpa(q, k, v, causal=True, window=6).data, sdpa(q, k, v, causal=True).data
    )
    np.testing.assert_array_equal(sdpa(q, k, v, scale=0.5).data, sdpa(q, k, v).data)


@pytest.mark.parametrize("queries", [4, 1])  # causal tiles; stacked after a cache
def test_the_kernel_never_repeats_k_or_v(monkeypatch, queries):
    """The fast path multiplies by the kv heads as they are: every k and v it computes with has
    KV heads (axis 1), never H, and np.repeat is never called."""
    seen = []

    def spy(original):
        def run(q, k, v, *args, **kwargs):
            seen.append((k.shape[1], v.shape[1]))
            return original(q, k, v, *args, **kwargs)

        return run

    def no_repeat(*args, **kwargs):
        raise AssertionError("np.repeat called on the fast path")

    for name in ("_attention_forward", "_causal_forward"):
        monkeypatch.setattr(grouped_kernels, name, spy(getattr(grouped_kernels, name)))
    monkeypatch.setattr(np, "repeat", no_repeat)
    q, k, v = qkv(heads=6, kv_heads=2, queries=queries, keys=4)
    out = sdpa(q, k, v, causal=True)
    out.backward(np.ones(out.shape))
    F.attention_probabilities(q, k, causal=True)
    assert seen == [(2, 2)]
    assert k.grad.shape == (2, 2, 4, 3) and v.grad.shape == (2, 2, 4, 4)


def test_dropout_draws_the_same_mask_on_the_kernel_and_the_definition():
    q, k, v = qkv(heads=4, kv_heads=2, dtype=np.float64)
    fast = sdpa(q, k, v, causal=True, dropout_p=0.4, rng=np.random.default_rng(1)).data
    with kernels.use("reference"):
        ref = sdpa(q, k, v, causal=True, dropout_p=0.4, rng=np.random.default_rng(1)).data
    np.testing.assert_allclose(fast, ref, rtol=1e-12, atol=1e-14)


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 2),
    kv_heads=st.integers(1, 3),
    groups=st.integers(1, 3),
    queries=st.integers(1, 4),
    extra_keys=st.integers(0, 3),
    window=st.one_of(st.none(), st.integers(1, 4)),
)
def test_grouped_attention_is_attention_with_repeated_kv(
    batch, kv_heads, groups, queries, extra_keys, window
):
    heads, keys = kv_heads * groups, queries + extra_keys
    q, k, v = qkv(heads, kv_heads, queries, keys, dim=2, batch=batch)
    got = sdpa(q, k, v, causal=True, window=window)
    assert got.shape == (batch, heads, queries, 3)
    repeated = (np.repeat(t.data, groups, axis=1) for t in (k, v))
    want = sdpa(q, *map(Tensor, repeated), causal=True, window=window)
    np.testing.assert_allclose(got.data, want.data, rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "call,error,words",
    [
        (lambda: sdpa(*qkv(heads=4, kv_heads=3)), ValueError, "dividing q's H heads"),
        (lambda: sdpa(*qkv(), window=2), ValueError, "causal=True"),
        (lambda: sdpa(*qkv(), causal=True, window=0), ValueError, "window"),
        (lambda: sdpa(*qkv(), scale="0.5"), TypeError, "scale"),
        (lambda: sdpa(*qkv(), scale=float("inf")), ValueError, "finite"),
        (
            lambda: sdpa(*qkv(), mask=np.ones((3, 5, 5), dtype=bool)),
            ValueError,
            "(2, 4, 5, 5)",
        ),
        (lambda: F.attention_probabilities(*qkv()[:2], window=2), ValueError, "causal=True"),
        (
            lambda: F.attention_probabilities(*qkv(heads=5, kv_heads=2)[:2]),
            ValueError,
            "grouped-query",
        ),
    ],
)
def test_bad_input_raises_a_clear_error(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


# ------------------------------------------------------------------ packed_attention


def unfused(qkv, num_heads, **kwargs):
    """Split the packed heads with Tensor indexing, attend, merge (the fused op's reference)."""
    batch, steps, three_embed = qkv.shape
    head_size = three_embed // 3 // num_heads
    heads = qkv.reshape(batch, steps, 3, num_heads, head_size).transpose(2, 0, 3, 1, 4)
    y = sdpa(heads[0], heads[1], heads[2], **kwargs)
    return y.transpose(0, 2, 1, 3).reshape(batch, steps, three_embed // 3)


@pytest.mark.parametrize("window", [None, 1, 3])
def test_gradcheck_packed_attention_with_scale_and_window_across_tiles(
    monkeypatch, op_path, window
):
    monkeypatch.setattr(attention_kernels, "CAUSAL_TILE", 2)  # 7 steps: tiles of 2, 2, 2, 1
    qkv = leaf((2, 7, 12))
    fused = lambda t: F.packed_attention(t, 2, causal=True, scale=1.0, window=window)  # noqa: E731
    assert gradcheck(fused, [qkv])


@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
def test_packed_attention_with_a_window_matches_split_attend_merge(monkeypatch, dropout_p):
    monkeypatch.setattr(attention_kernels, "CAUSAL_TILE", 4)
    qkv_data = np.random.default_rng(1).standard_normal((3, 11, 24)).astype(np.float32)
    upstream = np.random.default_rng(2).standard_normal((3, 11, 8)).astype(np.float32)
    results = []
    for fn in (F.packed_attention, unfused):
        qkv = Tensor(qkv_data.copy(), requires_grad=True)
        kwargs = dict(causal=True, dropout_p=dropout_p, rng=np.random.default_rng(7))
        y = fn(qkv, 2, scale=0.5, window=3, **kwargs)
        y.backward(upstream)
        assert y.dtype == qkv.grad.dtype == np.float32
        results.append((y.data, qkv.grad))
    (y, g), (y_ref, g_ref) = results
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="causal=True"):
        F.packed_attention(Tensor(qkv_data), 2, window=3)


# ------------------------------------------------------------------ float32 throughout


def _float32_cases():
    rng = np.random.default_rng(0)

    def f32(*shape):
        return Tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=True)

    x, w = f32(2, 3, 8), f32(8)
    q, k, v = f32(2, 4, 5, 8), f32(2, 2, 5, 8), f32(2, 2, 5, 8)
    qkv = f32(2, 5, 24)
    cos, sin = F.rotary_cos_sin(np.arange(3), F.rotary_frequencies(6))
    return {
        "rms_norm": (lambda: F.rms_norm(x, w), [x, w]),
        "silu": (lambda: F.silu(x), [x]),
        "swiglu": (lambda: F.swiglu(x, x * 2.0), [x]),
        "rotary": (lambda: F.rotary(x, cos, sin), [x]),
        "rotary_interleaved": (lambda: F.rotary(x, cos, sin, interleaved=True), [x]),
        "gqa_tiles": (lambda: sdpa(q, k, v, causal=True, window=2, scale=1.0), [q, k, v]),
        "gqa_cache": (lambda: sdpa(q[:, :, -1:], k, v, causal=True, dropout_p=0.1), [q, k, v]),
        "packed_window": (lambda: F.packed_attention(qkv, 2, causal=True, window=2), [qkv]),
    }


@pytest.mark.parametrize("name", sorted(_float32_cases()))
def test_float32_in_float32_out_with_no_float64_inside(monkeypatch, op_path, name):
    """Every array an op makes and every gradient its backward returns stays float32."""
    original = Tensor.from_op.__func__
    returned = []

    def spy(cls, data, parents, backward):
        assert np.asarray(data).dtype == np.float32
        return original(cls, data, parents, lambda g: returned.append(backward(g)) or returned[-1])

    monkeypatch.setattr(Tensor, "from_op", classmethod(spy))
    fn, inputs = _float32_cases()[name]
    out = fn()
    out.backward(np.ones(out.shape, dtype=np.float32))
    assert all(g is None or g.dtype == np.float32 for grads in returned for g in grads)
    assert all(t.grad.dtype == np.float32 for t in inputs)


@pytest.mark.parametrize(
    "shapes",
    [
        ((6, 3), (6, 3), (6, 2)),  # no head axis at all
        ((4, 6, 3), (4, 6, 3), (4, 6, 2)),  # heads, no batch
        ((2, 4, 6, 3), (2, 1, 6, 3), (2, 1, 6, 2)),  # one kv head broadcast over four
        ((2, 4, 6, 3), (1, 2, 6, 3), (1, 2, 6, 2)),  # grouped, the batch broadcast
    ],
)
def test_window_and_groups_on_shapes_the_tiles_do_not_take(op_path, shapes):
    q, k, v = (leaf(shape, seed) for seed, shape in enumerate(shapes))
    fused = lambda q, k, v: sdpa(q, k, v, causal=True, window=2)  # noqa: E731
    assert gradcheck(fused, [q, k, v])
    groups = q.shape[-3] // k.shape[-3] if q.ndim > 2 and k.shape[-3] > 1 else 1
    repeated = [t.data if groups == 1 else np.repeat(t.data, groups, axis=-3) for t in (k, v)]
    allowed = band(6, 6, 2)
    want = sdpa(q, *map(Tensor, repeated), mask=allowed)
    np.testing.assert_allclose(fused(q, k, v).data, want.data, rtol=1e-12, atol=1e-14)

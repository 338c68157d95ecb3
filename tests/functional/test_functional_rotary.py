"""F.rotary_frequencies, F.rotary_cos_sin and F.rotary: transformers' own rotary classes and
apply_rotary_pos_emb as the oracle (Llama, Llama-3 scaling, GPT-NeoX partial rotary), the
interleaved layout against Meta's complex-number form, finite differences in float64, the
relative-position property, dtypes and errors."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import optional
from hypothesis import given, settings
from hypothesis import strategies as st

import glassllm.functional as F
from glassllm import Tensor, gradcheck

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,  # short: the scaled and the blended bands both occur
}


def leaf(shape, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return Tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True)


def ulps(a, b):
    return int(np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64)).max())


def llama_rotary(head_dim, theta, scaling=None):
    """transformers' LlamaRotaryEmbedding for a config with this head and rope."""
    transformers = optional("transformers")
    modeling_llama = optional("transformers.models.llama.modeling_llama")
    rope = {"rope_theta": theta, **(scaling or {"rope_type": "default"})}
    config = transformers.LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=head_dim,
        rope_parameters=rope,
        max_position_embeddings=64,
    )
    return modeling_llama.LlamaRotaryEmbedding(config)


@pytest.mark.parametrize(
    "head_dim,theta,scaling",
    [
        (64, 10000.0, None),
        (64, 100000.0, None),  # SmolLM2
        (16, 500000.0, LLAMA3),
        (32, 10000.0, {"rope_type": "linear", "factor": 4.0}),
        (128, 1000000.0, None),  # Qwen3
    ],
)
def test_frequencies_and_tables_match_transformers_llama_rotary_embedding(head_dim, theta, scaling):
    torch = optional("torch")
    reference = llama_rotary(head_dim, theta, scaling)
    ours = F.rotary_frequencies(head_dim, theta, scaling)
    theirs = reference.inv_freq.numpy()
    assert ours.dtype == np.float32 and ours.shape == (head_dim // 2,)
    assert ulps(ours, theirs) <= 1  # measured: equal bits but one entry of 64 (head 128, 1e6)
    positions = np.arange(300)
    cos, sin = F.rotary_cos_sin(positions, ours)
    cos_t, sin_t = reference(torch.zeros(1), torch.tensor(positions)[None])
    half = head_dim // 2
    assert cos.dtype == sin.dtype == np.float32 and cos.shape == (300, half)
    # the tables repeat the half twice (cat(freqs, freqs)); 1 ulp of cos/sin and of inv_freq
    np.testing.assert_allclose(cos, cos_t[0, :, :half].numpy(), rtol=0, atol=3e-7)
    np.testing.assert_allclose(sin, sin_t[0, :, half:].numpy(), rtol=0, atol=3e-7)


def test_llama3_scaling_touches_all_three_bands():
    """The test case's short original context scales and blends; Llama-3.2's 8192 also keeps
    the highest frequencies unchanged."""
    ratio = F.rotary_frequencies(16, 500000.0) / F.rotary_frequencies(16, 500000.0, LLAMA3)
    assert np.isclose(ratio, 32.0).any() and ((ratio > 1.001) & (ratio < 31.9)).any()
    llama32 = dict(LLAMA3, original_max_position_embeddings=8192)
    ratio = F.rotary_frequencies(64, 500000.0) / F.rotary_frequencies(64, 500000.0, llama32)
    assert np.isclose(ratio, 1.0).any() and np.isclose(ratio, 32.0).any()
    assert ((ratio > 1.001) & (ratio < 31.9)).any()


def test_rotary_is_transformers_apply_rotary_pos_emb_bit_for_bit():
    torch = optional("torch")
    modeling_llama = optional("transformers.models.llama.modeling_llama")
    reference = llama_rotary(16, 10000.0)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 4, 7, 16)).astype(np.float32)
    k = rng.standard_normal((2, 2, 7, 16)).astype(np.float32)
    positions = torch.arange(3, 10)[None]  # a cache of 3 already: start = 3
    cos_t, sin_t = reference(torch.zeros(1), positions)
    want_q, want_k = modeling_llama.apply_rotary_pos_emb(
        torch.tensor(q), torch.tensor(k), cos_t, sin_t
    )
    cos, sin = cos_t[0, :, :8].numpy(), sin_t[0, :, :8].numpy()
    np.testing.assert_array_equal(F.rotary(Tensor(q), cos, sin).data, want_q.numpy())
    np.testing.assert_array_equal(F.rotary(Tensor(k), cos, sin).data, want_k.numpy())
    ours_cos, ours_sin = F.rotary_cos_sin(np.arange(3, 10), F.rotary_frequencies(16))
    got = F.rotary(Tensor(q), ours_cos, ours_sin).data
    np.testing.assert_allclose(got, want_q.numpy(), rtol=0, atol=2e-6)


def test_partial_rotary_is_gpt_neox_rotary_bit_for_bit():
    torch = optional("torch")
    transformers = optional("transformers")
    neox = optional("transformers.models.gpt_neox.modeling_gpt_neox")
    config = transformers.GPTNeoXConfig(
        hidden_size=64, num_attention_heads=4, rotary_pct=0.25, max_position_embeddings=32
    )
    reference = neox.GPTNeoXRotaryEmbedding(config)
    inv_freq = F.rotary_frequencies(4, 10000.0)  # head 16, rotary_pct 0.25: 4 rotary dims
    assert ulps(inv_freq, reference.inv_freq.numpy()) == 0
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 4, 6, 16)).astype(np.float32)
    cos_t, sin_t = reference(torch.zeros(1), torch.arange(6)[None])
    want, _ = neox.apply_rotary_pos_emb(torch.tensor(q), torch.tensor(q), cos_t, sin_t)
    got = F.rotary(Tensor(q), cos_t[0, :, :2].numpy(), sin_t[0, :, :2].numpy()).data
    np.testing.assert_array_equal(got, want.numpy())
    np.testing.assert_array_equal(got[..., 4:], q[..., 4:])  # the rest pass through


def test_interleaved_is_metas_complex_rotation_and_a_permuted_half_split():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 5, 12))  # rotary dims 8 of 12
    cos, sin = F.rotary_cos_sin(np.arange(5), F.rotary_frequencies(8))
    got = F.rotary(Tensor(x), cos, sin, interleaved=True).data
    pairs = x[..., :8:2] + 1j * x[..., 1:8:2]
    rotated = pairs * (cos + 1j * sin)  # Meta's reference: x * exp(i angle)
    np.testing.assert_allclose(got[..., 0:8:2], rotated.real, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[..., 1:8:2], rotated.imag, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got[..., 8:], x[..., 8:])
    # llama.cpp's converter permutes q/k rows so that half-split pair (i, i + r/2) becomes the
    # interleaved pair (2i, 2i + 1): the two layouts agree on the permuted features
    order = np.stack([np.arange(4), np.arange(4) + 4], axis=-1).reshape(-1)  # 0 4 1 5 2 6 3 7
    order = np.concatenate([order, np.arange(8, 12)])
    half_split = F.rotary(Tensor(x), cos, sin).data
    np.testing.assert_array_equal(
        F.rotary(Tensor(x[..., order]), cos, sin, True).data, half_split[..., order]
    )


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [2, 4, 6])
def test_gradcheck_rotary(interleaved, rotary_dim):
    cos, sin = F.rotary_cos_sin(np.arange(2, 7), F.rotary_frequencies(rotary_dim, 7.0))
    x = leaf((2, 3, 5, 6))
    assert gradcheck(lambda x: F.rotary(x, cos, sin, interleaved), [x])
    batched = F.rotary_cos_sin(
        np.array([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]), F.rotary_frequencies(4)
    )
    batched = tuple(t[:, None] for t in batched)  # (B, 1, T, r/2): a position row per batch
    assert gradcheck(lambda x: F.rotary(x, *batched, interleaved), [x])


@settings(max_examples=20, deadline=None)
@given(p=st.integers(0, 500), s=st.integers(0, 500), shift=st.integers(0, 500))
def test_scores_depend_on_the_relative_position_only(p, s, shift):
    rng = np.random.default_rng(p * 1000 + s)
    q, k = rng.standard_normal((2, 1, 8))
    inv_freq = F.rotary_frequencies(8).astype(np.float64)

    def score(i, j):
        qc = F.rotary_cos_sin(np.array([i]), inv_freq)
        kc = F.rotary_cos_sin(np.array([j]), inv_freq)
        return float((F.rotary(Tensor(q), *qc).data * F.rotary(Tensor(k), *kc).data).sum())

    # why: the cos/sin tables are float32, so an angle at position n is off by up to ~n * 2^-24
    # radians; the score moves by at most |q| |k| times that (a fixed 2e-5 failed at 761 and 481).
    tolerance = np.linalg.norm(q) * np.linalg.norm(k) * (p + s + 2 * shift + 2) * 2.0**-23
    assert score(p, s) == pytest.approx(score(p + shift, s + shift), abs=tolerance)


def test_dtypes_are_kept_and_the_tables_are_cast_to_x():
    cos, sin = F.rotary_cos_sin(np.arange(4), F.rotary_frequencies(4))
    x32 = leaf((2, 4, 4), dtype=np.float32)
    y = F.rotary(x32, cos, sin)
    y.backward(np.ones(y.shape, np.float32))
    assert y.dtype == x32.grad.dtype == np.float32
    x64 = leaf((2, 4, 4))
    assert F.rotary(x64, cos, sin).dtype == np.float64
    assert F.rotary_cos_sin(np.arange(3), np.ones(2))[0].dtype == np.float32


@pytest.mark.parametrize(
    "call,error,words",
    [
        (lambda: F.rotary_frequencies(5), ValueError, "even"),
        (lambda: F.rotary_frequencies(8, theta=-1.0), ValueError, "theta"),
        (lambda: F.rotary_frequencies(8, scaling={"rope_type": "yarn"}), ValueError, "'yarn'"),
        (
            lambda: F.rotary_frequencies(8, scaling={"rope_type": "llama3", "factor": 8.0}),
            ValueError,
            "low_freq_factor",
        ),
        (lambda: F.rotary_frequencies(8, scaling={"rope_type": "linear"}), ValueError, "factor"),
        (lambda: F.rotary_cos_sin(np.arange(3.0), np.ones(2)), TypeError, "integers"),
        (
            lambda: F.rotary(Tensor(np.ones((3, 4))), np.ones((3, 3)), np.ones((3, 3))),
            ValueError,
            "rotary dims",
        ),
        (
            lambda: F.rotary(Tensor(np.ones((3, 4))), np.ones((2, 2)), np.ones((2, 2))),
            ValueError,
            "broadcast",
        ),
        (
            lambda: F.rotary(Tensor(np.ones((3, 4))), np.ones((3, 2)), np.ones((3, 1))),
            ValueError,
            "share",
        ),
        (
            lambda: F.rotary(Tensor(np.ones(4)), np.ones((1, 2)), np.ones((1, 2))),
            ValueError,
            "2 axes",
        ),
    ],
)
def test_bad_input_raises_a_clear_error(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


def test_interleaved_on_llama_cpp_permuted_rows_equals_half_split_on_transformers_rows():
    """llama.cpp's converter permutes the rows of W_q per head (``reshape(n_head, 2, hd // 2,
    in).swapaxes(1, 2)``); rotating its projections interleaved gives transformers' half-split
    rotation of the original projections, in the file's feature order."""
    rng = np.random.default_rng(3)
    n_head, head_dim, width = 2, 8, 5
    w = rng.standard_normal((n_head * head_dim, width))  # torch's (out, in) rows
    permuted = w.reshape(n_head, 2, head_dim // 2, width).swapaxes(1, 2).reshape(w.shape)
    x = rng.standard_normal((4, width))  # 4 positions
    cos, sin = F.rotary_cos_sin(np.arange(4), F.rotary_frequencies(head_dim))

    def heads(rows):  # (T, H * hd) -> (H, T, hd)
        return Tensor((x @ rows.T).reshape(4, n_head, head_dim).transpose(1, 0, 2))

    half_split = F.rotary(heads(w), cos, sin).data
    interleaved = F.rotary(heads(permuted), cos, sin, interleaved=True).data
    order = np.arange(head_dim).reshape(2, -1).T.reshape(-1)  # the permutation within a head
    np.testing.assert_allclose(interleaved, half_split[..., order], rtol=1e-12, atol=1e-12)

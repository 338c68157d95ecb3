"""glassllm.functional against PyTorch: forward values and gradients, float32 (~1e-5
relative) and float64 (~1e-10), on broadcasting shapes, extreme logits and the masks a
key/value cache needs. Skipped when torch is not installed."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from conftest import optional

import glassllm.functional as F
from glassllm import Tensor

torch = optional("torch")
TF = torch.nn.functional

TOLERANCES = {np.float32: dict(rtol=1e-5, atol=1e-6), np.float64: dict(rtol=1e-10, atol=1e-12)}
TORCH_DTYPES = {np.float32: torch.float32, np.float64: torch.float64}


def _causal_mask(num_queries, num_keys):
    """True where query i may attend key j <= Tk - Tq + i (aligned to the end)."""
    return np.arange(num_keys)[None, :] <= np.arange(num_queries)[:, None] + num_keys - num_queries


def _targets(shape, classes, seed=0, ignored=None):
    targets = np.random.default_rng(seed).integers(0, classes, shape)
    if ignored is not None:
        targets.flat[::3] = ignored
    return targets


RNG = np.random.default_rng(1234)
COND = RNG.random((2, 1, 4)) > 0.5
IDS = np.array([[1, 4, 1, 0], [4, 4, 2, 1]])
TARGETS = _targets((2, 3), 5)
TARGETS_IGNORED = _targets((2, 3), 5, ignored=-100)
MASK = RNG.random((2, 1, 3, 5)) > 0.4
MASK[..., 0] = True
PADDED = np.ones((2, 1, 1, 5), dtype=bool)
PADDED[0, ..., 3:] = False  # key padding, broadcast over heads and queries

# name: (glassllm fn, torch fn, input shapes, value scale)
CASES = {
    "concatenate": (
        lambda a, b: F.concatenate([a, b], axis=1),
        lambda a, b: torch.cat([a, b], dim=1),
        [(2, 3, 4), (2, 1, 4)],
        1.0,
    ),
    "stack": (
        lambda a, b: F.stack([a, b], axis=-1),
        lambda a, b: torch.stack([a, b], dim=-1),
        [(2, 3), (2, 3)],
        1.0,
    ),
    "where": (
        lambda a, b: F.where(COND, a, b),
        lambda a, b: torch.where(torch.from_numpy(COND), a, b),
        [(3, 4), (2, 3, 1)],
        1.0,
    ),
    "logsumexp": (
        lambda x: F.logsumexp(x, axis=1),
        lambda x: torch.logsumexp(x, dim=1),
        [(2, 5, 3)],
        3.0,
    ),
    "logsumexp_keepdims_tuple": (
        lambda x: F.logsumexp(x, axis=(0, 2), keepdims=True),
        lambda x: torch.logsumexp(x, dim=(0, 2), keepdim=True),
        [(2, 5, 3)],
        3.0,
    ),
    "softmax": (lambda x: F.softmax(x), lambda x: torch.softmax(x, dim=-1), [(2, 3, 7)], 3.0),
    "softmax_axis0": (
        lambda x: F.softmax(x, axis=0),
        lambda x: torch.softmax(x, dim=0),
        [(4, 3)],
        3.0,
    ),
    "log_softmax": (
        lambda x: F.log_softmax(x),
        lambda x: torch.log_softmax(x, dim=-1),
        [(2, 3, 7)],
        3.0,
    ),
    "log_softmax_axis1": (
        lambda x: F.log_softmax(x, axis=1),
        lambda x: torch.log_softmax(x, dim=1),
        [(2, 3, 7)],
        3.0,
    ),
    "cross_entropy": (
        lambda z: F.cross_entropy(z, TARGETS),
        lambda z: TF.cross_entropy(z.reshape(-1, 5), torch.from_numpy(TARGETS).reshape(-1)),
        [(2, 3, 5)],
        3.0,
    ),
    "cross_entropy_ignore": (
        lambda z: F.cross_entropy(z, TARGETS_IGNORED, ignore_index=-100),
        lambda z: TF.cross_entropy(
            z.reshape(-1, 5), torch.from_numpy(TARGETS_IGNORED).reshape(-1), ignore_index=-100
        ),
        [(2, 3, 5)],
        3.0,
    ),
    "gelu_tanh": (lambda x: F.gelu(x), lambda x: TF.gelu(x, approximate="tanh"), [(3, 17)], 3.0),
    "gelu_none": (lambda x: F.gelu(x, approximate="none"), lambda x: TF.gelu(x), [(3, 17)], 3.0),
    "relu": (F.relu, torch.relu, [(3, 17)], 1.0),
    "layer_norm": (
        lambda x, w, b: F.layer_norm(x, w, b),
        lambda x, w, b: TF.layer_norm(x, (6,), w, b, eps=1e-5),
        [(2, 3, 6), (6,), (6,)],
        2.0,
    ),
    "layer_norm_no_affine": (
        lambda x: F.layer_norm(x, eps=1e-3),
        lambda x: TF.layer_norm(x, (6,), eps=1e-3),
        [(4, 6)],
        2.0,
    ),
    "embedding": (
        lambda w: F.embedding(IDS, w),
        lambda w: TF.embedding(torch.from_numpy(IDS), w),
        [(5, 3)],
        1.0,
    ),
    "linear": (
        lambda x, w, b: F.linear(x, w, b),
        lambda x, w, b: TF.linear(x, w.T, b),
        [(2, 3, 4), (4, 5), (5,)],
        1.0,
    ),
    "linear_1d_no_bias": (lambda x, w: F.linear(x, w), lambda x, w: x @ w, [(4,), (4, 5)], 1.0),
    "attention": (
        F.scaled_dot_product_attention,
        TF.scaled_dot_product_attention,
        [(2, 2, 5, 4), (2, 2, 5, 4), (2, 2, 5, 3)],
        1.0,
    ),
    "attention_causal": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=True),
        lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, is_causal=True),
        [(2, 2, 5, 4), (2, 2, 5, 4), (2, 2, 5, 3)],
        1.0,
    ),
    "attention_kv_cache": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=True),
        lambda q, k, v: TF.scaled_dot_product_attention(
            q, k, v, attn_mask=torch.from_numpy(_causal_mask(3, 5))
        ),
        [(2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 3)],
        1.0,
    ),
    "attention_mask": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, mask=MASK),
        lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, attn_mask=torch.from_numpy(MASK)),
        [(2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 3)],
        1.0,
    ),
    "attention_padding_and_causal": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=True, mask=PADDED),
        lambda q, k, v: TF.scaled_dot_product_attention(
            q, k, v, attn_mask=torch.from_numpy(PADDED & _causal_mask(5, 5))
        ),
        [(2, 2, 5, 4), (2, 2, 5, 4), (2, 2, 5, 3)],
        1.0,
    ),
}


def _compare(ours, theirs, arrays, dtype, tol=None, exact_reference=False):
    """Run both sides on the same ``dtype`` inputs and compare values and gradients.

    ``exact_reference``: torch computes in float64 on the ``dtype``-rounded inputs, the exact
    answer for those inputs. Used at logits of 1e4, where float32's own rounding of an
    output such as ``logsumexp`` (ulp 1e-3) makes torch's float32 gradient ``exp(x - lse)``
    off by ~1e-4 relative, while max-subtraction keeps ours exact to ~1e-7.
    """
    tol = tol or TOLERANCES[dtype]
    rounded = [a.astype(dtype) for a in arrays]
    glass = [Tensor(a, requires_grad=True) for a in rounded]
    ref_dtype = np.float64 if exact_reference else dtype
    ref = [torch.tensor(a.astype(ref_dtype), requires_grad=True) for a in rounded]
    out, expected = ours(*glass), theirs(*ref)
    assert out.dtype == dtype and out.shape == tuple(expected.shape)
    np.testing.assert_allclose(out.data, expected.detach().numpy(), **tol, err_msg="forward")
    seed = np.random.default_rng(7).standard_normal(out.shape).astype(dtype)
    out.backward(seed)
    expected.backward(torch.from_numpy(seed.astype(ref_dtype)))
    for i, (g, t) in enumerate(zip(glass, ref, strict=True)):
        assert g.grad.dtype == dtype
        np.testing.assert_allclose(g.grad, t.grad.numpy(), **tol, err_msg=f"gradient of input {i}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_torch(name, dtype):
    ours, theirs, shapes, scale = CASES[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    arrays = [rng.standard_normal(shape) * scale for shape in shapes]
    _compare(ours, theirs, arrays, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize(
    "name", ["softmax", "log_softmax", "logsumexp", "cross_entropy", "cross_entropy_ignore"]
)
def test_matches_torch_at_logits_of_magnitude_1e4(name, dtype):
    ours, theirs, shapes, _ = CASES[name]
    rng = np.random.default_rng(3)
    arrays = [rng.choice([-1e4, 1e4], shape) + rng.standard_normal(shape) for shape in shapes]
    _compare(ours, theirs, arrays, dtype, exact_reference=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_attention_matches_torch_at_large_scores(dtype):
    """Scores of order 1e3: float32 rounds each score by ~1e-4, which moves the weights by as
    much, whoever computes them; so float32 is held to 1e-3 of the gradient scale."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 2, 4, 8)) * 15.0
    k = rng.standard_normal((1, 2, 4, 8)) * 15.0
    v = rng.standard_normal((1, 2, 4, 8))
    ours, theirs, _, _ = CASES["attention_causal"]
    tol = dict(rtol=1e-3, atol=1e-3) if dtype == np.float32 else None
    _compare(ours, theirs, [q, k, v], dtype, tol=tol, exact_reference=True)


def test_gelu_exact_matches_torch_over_the_whole_range_in_float64():
    x = np.linspace(-12.0, 12.0, 2401)
    ours, theirs, _, _ = CASES["gelu_none"]
    glass, ref = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out, expected = ours(glass), theirs(ref)
    out.backward(np.ones_like(x))
    expected.backward(torch.ones_like(ref))
    # torch forms 1 + erf(x/sqrt 2), which cancels for x << 0; hence the absolute floor
    np.testing.assert_allclose(out.data, expected.detach().numpy(), rtol=1e-10, atol=1e-15)
    np.testing.assert_allclose(glass.grad, ref.grad.numpy(), rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(
        F.erf(x), torch.special.erf(torch.from_numpy(x)).numpy(), rtol=1e-15, atol=0
    )


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_follows_torch_semantics(p):
    """Masks differ (different generators); the scaling, keep rate and gradient rule agree."""
    x = np.ones((100, 100), dtype=np.float32)
    ours = Tensor(x, requires_grad=True)
    ref = torch.tensor(x, requires_grad=True)
    out = F.dropout(ours, p, rng=np.random.default_rng(0))
    expected = TF.dropout(ref, p, training=True)
    np.testing.assert_allclose(np.unique(out.data), np.unique(expected.detach().numpy()), rtol=1e-7)
    assert abs((out.data == 0).mean() - p) < 0.03
    out.backward(np.ones_like(x))
    expected.backward(torch.ones_like(ref))
    np.testing.assert_array_equal(ours.grad, out.data)  # d(x * m)/dx = m, as torch's
    np.testing.assert_array_equal(ref.grad.numpy(), expected.detach().numpy())
    assert F.dropout(ours, p, training=False).data is x

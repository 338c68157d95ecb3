"""Cases where the exact convention matters, checked against PyTorch: ties in
max/min (torch.amax/amin split evenly), kinks at zero, repeated indices, and
a small float32 network end to end. The op-by-op catalogue against torch lives
in test_tensor_ops.py."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import optional

from glassllm import Tensor

torch = optional("torch")

TIES = np.array(
    [
        [[2.0, 2.0, 1.0], [3.0, 3.0, 3.0]],
        [[-1.0, 0.5, 0.5], [4.0, -4.0, 4.0]],
    ]
)


def _compare(fn, torch_fn, arrays, upstream_seed=0, rtol=1e-10, atol=1e-12):
    ours = [Tensor(np.array(a), requires_grad=True) for a in arrays]
    theirs = [torch.tensor(np.array(a), requires_grad=True) for a in arrays]
    out, out_t = fn(*ours), torch_fn(*theirs)
    np.testing.assert_allclose(out.data, out_t.detach().numpy(), rtol=rtol, atol=atol)
    upstream = np.random.default_rng(upstream_seed).standard_normal(out.shape).astype(out.dtype)
    out.backward(upstream)
    out_t.backward(torch.tensor(upstream))
    for i, (x, x_t) in enumerate(zip(ours, theirs, strict=True)):
        np.testing.assert_allclose(
            x.grad, x_t.grad.numpy(), rtol=rtol, atol=atol, err_msg=f"input {i}"
        )
    return ours


@pytest.mark.parametrize("name", ["max", "min"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 2), (1, 2), (0, 1, 2)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_ties_split_evenly_like_amax_amin(name, axis, keepdims):
    def torch_fn(t):
        reduce = torch.amax if name == "max" else torch.amin
        dims = tuple(range(t.dim())) if axis is None else axis
        return reduce(t, dim=dims, keepdim=keepdims)

    _compare(lambda t: getattr(t, name)(axis=axis, keepdims=keepdims), torch_fn, [TIES])


def test_all_equal_entries_share_the_gradient():
    (x,) = _compare(lambda t: t.max(), lambda t: torch.amax(t), [np.full((2, 2), 3.0)])
    np.testing.assert_allclose(
        x.grad.sum(), np.asarray(np.random.default_rng(0).standard_normal(()))
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_and_abs_at_exactly_zero(dtype):
    x = np.array([-1.0, 0.0, 2.0, -0.0], dtype=dtype)
    (t,) = _compare(lambda t: t.relu(), torch.relu, [x])
    np.testing.assert_array_equal(t.grad != 0, [False, False, True, False])
    _compare(lambda t: t.abs(), torch.abs, [x])


def test_relu_of_infinities_and_nan_like_torch():
    x = np.array([-np.inf, -1.0, 0.0, 2.0, np.inf])
    _compare(lambda t: t.relu(), torch.relu, [x])
    y = Tensor(np.array([np.nan, 1.0])).relu().data
    np.testing.assert_array_equal(
        np.isnan(y), torch.relu(torch.tensor([np.nan, 1.0])).isnan().numpy()
    )


def test_power_at_zero_base_like_torch():
    base = np.array([0.0, 0.0, 0.0, 1.5, 0.0])
    exponent = np.array([0.0, 1.0, 2.0, 0.0, 3.5])
    _compare(lambda a, b: a**b, lambda a, b: a**b, [base, exponent])
    _compare(lambda a: a**0.0, lambda a: a**0.0, [base])
    _compare(lambda a: a**2.0, lambda a: a**2.0, [base])


def test_relu_gradient_at_zero_is_zero_with_default_seed():
    x = Tensor(np.array([0.0, 0.0]), requires_grad=True)
    x.relu().sum().backward()
    np.testing.assert_array_equal(x.grad, [0.0, 0.0])


@pytest.mark.parametrize(
    "index",
    [
        np.array([0, 2, 0, 0, 1]),
        np.array([[1, 1], [1, 1]]),
        (np.array([0, 0, 2]), np.array([1, 1, 1])),
        (slice(None), np.array([3, 3, 0])),
    ],
    ids=["1-d", "2-d", "pairs", "columns"],
)
def test_repeated_indices_accumulate_like_torch(index):
    def torch_index(i):
        if isinstance(i, tuple):
            return tuple(torch.as_tensor(p) if isinstance(p, np.ndarray) else p for p in i)
        return torch.as_tensor(i)

    x = np.arange(12.0).reshape(3, 4)
    _compare(lambda t: t[index], lambda t: t[torch_index(index)], [x])


def test_embedding_style_lookup_accumulates():
    weight = np.random.default_rng(0).standard_normal((5, 3))
    ids = np.array([[1, 4, 1], [1, 0, 4]])
    (w,) = _compare(lambda w: w[ids] * 2.0, lambda w: w[torch.as_tensor(ids)] * 2.0, [weight])
    assert np.all(w.grad[[2, 3]] == 0.0)


@pytest.mark.parametrize("dtype,rtol,atol", [(np.float32, 1e-5, 1e-6), (np.float64, 1e-10, 1e-12)])
def test_two_layer_network_end_to_end(dtype, rtol, atol):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 5)).astype(dtype)
    w1 = (rng.standard_normal((5, 8)) * 0.4).astype(dtype)
    b1 = np.zeros(8, dtype=dtype)
    w2 = (rng.standard_normal((8, 3)) * 0.4).astype(dtype)

    def ours(x, w1, b1, w2):
        h = (x @ w1 + b1).tanh()
        logits = h @ w2
        shifted = logits - logits.max(axis=-1, keepdims=True)
        logp = shifted - shifted.exp().sum(axis=-1, keepdims=True).log()
        return -(logp[np.arange(4), np.array([0, 2, 1, 2])]).mean() + 0.01 * (w1 * w1).sum()

    def theirs(x, w1, b1, w2):
        logits = torch.tanh(x @ w1 + b1) @ w2
        logp = torch.log_softmax(logits, dim=-1)
        return -(logp[torch.arange(4), torch.tensor([0, 2, 1, 2])]).mean() + 0.01 * (w1 * w1).sum()

    grads = _compare(ours, theirs, [x, w1, b1, w2], rtol=rtol, atol=atol)
    assert all(g.grad.dtype == dtype for g in grads)


def test_batched_matmul_with_broadcast_batch_and_vectors():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 1, 3, 4))
    b = rng.standard_normal((5, 4, 2))
    v = rng.standard_normal(4)
    _compare(lambda a, b: a @ b, lambda a, b: a @ b, [a, b])
    _compare(lambda a, v: a @ v, lambda a, v: a @ v, [a, v])
    _compare(lambda v, b: v @ b, lambda v, b: v @ b, [v, b])


def test_var_is_population_variance():
    x = np.random.default_rng(4).standard_normal((3, 4))
    _compare(lambda t: t.var(axis=1), lambda t: torch.var(t, dim=1, correction=0), [x])
    np.testing.assert_allclose(Tensor(x).var(axis=1).data, np.var(x, axis=1))

"""Layers: construction, forward values, gradients (finite differences in float64), dtypes,
and PyTorch as an oracle when installed (Linear weights transposed, as documented)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import optional
from hypothesis import given, settings
from hypothesis import strategies as st

import glassllm
import glassllm.nn as nn
from glassllm import Tensor, gradcheck


def rand(rng: np.random.Generator, *shape: int, dtype=np.float64, grad: bool = True) -> Tensor:
    return Tensor(rng.standard_normal(shape, dtype=dtype), requires_grad=grad)


def gradcheck_module(module: nn.Module, *inputs: Tensor) -> None:
    """Finite differences w.r.t. the inputs and every parameter (gradcheck perturbs in place)."""
    params = list(module.parameters())
    assert all(p.dtype == np.float64 for p in params)
    assert gradcheck(lambda *tensors: module(*tensors[: len(inputs)]), [*inputs, *params])


def torch_tensor(torch, array: np.ndarray, grad: bool = False):
    return torch.tensor(array, requires_grad=grad)


# ----------------------------------------------------------------------------- Linear


def test_linear_shapes_init_bounds_dtype_and_reproducibility():
    layer = nn.Linear(64, 8, rng=np.random.default_rng(0))
    assert layer.weight.shape == (64, 8) and layer.bias.shape == (8,)
    assert layer.weight.dtype == layer.bias.dtype == np.float32
    bound = 1.0 / math.sqrt(64)
    assert np.abs(layer.weight.data).max() <= bound and np.abs(layer.bias.data).max() <= bound
    assert np.abs(layer.weight.data).max() > 0.9 * bound  # spans the interval, not a narrower one
    assert abs(layer.weight.data.std() - bound / math.sqrt(3.0)) < 0.1 * bound  # U(-b, b)
    again = nn.Linear(64, 8, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(layer.weight.data, again.weight.data)
    glassllm.manual_seed(5)
    first = nn.Linear(3, 2).weight.data
    glassllm.manual_seed(5)
    np.testing.assert_array_equal(first, nn.Linear(3, 2).weight.data)
    assert nn.Linear(3, 2, bias=False).bias is None
    assert nn.Linear(3, 2, dtype=np.float64).weight.dtype == np.float64


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"in_features": 0, "out_features": 2}, ValueError),
        ({"in_features": 2.5, "out_features": 2}, ValueError),
        ({"in_features": 2, "out_features": 2, "dtype": np.int32}, TypeError),
        ({"in_features": 2, "out_features": 2, "rng": 0}, TypeError),
    ],
)
def test_linear_rejects_bad_arguments(kwargs, error):
    with pytest.raises(error):
        nn.Linear(**kwargs)


def test_linear_forward_is_x_at_weight_plus_bias_and_keeps_float32():
    rng = np.random.default_rng(1)
    layer = nn.Linear(3, 4, rng=rng)
    x = rng.standard_normal((2, 5, 3), dtype=np.float32)
    out = layer(Tensor(x, requires_grad=True))
    np.testing.assert_allclose(out.data, x @ layer.weight.data + layer.bias.data, rtol=1e-6)
    assert out.dtype == np.float32
    out.sum().backward()
    assert layer.weight.grad.dtype == layer.bias.grad.dtype == np.float32


@settings(max_examples=25, deadline=None)
@given(
    leading=st.lists(st.integers(1, 3), max_size=3),
    in_features=st.integers(1, 4),
    out_features=st.integers(1, 4),
    bias=st.booleans(),
)
def test_linear_maps_any_leading_shape(leading, in_features, out_features, bias):
    layer = nn.Linear(in_features, out_features, bias=bias, rng=np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((*leading, in_features), dtype=np.float32)
    out = layer(Tensor(x))
    assert out.shape == (*leading, out_features) and out.dtype == np.float32
    expected = x @ layer.weight.data + (layer.bias.data if bias else 0.0)
    np.testing.assert_allclose(out.data, expected, rtol=1e-5, atol=1e-6)


def test_linear_gradcheck():
    rng = np.random.default_rng(2)
    gradcheck_module(nn.Linear(3, 2, dtype=np.float64, rng=rng), rand(rng, 2, 4, 3))
    gradcheck_module(nn.Linear(3, 2, bias=False, dtype=np.float64, rng=rng), rand(rng, 5, 3))


def test_linear_matches_torch_with_transposed_weight():
    torch = optional("torch")
    rng = np.random.default_rng(3)
    layer = nn.Linear(4, 3, dtype=np.float64, rng=rng)
    reference = torch.nn.Linear(4, 3, dtype=torch.float64)
    with torch.no_grad():
        reference.weight.copy_(torch.from_numpy(layer.weight.data.T))  # torch stores (out, in)
        reference.bias.copy_(torch.from_numpy(layer.bias.data))
    x = rng.standard_normal((2, 4))
    out = layer(Tensor(x))
    expected = reference(torch.from_numpy(x))
    np.testing.assert_allclose(out.data, expected.detach().numpy(), rtol=1e-12)
    upstream = rng.standard_normal((2, 3))
    out.backward(upstream)
    expected.backward(torch.from_numpy(upstream))
    np.testing.assert_allclose(layer.weight.grad, reference.weight.grad.numpy().T, rtol=1e-12)
    np.testing.assert_allclose(layer.bias.grad, reference.bias.grad.numpy(), rtol=1e-12)


# ----------------------------------------------------------------------------- Embedding


def test_embedding_lookup_init_and_repeated_ids():
    table = nn.Embedding(200, 50, rng=np.random.default_rng(4))
    assert table.weight.shape == (200, 50) and table.weight.dtype == np.float32
    assert abs(table.weight.data.mean()) < 0.02 and abs(table.weight.data.std() - 1.0) < 0.02
    ids = np.array([[3, 1, 3], [3, 0, 2]])
    out = table(ids)
    assert out.shape == (2, 3, 50) and out.dtype == np.float32
    np.testing.assert_array_equal(out.data, table.weight.data[ids])
    out.sum().backward()
    counts = np.bincount(ids.ravel(), minlength=200).astype(np.float32)
    np.testing.assert_array_equal(table.weight.grad, np.repeat(counts[:, None], 50, axis=1))
    with pytest.raises((IndexError, ValueError)):
        table(np.array([200]))


def test_embedding_gradcheck_and_torch():
    rng = np.random.default_rng(5)
    table = nn.Embedding(6, 3, dtype=np.float64, rng=rng)
    ids = np.array([[1, 5, 1], [0, 1, 5]])
    assert gradcheck(lambda weight: table(ids), [table.weight])
    torch = optional("torch")
    reference = torch.nn.Embedding(6, 3, dtype=torch.float64)
    with torch.no_grad():
        reference.weight.copy_(torch.from_numpy(table.weight.data))
    upstream = rng.standard_normal((2, 3, 3))
    table(ids).backward(upstream)
    reference(torch.from_numpy(ids)).backward(torch.from_numpy(upstream))
    np.testing.assert_allclose(table.weight.grad, reference.weight.grad.numpy(), rtol=1e-12)


# ----------------------------------------------------------------------------- LayerNorm


def test_layer_norm_init_forward_and_bias_free():
    norm = nn.LayerNorm(5)
    assert norm.weight.data.tolist() == [1.0] * 5 and norm.bias.data.tolist() == [0.0] * 5
    assert norm.weight.dtype == np.float32
    x = np.random.default_rng(6).standard_normal((3, 5), dtype=np.float32) * 4.0 + 2.0
    y = norm(Tensor(x)).data
    assert y.dtype == np.float32
    np.testing.assert_allclose(y.mean(axis=-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(y.var(axis=-1), 1.0, rtol=1e-3)
    assert nn.LayerNorm(5, bias=False).bias is None
    assert [n for n, _ in nn.LayerNorm(5, bias=False).named_parameters()] == ["weight"]
    with pytest.raises(ValueError, match="eps"):
        nn.LayerNorm(5, eps=0.0)


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_gradcheck_and_torch(bias):
    rng = np.random.default_rng(7)
    norm = nn.LayerNorm(4, bias=bias, dtype=np.float64)
    norm.weight.data[...] = rng.standard_normal(4)
    if bias:
        norm.bias.data[...] = rng.standard_normal(4)
    x = rand(rng, 2, 3, 4)
    gradcheck_module(norm, x)
    torch = optional("torch")
    reference = torch.nn.LayerNorm(4, bias=bias, dtype=torch.float64)
    with torch.no_grad():
        reference.weight.copy_(torch.from_numpy(norm.weight.data))
        if bias:
            reference.bias.copy_(torch.from_numpy(norm.bias.data))
    x.grad = None
    norm.zero_grad()
    tx = torch_tensor(torch, x.data, grad=True)
    upstream = rng.standard_normal((2, 3, 4))
    out, expected = norm(x), reference(tx)
    np.testing.assert_allclose(out.data, expected.detach().numpy(), rtol=1e-10, atol=1e-12)
    out.backward(upstream)
    expected.backward(torch.from_numpy(upstream))
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(norm.weight.grad, reference.weight.grad.numpy(), rtol=1e-9)
    if bias:
        np.testing.assert_allclose(norm.bias.grad, reference.bias.grad.numpy(), rtol=1e-9)


# ----------------------------------------------------------------------------- activations


@pytest.mark.parametrize(
    "module, torch_name",
    [
        (nn.GELU(), "gelu_tanh"),
        (nn.GELU(approximate="none"), "gelu"),
        (nn.ReLU(), "relu"),
        (nn.Tanh(), "tanh"),
    ],
)
def test_activations_gradcheck_dtype_and_torch(module, torch_name):
    rng = np.random.default_rng(8)
    x = Tensor(rng.standard_normal((3, 4)) + 0.05, requires_grad=True)  # keep off relu's kink
    assert gradcheck(module, [x])
    assert module(Tensor(x.data.astype(np.float32))).dtype == np.float32
    torch = optional("torch")
    reference = {
        "gelu_tanh": torch.nn.GELU(approximate="tanh"),
        "gelu": torch.nn.GELU(),
        "relu": torch.nn.ReLU(),
        "tanh": torch.nn.Tanh(),
    }[torch_name]
    tx = torch_tensor(torch, x.data, grad=True)
    expected = reference(tx)
    out = module(x)
    np.testing.assert_allclose(out.data, expected.detach().numpy(), rtol=1e-12, atol=1e-15)
    x.grad = None
    out.sum().backward()
    expected.sum().backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), rtol=1e-10, atol=1e-15)


def test_gelu_rejects_unknown_approximation():
    with pytest.raises(ValueError, match="approximate"):
        nn.GELU(approximate="fast")


# ----------------------------------------------------------------------------- Dropout


def test_dropout_statistics_scaling_and_gradient():
    drop = nn.Dropout(0.25, rng=np.random.default_rng(9))
    x = Tensor(np.ones((200, 200), dtype=np.float32), requires_grad=True)
    out = drop(x)
    assert out.dtype == np.float32
    kept = out.data != 0
    assert abs(kept.mean() - 0.75) < 0.01  # 40,000 draws: std of the mean ~0.002
    np.testing.assert_allclose(out.data[kept], 1.0 / 0.75, rtol=1e-6)
    out.sum().backward()
    np.testing.assert_array_equal(x.grad, out.data)  # d(x * mask/(1-p))/dx = mask/(1-p)


def test_dropout_identity_in_eval_and_at_p_zero():
    x = Tensor(np.random.default_rng(10).standard_normal((4, 5)))
    drop = nn.Dropout(0.5)
    drop.eval()
    np.testing.assert_array_equal(drop(x).data, x.data)
    np.testing.assert_array_equal(nn.Dropout(0.0)(x).data, x.data)
    net = nn.Sequential(nn.Linear(5, 5), nn.Dropout(0.9))
    net.eval()
    assert not net[1].training
    np.testing.assert_array_equal(net(x).data, net[0](x).data)


def test_dropout_reproducible_with_manual_seed_or_rng():
    x = Tensor(np.ones((8, 8)))
    drop = nn.Dropout(0.5)  # default rng: read at call time, so manual_seed afterwards counts
    glassllm.manual_seed(3)
    first = drop(x).data
    glassllm.manual_seed(3)
    np.testing.assert_array_equal(first, drop(x).data)
    assert not np.array_equal(first, drop(x).data)  # the generator moved on
    a = nn.Dropout(0.5, rng=np.random.default_rng(1))(x).data
    b = nn.Dropout(0.5, rng=np.random.default_rng(1))(x).data
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("p", [-0.1, 1.5, float("nan")])
def test_dropout_rejects_bad_probability(p):
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        nn.Dropout(p)
    with pytest.raises(TypeError):
        nn.Dropout("0.1")


def test_dropout_one_drops_everything():
    x = Tensor(np.ones((3, 3), dtype=np.float32), requires_grad=True)
    out = nn.Dropout(1.0)(x)
    out.sum().backward()
    np.testing.assert_array_equal(out.data, 0.0)
    np.testing.assert_array_equal(x.grad, 0.0)

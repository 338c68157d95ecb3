"""GPTConfig validation, GPT structure, initialisation, forward, training behaviour."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import glassllm.nn as nn
from glassllm import Tensor
from glassllm.models import GPT, GPTConfig
from glassllm.models.gpt import parameter_shapes, size_problems

TINY = dict(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8)


def tiny_model(seed: int = 0, **overrides) -> GPT:
    return GPT(GPTConfig(**{**TINY, **overrides}), rng=np.random.default_rng(seed))


def batch(rng: np.random.Generator, B: int = 2, T: int = 8, vocab: int = 13):
    idx = rng.integers(0, vocab, size=(B, T))
    targets = rng.integers(0, vocab, size=(B, T))
    return idx, targets


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("vocab_size", 0, "vocab_size must be positive"),
        ("block_size", -1, "block_size must be positive"),
        ("n_layer", 0, "n_layer must be positive"),
        ("n_head", 0, "n_head must be positive"),
        ("n_embd", 2.5, "n_embd must be an integer"),
        ("n_layer", True, "n_layer must be an integer"),
        ("n_embd", 9, r"n_embd \(9\) must be divisible by n_head \(2\)"),
        ("dropout", 1.0, r"dropout must be in \[0, 1\)"),
        ("dropout", -0.1, r"dropout must be in \[0, 1\)"),
        ("bias", "yes", "bias must be True or False"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**{**TINY, field: value})


def test_config_round_trips_through_dict():
    config = GPTConfig(**TINY, dropout=0.1, bias=True)
    as_dict = config.to_dict()
    assert as_dict == {**TINY, "dropout": 0.1, "bias": True}
    assert GPTConfig.from_dict(as_dict) == config


def test_config_from_dict_rejects_unknown_and_missing_keys():
    with pytest.raises(ValueError, match=r"unknown GPTConfig keys \['n_heads'\]"):
        GPTConfig.from_dict({**TINY, "n_heads": 2})
    partial = dict(TINY)
    del partial["n_embd"]
    with pytest.raises(ValueError, match=r"missing required keys \['n_embd'\]"):
        GPTConfig.from_dict(partial)
    with pytest.raises(TypeError, match="expects a mapping, got list"):
        GPTConfig.from_dict([("vocab_size", 13)])


# ----------------------------------------------------------------------------- structure


def expected_names(n_layer: int, bias: bool) -> list[str]:
    def with_bias(prefix: str) -> list[str]:
        return [f"{prefix}.weight"] + ([f"{prefix}.bias"] if bias else [])

    names = ["wte.weight", "wpe.weight"]
    for i in range(n_layer):
        b = f"blocks.{i}"
        names += with_bias(f"{b}.ln_1") + with_bias(f"{b}.attn.qkv") + with_bias(f"{b}.attn.proj")
        names += with_bias(f"{b}.ln_2") + with_bias(f"{b}.mlp.fc") + with_bias(f"{b}.mlp.proj")
    return names + with_bias("ln_f")


@pytest.mark.parametrize("bias", [False, True])
def test_parameter_names_shapes_and_count(bias):
    model = tiny_model(bias=bias)
    named = dict(model.named_parameters())
    assert sorted(named) == sorted(expected_names(2, bias))
    V, T, E = 13, 8, 8
    assert named["wte.weight"].shape == (V, E)
    assert named["wpe.weight"].shape == (T, E)
    assert named["blocks.1.attn.qkv.weight"].shape == (E, 3 * E)
    assert named["blocks.1.attn.proj.weight"].shape == (E, E)
    assert named["blocks.0.mlp.fc.weight"].shape == (E, 4 * E)
    assert named["blocks.0.mlp.proj.weight"].shape == (4 * E, E)
    # per block: qkv 3E², attn proj E², fc 4E², mlp proj 4E²; two LayerNorms (weight, + bias) and,
    # with bias, the Linear biases 3E + E + 4E + E
    per_block = 12 * E * E + (2 * 2 * E + 9 * E if bias else 2 * E)
    total = V * E + T * E + 2 * per_block + (2 * E if bias else E)
    assert model.num_parameters() == total
    assert model.num_parameters(non_embedding=True) == total - T * E


@pytest.mark.parametrize("bias", [False, True])
def test_parameter_shapes_is_the_models_own_table(bias):
    model = tiny_model(bias=bias)
    built = [(name, p.shape) for name, p in model.named_parameters()]
    assert list(parameter_shapes(model.config).items()) == built  # names, shapes and order
    assert [name for name, _ in built] == expected_names(2, bias)
    with_bias = parameter_shapes(model.config, bias=True)
    assert list(with_bias) == expected_names(2, True)


def test_size_problems_hold_a_configuration_to_the_files_tensors():
    config = tiny_model().config  # V 13, T 8, E 8, 2 blocks
    shapes = parameter_shapes(config)
    assert size_problems(shapes, config) == []
    bigger = GPTConfig(vocab_size=10**9, block_size=8, n_layer=1024, n_head=2, n_embd=8)
    assert size_problems(shapes, bigger, "model_config", keys={"block_size": "n_positions"}) == [
        "model_config has n_layer=1024 but the weights hold 2 blocks",
        "wte.weight has shape (13, 8), where model_config's vocab_size=1000000000 and n_embd=8 "
        "need (1000000000, 8)",
    ]
    shapes.pop("wpe.weight")
    assert size_problems(shapes, config, "config.json", keys={"block_size": "n_positions"}) == [
        "missing tensors: wpe.weight (where config.json's n_positions=8 and n_embd=8 need (8, 8))"
    ]


def test_output_head_is_tied_to_token_embedding():
    model = tiny_model()
    params = list(model.parameters())
    assert sum(p is model.wte.weight for p in params) == 1
    assert not any(name.startswith("lm_head") for name, _ in model.named_parameters())


def test_tied_weight_gradient_sums_embedding_and_head_uses():
    """Token 12 never appears in idx, so its wte row gets gradient only through the head; a row that
    appears gets both. The sum is checked against the two paths computed separately."""
    model = tiny_model(seed=1)
    rng = np.random.default_rng(1)
    idx = rng.integers(0, 12, size=(2, 8))
    targets = rng.integers(0, 12, size=(2, 8))
    _, loss = model(idx, targets)
    loss.backward()
    tied = model.wte.weight.grad.copy()
    assert np.abs(tied[12]).max() > 0  # head-only row

    # Untie by hand: a frozen copy feeds the head, so wte.grad holds only the embedding path.
    import glassllm.functional as F

    model.zero_grad()
    frozen = Tensor(model.wte.weight.data.copy())
    x = model.hidden_states(idx)
    loss_embedding_only = F.cross_entropy(F.linear(x, frozen.transpose(1, 0)), targets)
    loss_embedding_only.backward()
    embedding_path = model.wte.weight.grad.copy()
    assert np.all(embedding_path[12] == 0)

    model.zero_grad()
    head = Tensor(model.wte.weight.data.copy(), requires_grad=True)
    with_frozen_embedding = F.cross_entropy(F.linear(x, head.transpose(1, 0)), targets)
    with_frozen_embedding.backward()
    np.testing.assert_allclose(tied, embedding_path + head.grad, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- initialisation


def test_gpt2_initialisation_statistics():
    config = GPTConfig(vocab_size=64, block_size=32, n_layer=4, n_head=4, n_embd=64, bias=True)
    model = GPT(config, rng=np.random.default_rng(0))
    residual_std = 0.02 / math.sqrt(2 * config.n_layer)
    for name, p in model.named_parameters():
        assert p.dtype == np.float32, name
        if name.endswith(("attn.proj.weight", "mlp.proj.weight")):
            assert abs(p.data.std() / residual_std - 1) < 0.1, name
            assert abs(p.data.mean()) < 0.2 * residual_std, name
        elif p.ndim == 2:
            assert abs(p.data.std() / 0.02 - 1) < 0.1, name
            assert abs(p.data.mean()) < 0.004, name
        elif "ln" in name and name.endswith("weight"):
            assert np.all(p.data == 1), name
        else:
            assert np.all(p.data == 0), name


def test_initialisation_follows_the_rng():
    a, b, c = tiny_model(seed=3), tiny_model(seed=3), tiny_model(seed=4)
    for (name, pa), pb, pc in zip(
        a.named_parameters(), b.parameters(), c.parameters(), strict=True
    ):
        np.testing.assert_array_equal(pa.data, pb.data, err_msg=name)
        if pa.ndim == 2:
            assert not np.array_equal(pa.data, pc.data), name


def test_loss_at_initialisation_is_close_to_uniform():
    config = GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32)
    model = GPT(config, rng=np.random.default_rng(0))
    idx, targets = batch(np.random.default_rng(0), B=4, T=16, vocab=50)
    _, loss = model(idx, targets)
    assert abs(float(loss.data) - math.log(50)) < 0.05


# ----------------------------------------------------------------------------- forward


def test_forward_shapes_with_and_without_targets():
    model = tiny_model()
    idx, targets = batch(np.random.default_rng(0), B=3, T=5)
    logits, loss = model(idx, targets[:, :5])
    assert logits.shape == (3, 5, 13) and logits.dtype == np.float32
    assert loss.shape == () and loss.dtype == np.float32
    logits_only, none = model(idx)
    assert none is None
    np.testing.assert_array_equal(logits_only.data, logits.data)


SHAPE_MODEL = GPT(GPTConfig(**TINY), rng=np.random.default_rng(0))


@settings(max_examples=25, deadline=None)
@given(B=st.integers(1, 3), T=st.integers(1, 12), with_targets=st.booleans())
def test_forward_shape_rule(B, T, with_targets):
    """Any (B, T) with T <= block_size gives (B, T, vocab) logits; longer T raises, naming both."""
    idx = np.zeros((B, T), dtype=np.int64)
    targets = idx if with_targets else None
    if T > TINY["block_size"]:
        with pytest.raises(ValueError, match=f"T={T} exceeds block_size=8"):
            SHAPE_MODEL(idx, targets)
        return
    logits, loss = SHAPE_MODEL(idx, targets)
    assert logits.shape == (B, T, 13)
    assert (loss is None) == (not with_targets)


def test_forward_is_causal():
    """Changing a later token leaves the logits of earlier positions unchanged."""
    model = tiny_model()
    idx, _ = batch(np.random.default_rng(0), B=1, T=8)
    changed = idx.copy()
    changed[0, 5] = (changed[0, 5] + 1) % 13
    a, _ = model(idx)
    b, _ = model(changed)
    np.testing.assert_array_equal(a.data[:, :5], b.data[:, :5])
    assert not np.allclose(a.data[:, 5:], b.data[:, 5:])


def test_forward_rejects_bad_input_clearly():
    model = tiny_model()
    with pytest.raises(ValueError, match="T=9 exceeds block_size=8"):
        model(np.zeros((1, 9), dtype=np.int64))
    with pytest.raises(ValueError, match=r"shape \(B, T\)"):
        model(np.zeros(4, dtype=np.int64))
    with pytest.raises(ValueError, match="integer token ids"):
        model(np.zeros((1, 4)))
    with pytest.raises(ValueError, match=r"token id 13 is outside the vocabulary \[0, 13\)"):
        model(np.array([[1, 13]]))
    with pytest.raises(ValueError, match="targets shape"):
        model(np.array([[1, 2]]), np.array([[1, 2, 3]]))


def test_dropout_is_active_in_train_mode_only():
    model = tiny_model(dropout=0.5)
    no_dropout = tiny_model(dropout=0.0)
    no_dropout.load_state_dict(model.state_dict())
    idx, _ = batch(np.random.default_rng(0), B=2, T=8)
    a, _ = model(idx)
    b, _ = model(idx)
    assert not np.allclose(a.data, b.data)
    model.eval()
    c, _ = model(idx)
    d, _ = model(idx)
    np.testing.assert_array_equal(c.data, d.data)
    np.testing.assert_allclose(c.data, no_dropout(idx)[0].data, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- training


def test_configure_optimizer_decays_matrices_only():
    model = tiny_model(bias=True)
    optimizer = model.configure_optimizer(lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99))
    assert len(optimizer.param_groups) == 2
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    decay_ids = {id(p) for p in decay["params"]}
    no_decay_ids = {id(p) for p in no_decay["params"]}
    for name, p in model.named_parameters():
        assert (id(p) in decay_ids) == (p.ndim >= 2), name
        assert (id(p) in no_decay_ids) == (p.ndim < 2), name
    assert all(group["betas"] == (0.9, 0.99) and group["lr"] == 1e-3 for group in (decay, no_decay))


def test_training_step_stays_float32(monkeypatch):
    """Every op output and every gradient an op hands back is float32, not only the end results:
    the engine casts a stray float64 contribution back to the parameter's dtype, which would hide
    a silent upcast (and its cost) inside a VJP."""
    seen: list[str] = []
    original = Tensor.from_op.__func__

    def recording_from_op(cls, data, parents, backward):
        if data.dtype.kind == "f" and data.dtype != np.float32:
            seen.append(f"op output {data.dtype} from {backward.__qualname__}")

        def checked_backward(grad_out):
            grads = backward(grad_out)
            seen.extend(
                f"gradient {g.dtype} from {backward.__qualname__}"
                for g in grads
                if g is not None and np.asarray(g).dtype != np.float32
            )
            return grads

        return original(cls, data, parents, checked_backward)

    monkeypatch.setattr(Tensor, "from_op", classmethod(recording_from_op))
    model = tiny_model(bias=True, dropout=0.1)
    optimizer = model.configure_optimizer(lr=1e-3, weight_decay=0.1)
    idx, targets = batch(np.random.default_rng(0))
    for _ in range(2):
        optimizer.zero_grad()
        logits, loss = model(idx, targets)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    assert seen == []
    assert logits.dtype == np.float32 and loss.dtype == np.float32
    for name, p in model.named_parameters():
        assert p.dtype == np.float32 and p.grad.dtype == np.float32, name
    state = optimizer.state_dict()
    arrays = _arrays_in(state)
    assert arrays, "optimizer state holds no arrays"
    assert all(a.dtype == np.float32 for a in arrays if a.dtype.kind == "f")


def _arrays_in(obj) -> list[np.ndarray]:
    if isinstance(obj, np.ndarray):
        return [obj]
    if isinstance(obj, dict):
        return [a for v in obj.values() for a in _arrays_in(v)]
    if isinstance(obj, (list, tuple)):
        return [a for v in obj for a in _arrays_in(v)]
    return []


def test_tiny_gpt_overfits_one_batch():
    config = GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=32)
    model = GPT(config, rng=np.random.default_rng(0))
    optimizer = model.configure_optimizer(lr=1e-2, weight_decay=0.0)
    idx, targets = batch(np.random.default_rng(1), B=4, T=8, vocab=16)
    first = None
    for _ in range(300):
        optimizer.zero_grad()
        _, loss = model(idx, targets)
        loss.backward()
        optimizer.step()
        first = float(loss.data) if first is None else first
        if float(loss.data) < 0.05:
            break
    assert abs(first - math.log(16)) < 0.1
    assert float(loss.data) < 0.1

"""`glassllm.models.decoding.next_position`: one cached position on arrays is the modules' own
forward (``GPT.hidden_states`` with the caches) bit for bit, for float32 and block-quantized
projections, with and without biases and grouped heads, fast kernels or definitions; and the
modules run instead wherever the array path could differ: a hook, a subclass, a configuration
it does not mirror, training mode."""

from __future__ import annotations

import numpy as np
import pytest

import glassllm.nn as nn
from glassllm import kernels, no_grad
from glassllm.functional import Q4Weight, Q8Weight
from glassllm.kernels import compiled
from glassllm.models import GPT, GPTConfig, decoding, llama_config
from glassllm.models.gpt import Block

E, STEPS = 64, 5


def llama(rng_seed=0, **fields):
    """A 2-block Llama whose biases and norm weights are random too (initialised, they are 0 and 1,
    and a step that forgot them would pass), with an eps large enough to matter."""
    fields = {"n_kv_head": 2, "mlp_hidden": 96, "norm_eps": 1e-2, **fields}
    config = llama_config(vocab_size=50, block_size=32, n_layer=2, n_head=4, n_embd=E, **fields)
    model = GPT(config, rng=np.random.default_rng(rng_seed)).eval()
    rng = np.random.default_rng(rng_seed + 10)
    for name, p in model.named_parameters():
        if name.endswith("bias") or "ln" in name or "norm" in name:
            p.data[...] = rng.uniform(0.5, 1.5, p.shape).astype(p.dtype)
    return model


def quantize_projections(model, bits):
    """Every projection of the blocks replaced by a `QuantizedLinear` of random blocks (its bias
    kept), as a GGUF file's layers are with ``keep_quantized=True``."""
    rng = np.random.default_rng(1)
    for block in model.blocks:
        for owner, name in ((block.attn, "qkv"), (block.attn, "proj"), (block.mlp, "gate"),
                            (block.mlp, "up"), (block.mlp, "proj")):  # fmt: skip
            layer = getattr(owner, name)
            fan_in, fan_out = layer.weight.shape
            nb = fan_in // 32
            scales = rng.uniform(0.001, 0.02, (fan_out, nb)).astype(np.float32)
            if bits == 4:
                offsets = rng.uniform(-0.1, 0.0, (fan_out, nb)).astype(np.float32)
                quants = rng.integers(0, 256, (fan_out, nb, 16), dtype=np.uint8)
                weight = Q4Weight.from_blocks(scales, offsets, quants)
            else:
                quants = rng.integers(-127, 128, (fan_out, nb, 32), dtype=np.int8)
                weight = Q8Weight.from_blocks(scales, quants)
            setattr(owner, name, nn.QuantizedLinear(weight, layer.bias))
    return model


def non_point_modules(model):
    return [m for m in model.modules() if not m._is_hook_point]


def both_paths(model, batch=1, steps=STEPS, monkeypatch=None):
    """Hidden states ``(B, 1, E)`` per step from `next_position` and from ``hidden_states``,
    each with caches of its own, after the same 6-token prompt; with ``monkeypatch``, the
    modules' path raises inside `next_position` (so the array path must have run)."""
    rng = np.random.default_rng(2)
    prompt = rng.integers(0, 50, (batch, 6))
    ours, theirs = [], []
    real = model.hidden_states
    with no_grad():
        caches = [[nn.KVCache(capacity=16) for _ in model.blocks] for _ in range(2)]
        for side in caches:
            real(prompt, side)
        modules = non_point_modules(model)
        for _ in range(steps):
            ids = rng.integers(0, 50, (batch, 1))
            if monkeypatch is not None:
                forbid_modules(monkeypatch, model)
            ours.append(decoding.next_position(model, ids, caches[0], modules).data)
            if monkeypatch is not None:
                monkeypatch.undo()
            theirs.append(real(ids, caches[1]).data)
    return ours, theirs


def forbid_modules(monkeypatch, model):
    """Make the module path raise, so a test knows the array path ran."""

    def refuse(*args, **kwargs):
        raise AssertionError("next_position ran the modules")

    monkeypatch.setattr(model, "hidden_states", refuse)


CASES = {
    "float32": dict(),
    "biases (Qwen2)": dict(qkv_bias=True),
    "all biases": dict(bias=True),
    "one kv head a query head": dict(n_kv_head=4),
    "multi-query": dict(n_kv_head=1),
    "interleaved rotary": dict(rotary_interleaved=True),
}


@pytest.mark.parametrize("mode", ["fast", "reference"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_one_position_is_the_modules_bit_for_bit(case, mode, monkeypatch):
    model = llama(**CASES[case])
    assert decoding.mirrors(model)
    with kernels.use(mode):
        ours, theirs = both_paths(model, batch=2, monkeypatch=monkeypatch)
    for a, b in zip(ours, theirs, strict=True):
        assert a.shape == (2, 1, E) and a.dtype == np.float32
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bits", [4, 8])
def test_block_quantized_projections_are_the_modules_bit_for_bit(bits, monkeypatch):
    if not compiled.enabled():
        pytest.skip("the compiled kernels are turned off (GLASSLLM_NUMBA=0)")
    model = quantize_projections(llama(qkv_bias=True), bits)
    assert decoding.mirrors(model)
    ours, theirs = both_paths(model, batch=2, monkeypatch=monkeypatch)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(ours[0], ours[1])  # the steps saw different tokens


def test_a_hook_added_between_tokens_runs_the_modules():
    model = llama()
    seen = []
    rng = np.random.default_rng(3)
    with no_grad():
        caches = [nn.KVCache(capacity=16) for _ in model.blocks]
        model.hidden_states(rng.integers(0, 50, (1, 4)), caches)
        modules = non_point_modules(model)
        decoding.next_position(model, np.array([[1]]), caches, modules)
        point = model.blocks[1].hook_resid_mid.register_forward_hook(lambda *a: seen.append(1))
        decoding.next_position(model, np.array([[2]]), caches, modules)
        point.remove()
        handle = model.blocks[0].mlp.up.register_forward_hook(lambda *a: seen.append(2))
        decoding.next_position(model, np.array([[3]]), caches, modules)
        handle.remove()
    assert seen == [1, 2]
    assert caches[0].length == 7  # every step appended, whichever path ran


class Subclassed(Block):
    pass


def test_what_it_does_not_mirror_runs_the_modules():
    assert not decoding.mirrors(GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2,
                                              n_embd=16)).eval())  # fmt: skip
    assert not decoding.mirrors(llama(qk_norm=True))
    assert not decoding.mirrors(llama(parallel_residual=True))
    assert not decoding.mirrors(llama().train())
    model = llama()
    model.blocks[0].__class__ = Subclassed
    assert not decoding.mirrors(model)
    ours, theirs = both_paths(llama(qk_norm=True), steps=2)  # the fallback: the same numbers
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_generation_takes_the_array_path_and_keeps_its_tokens(monkeypatch):
    model = llama()
    prompt = np.array([[3, 1, 4, 1, 5]])
    expected = model.generate(prompt, max_new_tokens=8, rng=np.random.default_rng(0),
                              use_cache=False)  # fmt: skip
    calls = []
    real = decoding._block
    monkeypatch.setattr(decoding, "_block", lambda *a: calls.append(1) or real(*a))
    got = model.generate(prompt, max_new_tokens=8, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(got, expected)
    assert len(calls) == 7 * len(model.blocks)  # every token after the first, every block

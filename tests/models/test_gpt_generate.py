"""glassllm.models.generation (through GPT.generate / generate_stream): key/value cache exactness,
sampling rules, modes, bad input."""

from __future__ import annotations

import dataclasses
import tracemalloc

import numpy as np
import pytest

import glassllm.nn as nn
from glassllm import Tensor, is_grad_enabled, no_grad
from glassllm.models import GPT, GPTConfig, generation
from glassllm.models.generation import block_last_position, last_position_hidden

CONFIG = GPTConfig(vocab_size=17, block_size=8, n_layer=2, n_head=2, n_embd=16)


@pytest.fixture(scope="module")
def model() -> GPT:
    return GPT(CONFIG, rng=np.random.default_rng(0))


def prompt(B: int = 2, T: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, CONFIG.vocab_size, size=(B, T))


@pytest.mark.parametrize(
    "temperature, top_k, T", [(1.0, None, 3), (0.7, 5, 1), (1.5, 3, 8), (1.0, None, 12)]
)
def test_cached_and_uncached_generation_agree_past_block_size(model, temperature, top_k, T):
    idx = prompt(T=T)
    kwargs = dict(max_new_tokens=14, temperature=temperature, top_k=top_k)  # ends past block_size
    cached = model.generate(idx, rng=np.random.default_rng(5), use_cache=True, **kwargs)
    uncached = model.generate(idx, rng=np.random.default_rng(5), use_cache=False, **kwargs)
    assert cached.shape == (2, T + 14)
    np.testing.assert_array_equal(cached, uncached)
    np.testing.assert_array_equal(cached[:, :T], idx)


def test_cached_probabilities_match_full_recomputation(model):
    idx = prompt()
    streams = [
        list(model.generate_stream(idx, 10, rng=np.random.default_rng(1), use_cache=use_cache))
        for use_cache in (True, False)
    ]
    for (ids_c, probs_c), (ids_u, probs_u) in zip(*streams, strict=True):
        np.testing.assert_array_equal(ids_c, ids_u)
        np.testing.assert_allclose(probs_c, probs_u, rtol=1e-5, atol=1e-6)


def test_forward_with_caches_matches_full_forward_logits(model):
    """Feeding tokens one position at a time through the caches reproduces every full logit."""
    idx = prompt(T=CONFIG.block_size)
    full, _ = model(idx)
    caches = [nn.KVCache(capacity=CONFIG.block_size) for _ in model.blocks]
    with no_grad():
        h = model.hidden_states(idx[:, :3], caches)  # a 3-token prefill, then single tokens
        step_logits = [model.head(h).data]
        for t in range(3, CONFIG.block_size):
            step_logits.append(model.head(model.hidden_states(idx[:, t : t + 1], caches)).data)
    np.testing.assert_allclose(np.concatenate(step_logits, axis=1), full.data, rtol=1e-5, atol=1e-5)
    assert all(cache.length == CONFIG.block_size for cache in caches)
    with pytest.raises(ValueError, match="exceeds block_size"):
        model.hidden_states(idx[:, :1], caches)


def test_stream_yields_ids_and_the_distribution_they_came_from(model):
    idx = prompt()
    steps = list(model.generate_stream(idx, 5, top_k=4, rng=np.random.default_rng(2)))
    assert len(steps) == 5
    for next_ids, probs in steps:
        assert next_ids.shape == (2,) and next_ids.dtype == np.int64
        assert probs.shape == (2, CONFIG.vocab_size) and probs.dtype == np.float32
        np.testing.assert_allclose(probs.sum(axis=-1), 1.0, rtol=1e-5)
        assert np.all((probs > 0).sum(axis=-1) <= 4)
        assert np.all(probs[np.arange(2), next_ids] > 0)
    generated = model.generate(idx, 5, top_k=4, rng=np.random.default_rng(2))
    np.testing.assert_array_equal(generated[:, 3:], np.stack([ids for ids, _ in steps], axis=1))


def test_top_k_one_is_greedy_and_large_top_k_is_clipped(model):
    idx = prompt()
    greedy = model.generate(idx, 6, top_k=1, rng=np.random.default_rng(0))
    context = idx
    for _ in range(6):
        logits, _ = model(context[:, -CONFIG.block_size :])
        context = np.concatenate([context, logits.data[:, -1].argmax(-1)[:, None]], axis=1)
    np.testing.assert_array_equal(greedy, context)
    clipped = model.generate(idx, 6, top_k=1000, rng=np.random.default_rng(3))
    unrestricted = model.generate(idx, 6, top_k=None, rng=np.random.default_rng(3))
    np.testing.assert_array_equal(clipped, unrestricted)


def test_sampling_follows_the_probabilities():
    """The inverse-CDF draw has the right frequencies and never picks a zero-probability token."""
    probs = np.array([[0.0, 0.2, 0.0, 0.5, 0.3, 0.0]], dtype=np.float32).repeat(20000, axis=0)
    draws = generation.sample(probs, np.random.default_rng(0))
    frequencies = np.bincount(draws, minlength=6) / len(draws)
    np.testing.assert_allclose(frequencies, probs[0], atol=0.015)
    assert frequencies[[0, 2, 5]].sum() == 0


def test_sampling_when_the_draw_rounds_up_to_the_total():
    """u * sum(p) rounding up to sum(p) (possible in float32) picks the last token with
    probability, never index 0 or a zero-probability token."""

    class TopOfRange:
        def random(self, size, dtype):
            return np.ones(size, dtype=dtype)

    probs = np.array([[0.0, 0.6, 0.4, 0.0], [0.3, 0.7, 0.0, 0.0]], dtype=np.float32)
    np.testing.assert_array_equal(generation.sample(probs, TopOfRange()), [2, 1])


@pytest.mark.parametrize("training", [True, False])
def test_generation_leaves_no_graph_and_restores_modes(training, monkeypatch):
    tracked: list[str] = []
    original = Tensor.from_op.__func__

    def recording_from_op(cls, data, parents, backward):
        out = original(cls, data, parents, backward)
        if out.requires_grad or out.parents:
            tracked.append(backward.__qualname__)
        return out

    monkeypatch.setattr(Tensor, "from_op", classmethod(recording_from_op))
    model = GPT(GPTConfig(**{**CONFIG.to_dict(), "dropout": 0.5}), rng=np.random.default_rng(0))
    model.train(training)
    model.blocks[0].mlp.dropout.train(not training)  # a mixed tree comes back as it was
    modes = [m.training for m in model.modules()]
    a = model.generate(prompt(), 4, rng=np.random.default_rng(0))
    assert [m.training for m in model.modules()] == modes
    assert is_grad_enabled()
    assert all(p.grad is None for p in model.parameters())
    assert tracked == []  # every op ran under no_grad: no graph was built
    # Dropout is off while generating: cached and uncached agree even with dropout 0.5 in training.
    b = model.generate(prompt(), 4, rng=np.random.default_rng(0), use_cache=False)
    np.testing.assert_array_equal(a, b)


def test_stream_does_not_hold_no_grad_or_eval_between_tokens(model):
    model.train()
    stream = model.generate_stream(prompt(), 3, rng=np.random.default_rng(0))
    for _ in stream:
        assert is_grad_enabled() and model.training
    abandoned = model.generate_stream(prompt(), 3, rng=np.random.default_rng(0))
    next(abandoned)
    assert is_grad_enabled() and model.training


def test_generate_runs_under_callers_no_grad(model):
    with no_grad():
        out = model.generate(prompt(), 2, rng=np.random.default_rng(0))
        assert not is_grad_enabled()
    assert out.shape == (2, 5)


def test_generation_uses_default_rng_when_none_given(model):
    import glassllm

    glassllm.manual_seed(11)
    a = model.generate(prompt(), 5)
    glassllm.manual_seed(11)
    b = model.generate(prompt(), 5)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=0.0), "temperature must be > 0"),
        (dict(temperature=-1.0), "temperature must be > 0"),
        (dict(top_k=0), "top_k must be a positive integer"),
        (dict(max_new_tokens=-1), "max_new_tokens must be >= 0"),
        (dict(idx=np.array([[1, 17]])), r"token id 17 is outside the vocabulary \[0, 17\)"),
        (dict(idx=np.zeros((2, 0), dtype=np.int64)), "at least one token per row"),
        (dict(idx=np.array([1, 2])), r"shape \(B, T\), got shape \(2,\)"),
    ],
)
def test_bad_generation_arguments_raise_at_the_call(model, kwargs, message):
    arguments = {"idx": prompt(), "max_new_tokens": 3, **kwargs}
    with pytest.raises(ValueError, match=message):
        model.generate(**arguments)
    with pytest.raises(ValueError, match=message):
        model.generate_stream(**arguments)  # raises before the first next()


def test_zero_new_tokens_returns_the_prompt(model):
    idx = prompt()
    np.testing.assert_array_equal(model.generate(idx, 0), idx)


def test_the_cache_is_sized_for_the_call_not_for_a_whole_block(monkeypatch):
    """A long-context model (Llama-3.2's block_size is 131072) must not allocate a block's cache
    per layer for a short answer: the caches hold the prompt plus the new tokens."""
    config = GPTConfig(
        vocab_size=17, block_size=1 << 16, n_layer=2, n_head=2, n_embd=16, positions="rotary"
    )
    model = GPT(config, rng=np.random.default_rng(0))
    idx = prompt(B=1, T=3)
    made: list[nn.KVCache] = []

    class Recorded(nn.KVCache):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    model.generate(idx, 1)  # why: the first call imports and compiles kernels (tens of MB)
    monkeypatch.setattr(nn, "KVCache", Recorded)
    full_cache = config.n_layer * 2 * config.block_size * config.n_embd * 4  # keys + values
    tracemalloc.start()
    try:
        cached = model.generate(idx, 4, rng=np.random.default_rng(1), use_cache=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(made) == config.n_layer
    assert all(cache.capacity == 3 + 4 and cache.length == 3 + 3 for cache in made)
    assert peak < full_cache / 20, (peak, full_cache)
    uncached = model.generate(idx, 4, rng=np.random.default_rng(1), use_cache=False)
    np.testing.assert_array_equal(cached, uncached)


# Generation's last-position path: block_last_position and last_position_hidden give the
# full forward's last position; CausalSelfAttention.prefill guards its inputs.


@pytest.mark.parametrize("T", [1, 2, 8])
def test_block_last_position_equals_full_forward_last_position(T):
    model = GPT(CONFIG, rng=np.random.default_rng(0))
    x = Tensor(np.random.default_rng(1).standard_normal((3, T, 16)).astype(np.float32))
    with no_grad():
        full = model.blocks[1](x).data[:, -1:]
        last = block_last_position(model.blocks[1], x).data
    assert last.shape == (3, 1, 16) and last.dtype == np.float32
    np.testing.assert_allclose(last, full, rtol=1e-5, atol=1e-6)


def test_last_position_hidden_matches_and_generation_uses_it():
    model = GPT(CONFIG, rng=np.random.default_rng(0))
    idx = np.random.default_rng(2).integers(0, 17, size=(2, 8))
    with no_grad():
        full = model.hidden_states(idx).data[:, -1:]
        last = last_position_hidden(model, idx).data
    np.testing.assert_allclose(last, full, rtol=1e-5, atol=1e-6)
    # past block_size both generation modes take this path and agree token for token
    a = model.generate(idx, 5, rng=np.random.default_rng(3), use_cache=True)
    b = model.generate(idx, 5, rng=np.random.default_rng(3), use_cache=False)
    np.testing.assert_array_equal(a, b)


def test_prefill_rejects_grad_mode_and_non_caches():
    attn = nn.CausalSelfAttention(8, 2, rng=np.random.default_rng(0))
    x = Tensor(np.ones((1, 3, 8), dtype=np.float32))
    with pytest.raises(RuntimeError, match="prefill is for inference"):
        attn.prefill(x, nn.KVCache())
    with no_grad(), pytest.raises(TypeError, match="kv_cache must be an nn.KVCache"):
        attn.prefill(x, None)
    cache = nn.KVCache()
    with no_grad():
        attn.prefill(x, cache)
    assert cache.length == 3 and cache.keys.shape == (1, 2, 3, 4)


# ---------------------------------------------------------------------- options and explain

from glassllm.models.sampling import MAX_NEW_TOKENS, MAX_TOP_K, SamplingOptions  # noqa: E402


@pytest.mark.parametrize("temperature, top_k", [(1.0, None), (0.7, 4), (1.3, 1)])
def test_explain_carries_the_generated_ids_and_the_sampled_softmax(model, temperature, top_k):
    idx = prompt(B=2, T=3)
    options = SamplingOptions(max_new_tokens=7, temperature=temperature, top_k=top_k)
    ids, choices = generation.explain(model, idx, options, np.random.default_rng(4), top=5)
    expected = model.generate(idx, 7, temperature, top_k, np.random.default_rng(4))
    np.testing.assert_array_equal(ids, expected)
    for b in range(2):
        assert [c.token_id for c in choices[b]] == ids[b, 3:].tolist()
        for i, choice in enumerate(choices[b]):
            context = ids[b : b + 1, max(0, 3 + i - CONFIG.block_size) : 3 + i]
            with no_grad():
                logits = model(context)[0].data[0, -1].astype(np.float64) / temperature  # (V,)
            if top_k is not None:
                logits[logits < np.sort(logits)[-top_k]] = -np.inf
            p = np.exp(logits - logits.max())
            p /= p.sum()  # an independent float64 softmax
            np.testing.assert_allclose(choice.prob, p[choice.token_id], rtol=1e-4, atol=1e-6)
            listed = [t for t in np.argsort(-p, kind="stable")[:5] if p[t] > 0]
            assert [t for t, _ in choice.alternatives] == listed
            np.testing.assert_allclose([q for _, q in choice.alternatives], p[listed], atol=1e-6)


def test_stream_takes_the_options_and_their_seed(model):
    options = SamplingOptions(max_new_tokens=4, top_k=3, seed=9)
    ids = np.stack([new for new, _ in generation.stream(model, prompt(), options)], axis=1)
    expected = model.generate(prompt(), 4, top_k=3, rng=np.random.default_rng(9))
    np.testing.assert_array_equal(ids, expected[:, 3:])


@pytest.mark.parametrize(
    "fields, fragment",
    [
        (dict(max_new_tokens=MAX_NEW_TOKENS + 1), "max_new_tokens must be at most"),
        (dict(max_new_tokens=1.5), "max_new_tokens must be an integer"),
        (dict(temperature=float("nan")), "temperature must be > 0"),
        (dict(temperature=1e-7), "temperature must be at least 1e-06"),
        (dict(top_k=MAX_TOP_K + 1), "top_k must be a positive integer"),
        (dict(top_k=True), "top_k must be a positive integer"),
        (dict(seed=-1), "seed must be a non-negative integer"),
    ],
)
def test_sampling_options_reject_values_outside_their_bounds(fields, fragment):
    with pytest.raises(ValueError, match=fragment):
        SamplingOptions(**fields)
    with pytest.raises(dataclasses.FrozenInstanceError):
        SamplingOptions().temperature = 2.0  # frozen: checked once, never changed after

"""Top-p (nucleus) and min-p sampling: the same kept tokens and probabilities as transformers'
logits warpers applied in generate's order (temperature, top-k, top-p, min-p); the bounds of the
options; generation drawing from exactly that distribution."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import optional

from glassllm.autograd import no_grad
from glassllm.models import generation, sampling
from glassllm.models.sampling import SamplingOptions, distribution

CASES = [
    (1.0, None, 0.9, None),
    (0.7, None, 0.3, None),
    (1.3, 20, 0.5, None),
    (1.0, None, None, 0.05),
    (0.8, None, None, 0.3),
    (1.0, 10, 0.95, 0.1),
    (0.5, 40, 0.6, 0.02),
    (1.0, None, 1.0, 0.0),  # both off
]


def transformers_probabilities(logits, temperature, top_k, top_p, min_p):
    torch = optional("torch")
    warpers = optional("transformers.generation.logits_process")
    chain = [warpers.TemperatureLogitsWarper(temperature)]
    if top_k is not None:
        chain.append(warpers.TopKLogitsWarper(top_k))
    if top_p is not None and top_p < 1.0:  # generate leaves it out at 1.0
        chain.append(warpers.TopPLogitsWarper(top_p))
    if min_p is not None:
        chain.append(warpers.MinPLogitsWarper(min_p))
    scores = torch.from_numpy(logits.copy())
    ids = torch.zeros((logits.shape[0], 1), dtype=torch.long)
    for warper in chain:
        scores = warper(ids, scores)
    return torch.softmax(scores, dim=-1).numpy()


@pytest.mark.parametrize("temperature, top_k, top_p, min_p", CASES)
def test_the_same_tokens_kept_as_transformers(temperature, top_k, top_p, min_p):
    rng = np.random.default_rng(int(100 * temperature) + (top_k or 0))
    logits = (rng.normal(size=(6, 300)) * rng.uniform(0.5, 4, size=(6, 1))).astype(np.float32)
    ours = distribution(logits, temperature, top_k, top_p, min_p)
    theirs = transformers_probabilities(logits, temperature, top_k, top_p, min_p)
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours > 0, theirs > 0)  # the same kept set, row by row
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-7)
    if top_p is not None and top_p < 1.0 or min_p:
        assert (ours > 0).sum() < ours.size  # the filter removed something


def test_the_filters_compose_in_transformers_order():
    """top-p after top-k: the nucleus of the renormalised top-k. The other order keeps another
    set on these logits, so the order is what the test above checks against transformers."""
    logits = np.log(np.array([[0.30, 0.25, 0.2, 0.15, 0.1]], dtype=np.float32))
    # top-2 renormalised: 0.545, 0.455; 0.455 <= 1 - 0.5 goes
    kept = distribution(logits, 1.0, top_k=2, top_p=0.5) > 0
    assert kept.tolist() == [[True, False, False, False, False]]
    # the nucleus of all five first: 0.1 + 0.15 + 0.2 <= 0.5 go, then the top-2 of the rest
    other_order = sampling.top_k_filter(sampling.top_p_filter(logits, 0.5), 2)
    assert np.isfinite(other_order).tolist() == [[True, True, False, False, False]]
    # min-p last: of the top-3 renormalised (0.4, 0.333, 0.267), 0.267 < 0.7 * 0.4 goes
    kept = distribution(logits, 1.0, top_k=3, min_p=0.7) > 0
    assert kept.tolist() == [[True, True, False, False, False]]


def test_the_most_likely_token_always_stays():
    logits = np.array([[5.0, 0.0, -1.0]], dtype=np.float32)
    assert (distribution(logits, 1.0, top_p=1e-9) > 0).tolist() == [[True, False, False]]
    assert (distribution(logits, 1.0, min_p=0.999) > 0).tolist() == [[True, False, False]]


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("top_p", 0.0, "top_p must be a number in (0, 1]"),
        ("top_p", 1.5, "top_p must be a number in (0, 1]"),
        ("top_p", float("nan"), "top_p"),
        ("top_p", True, "top_p"),
        ("top_p", "0.5", "top_p"),
        ("min_p", 1.0, "min_p must be a number in [0, 1)"),
        ("min_p", -0.1, "min_p"),
        ("min_p", float("inf"), "min_p"),
    ],
)
def test_bounds(field, value, words):
    with pytest.raises(ValueError) as caught:
        SamplingOptions(**{field: value})
    assert words in str(caught.value)


def test_edges_and_types():
    options = SamplingOptions(top_p=1, min_p=0)
    assert options.top_p == 1.0 and isinstance(options.top_p, float)
    assert options.min_p == 0.0
    assert SamplingOptions(top_p=np.float32(0.5)).top_p == 0.5
    assert SamplingOptions(5, 1.0, None, 3) == SamplingOptions(5, 1.0, None, 3, None, None)


def test_generation_draws_from_the_filtered_distribution(tiny_gpt):
    model = tiny_gpt(seed=3)
    prompt = np.array([[1, 2, 3]])
    options = SamplingOptions(6, 1.2, None, 7, top_p=0.6, min_p=0.1)
    steps = list(generation.stream(model, prompt, options))
    ids = prompt
    for next_ids, probs in steps:
        with no_grad():
            logits = model(ids)[0].data[:, -1, :]  # (1, V): the forward's last position
        expected = sampling.distribution(logits, 1.2, None, 0.6, 0.1)
        np.testing.assert_allclose(probs, expected, rtol=1e-5, atol=1e-7)
        assert probs[0, next_ids[0]] > 0 and (probs == 0).any()
        ids = np.concatenate([ids, next_ids[:, None]], axis=1)
    again = generation.generate(
        model, prompt, 6, 1.2, None, np.random.default_rng(7), top_p=0.6, min_p=0.1
    )
    np.testing.assert_array_equal(again, ids)


def test_without_the_new_filters_generation_is_unchanged(tiny_gpt):
    """top_p 1 and min_p 0 (and None) draw exactly what the sampler drew before they existed."""
    model = tiny_gpt(seed=4)
    prompt = np.array([[1, 2]])
    before = model.generate(prompt, 8, 0.9, 5, np.random.default_rng(2))
    for top_p, min_p in ((None, None), (1.0, 0.0)):
        now = generation.generate(
            model, prompt, 8, 0.9, 5, np.random.default_rng(2), top_p=top_p, min_p=min_p
        )
        np.testing.assert_array_equal(now, before)


def test_the_model_methods_take_top_p_and_min_p(tiny_gpt):
    """``GPT.generate`` and ``GPT.generate_stream`` pass the filters on (keyword-only), giving
    what `glassllm.models.generation` gives, and the distribution each token came from."""
    model = tiny_gpt(seed=5)
    prompt = np.array([[1, 2, 3], [3, 2, 1]])
    filters = dict(top_p=0.5, min_p=0.2)
    expected = generation.generate(model, prompt, 7, 1.1, None, np.random.default_rng(9), **filters)
    got = model.generate(prompt, 7, 1.1, rng=np.random.default_rng(9), **filters)
    np.testing.assert_array_equal(got, expected)
    ids = prompt
    for next_ids, probs in model.generate_stream(
        prompt, 4, 1.1, rng=np.random.default_rng(9), **filters
    ):
        with no_grad():
            logits = model(ids)[0].data[:, -1, :]
        np.testing.assert_allclose(
            probs, sampling.distribution(logits, 1.1, None, 0.5, 0.2), rtol=1e-5, atol=1e-7
        )
        ids = np.concatenate([ids, next_ids[:, None]], axis=1)
    assert (probs == 0).any()  # the filters did cut
    np.testing.assert_array_equal(ids, expected[:, :7])
    with pytest.raises(ValueError, match="top_p"):
        model.generate(prompt, 2, top_p=1.5)
    with pytest.raises(TypeError):
        model.generate(prompt, 2, 1.0, None, None, True, 0.5)  # keyword-only

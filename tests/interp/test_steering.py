"""Steering: alpha = 0 changes nothing; alpha > 0 adds exactly alpha * direction at the hook,
in the prompt's forward and in every KV-cached step."""

from __future__ import annotations

import numpy as np
import pytest

from glassllm.interp import generate_steered, steering_vector
from tests.interp.interp_models import random_model

POSITIVE, NEGATIVE = [[1, 2, 3], [4, 5]], [6, 7, 8, 9]


def test_the_direction_is_the_mean_difference_at_the_last_positions():
    model = random_model("gpt2")
    vector = steering_vector(model, POSITIVE, NEGATIVE, layer=1)
    name = "blocks.1.hook_resid_pre"
    last = [model.run_with_cache(p, names=[name])[1][name][0, -1] for p in POSITIVE + [NEGATIVE]]
    np.testing.assert_allclose(vector.direction, (last[0] + last[1]) / 2 - last[2], atol=1e-12)
    assert vector.name == name and vector.norm == pytest.approx(np.linalg.norm(vector.direction))
    mean = steering_vector(model, POSITIVE, NEGATIVE, layer=1, position="mean")
    assert not np.allclose(mean.direction, vector.direction)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_alpha_zero_gives_plain_generate_tokens(kind):
    model = random_model(kind, dtype=np.float32)
    vector = steering_vector(model, POSITIVE, NEGATIVE, layer=0)
    prompt = np.array([[1, 2, 3]])
    plain = model.generate(prompt, 8, rng=np.random.default_rng(0))
    steered = generate_steered(model, prompt, vector, 0.0, 8, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(steered, plain)


def test_alpha_adds_exactly_alpha_direction_at_the_hook_in_every_cached_step():
    model = random_model("gpt2", dtype=np.float32)
    vector = steering_vector(model, POSITIVE, NEGATIVE, layer=1)
    alpha = 3.0
    seen = []

    def record(act, _name):  # registered after the steering hook: sees the steered stream
        seen.append(act.copy())

    with model.hooks([("blocks.1.hook_resid_pre", lambda a, n: seen.append(a.copy()))]):
        with model.hooks(vector.hooks(alpha) + [("blocks.1.hook_resid_pre", record)]):
            steered = model.generate(np.array([[1, 2, 3]]), 4, rng=np.random.default_rng(0))
    before, after = seen[0::2], seen[1::2]
    assert [a.shape[1] for a in after] == [3, 1, 1, 1]  # the prompt, then one position a step
    added = (alpha * vector.direction).astype(np.float32)
    for original, shown in zip(before, after, strict=True):
        np.testing.assert_array_equal(shown, original + added)
    assert steered.shape == (1, 7)


def test_a_large_alpha_changes_the_continuation():
    model = random_model("gpt2", dtype=np.float32)
    vector = steering_vector(model, POSITIVE, NEGATIVE, layer=1)
    prompt = np.array([[1, 2, 3]])
    plain = model.generate(prompt, 8, temperature=1e-3, rng=np.random.default_rng(0))
    steered = generate_steered(
        model, prompt, vector, 50.0, 8, temperature=1e-3, rng=np.random.default_rng(0)
    )
    assert not np.array_equal(steered, plain)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [(dict(layer=7), "outside"), (dict(position="first"), "position must be")],
)
def test_bad_steering(kwargs, message):
    args = dict(layer=0) | kwargs
    with pytest.raises(ValueError, match=message):
        steering_vector(random_model("gpt2"), POSITIVE, NEGATIVE, **args)

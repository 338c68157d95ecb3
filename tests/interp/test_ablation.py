"""Ablation against the manual computation through the hook points."""

from __future__ import annotations

import numpy as np
import pytest

from glassllm.interp import ablate, ablation_hooks
from tests.interp.interp_models import CLEAN, random_model

OTHER = [[3, 1, 4, 1, 5, 9], [2, 6, 5, 3, 5, 8]]


def test_zeroing_a_head_is_zeroing_its_z_slice_by_hand():
    model = random_model("gpt2")
    result = ablate(model, CLEAN, heads=[(1, 0)])

    def by_hand(z, _name):
        z[:, :, 0, :] = 0.0

    logits = model.run_with_hooks(CLEAN, fwd_hooks=[("blocks.1.attn.hook_z", by_hand)])
    np.testing.assert_array_equal(result.logits, logits.data[0, -1])
    np.testing.assert_array_equal(result.base_logits, model.run_with_hooks(CLEAN).data[0, -1])
    assert result.parts == ["L1H0"] and result.kl > 0
    np.testing.assert_allclose(result.probs.sum(), 1.0)


def test_mean_ablation_of_a_neuron_uses_the_mean_over_reference_prompts_and_positions():
    model = random_model("gpt2")
    result = ablate(model, CLEAN, neurons=[(0, 5)], how="mean", reference=OTHER)
    _, cache = model.run_with_cache(OTHER, names=["blocks.0.mlp.hook_post"])
    mean = cache["blocks.0.mlp.hook_post"][:, :, 5].mean()

    def by_hand(post, _name):
        post[:, :, 5] = mean

    logits = model.run_with_hooks(CLEAN, fwd_hooks=[("blocks.0.mlp.hook_post", by_hand)])
    np.testing.assert_allclose(result.logits, logits.data[0, -1], atol=1e-12)


@pytest.mark.parametrize("kind", ["attn", "mlp"])
def test_resampling_a_layer_is_that_layer_from_the_other_prompt(kind):
    model = random_model("llama")
    result = ablate(model, CLEAN, layers=[(kind, 1)], how="resample", reference=OTHER[0])
    name = f"blocks.1.hook_{kind}_out"
    _, cache = model.run_with_cache(OTHER[0], names=[name])
    logits = model.run_with_hooks(CLEAN, fwd_hooks=[(name, lambda a, n: cache[name])])
    np.testing.assert_array_equal(result.logits, logits.data[0, -1])
    assert result.parts == [f"L1 {kind}"]


def test_ablation_hooks_work_in_kv_cached_generation():
    model = random_model("gpt2")
    hooks = ablation_hooks(model, heads=[(0, 1)], neurons=[(1, 2)], how="mean", reference=OTHER)
    rng = np.random.default_rng
    with model.hooks(hooks):
        cached = model.generate(np.array([CLEAN]), 5, rng=rng(0))
        uncached = model.generate(np.array([CLEAN]), 5, rng=rng(0), use_cache=False)
    np.testing.assert_array_equal(cached, uncached)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(), "nothing to ablate"),
        (dict(heads=[(0, 9)]), "head 9"),
        (dict(layers=[("embed", 0)]), "'attn' | 'mlp'"),
        (dict(heads=[(0, 0)], how="mean"), "needs reference"),
        (dict(heads=[(0, 0)], how="zero", reference=OTHER), "no reference"),
        (dict(heads=[(0, 0)], how="noise"), "how must be"),
        (dict(heads=[(0, 0)], how="resample", reference=[1, 2]), "as long as the reference"),
    ],
)
def test_bad_ablations(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ablate(random_model("gpt2"), CLEAN, **kwargs)


def test_resampling_needs_one_reference_or_one_per_row():
    model = random_model("gpt2")
    hooks = ablation_hooks(model, heads=[(0, 0)], how="resample", reference=OTHER)
    with pytest.raises(ValueError, match="one per row"):
        model.run_with_hooks(CLEAN, fwd_hooks=hooks)
    rows = model.run_with_hooks(np.array([CLEAN, CLEAN]), fwd_hooks=hooks).data
    assert not np.allclose(rows[0], rows[1])  # each row took its own reference prompt

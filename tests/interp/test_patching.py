"""Activation patching against its definition: one cell patched by hand through run_with_hooks."""

from __future__ import annotations

import numpy as np
import pytest

from glassllm.interp import activation_patch, logit_diff
from glassllm.interp.grids import POINTS
from tests.interp.interp_models import CLEAN, CORRUPTED, random_model


@pytest.fixture
def gpt2():
    return random_model("gpt2")


def by_hand(model, name, selector, answer=7, wrong=8):
    """The metric of the corrupted run with ``act[0][selector]`` set from the clean run."""
    _, cache = model.run_with_cache(CLEAN, names=[name])

    def patch(act, _name):
        act[0][selector] = cache[name][0][selector]

    logits = model.run_with_hooks(CORRUPTED, fwd_hooks=[(name, patch)])
    return float(logit_diff(answer, wrong)(logits).data[0])


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_residual_grid_equals_patching_each_cell_by_hand(kind):
    model = random_model(kind)
    result = activation_patch(model, CLEAN, CORRUPTED, answer=7, wrong=8, batch_cells=4)
    assert result.values.shape == (2, len(CLEAN))
    for layer in range(2):
        for pos in range(len(CLEAN)):
            want = by_hand(model, f"blocks.{layer}.hook_resid_pre", (pos,))
            assert result.values[layer, pos] == pytest.approx(want, abs=1e-12)


def test_patching_every_position_at_layer_0_gives_the_clean_metric_exactly(gpt2):
    result = activation_patch(gpt2, CLEAN, CORRUPTED, answer=7, wrong=8)
    assert result.checks["full_patch_gap"] == 0.0
    clean = float(logit_diff(7, 8)(gpt2.run_with_hooks(CLEAN)).data[0])
    assert result.clean_metric == clean
    # a position the corruption did not reach before it changes nothing at layer 0
    assert result.values[0, 0] == pytest.approx(result.corrupted_metric, abs=1e-12)
    # the corrupted position carries all of it at layer 0
    assert result.values[0, 2] == pytest.approx(result.clean_metric, abs=1e-12)
    assert result.normalized[0, 2] == pytest.approx(1.0)


@pytest.mark.parametrize("point", list(POINTS))
def test_identical_prompts_give_zero_effect_at_every_point(gpt2, point):
    index = "head" if point in ("q", "k", "v", "z", "pattern", "attn_scores") else "pos"
    result = activation_patch(gpt2, CLEAN, CLEAN, point, index, answer=7, wrong=8)
    np.testing.assert_allclose(result.effect, 0.0, atol=1e-12)


@pytest.mark.parametrize(
    ("point", "index", "shape", "selector"),
    [
        ("z", "head", (2, 2), lambda p, h: (slice(None), h)),
        ("z", "pos_head", (2, 6, 2), lambda p, h: (p, h)),
        ("pattern", "head", (2, 2), lambda p, h: (h,)),
        ("pattern", "pos_head", (2, 6, 2), lambda p, h: (h, p)),
        ("v", "pos", (2, 6), lambda p, h: (p,)),
    ],
)
def test_head_grids_equal_patching_by_hand(gpt2, point, index, shape, selector):
    result = activation_patch(gpt2, CLEAN, CORRUPTED, point, index, answer=7, wrong=8)
    assert result.values.shape == shape
    name = POINTS[point]
    for layer in range(2):
        for pos in range(6) if "pos" in index else [None]:
            for head in range(2) if "head" in index else [None]:
                cell = (layer,) + tuple(i for i in (pos, head) if i is not None)
                want = by_hand(gpt2, name.format(layer=layer), selector(pos, head))
                assert result.values[cell] == pytest.approx(want, abs=1e-10)
    assert result.heads == ([] if index == "pos" else ["H0", "H1"])


def test_a_custom_metric_and_labels(gpt2):
    def prob_of_7(logits):
        return logits[:, -1, 7] * 1.0

    result = activation_patch(
        gpt2, CLEAN, CORRUPTED, "mlp_out", metric=prob_of_7, layers=[1], tokens=list("abcdef")
    )
    assert result.values.shape == (1, 6) and result.layers == (1,)
    assert result.positions == list("abcdef")
    assert result.names == ("blocks.1.hook_mlp_out",)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(corrupted=[1, 2, 3]), "same length"),
        (dict(point="blocks.{layer}.hook_nope"), "unknown hook point"),
        (dict(point="resid_pre", index="head"), "no head axis"),
        (dict(index="rows"), "index must be"),
        (dict(layers=[5]), "outside"),
        (dict(answer=None), "answer and wrong"),
        (dict(answer=99), "outside the vocabulary"),
    ],
)
def test_bad_arguments_are_one_clear_error(gpt2, kwargs, message):
    args = dict(clean=CLEAN, corrupted=CORRUPTED, answer=7, wrong=8) | kwargs
    with pytest.raises((ValueError, KeyError), match=message):
        activation_patch(gpt2, **args)


def test_a_metric_must_give_one_value_per_row(gpt2):
    with pytest.raises(ValueError, match="one value per batch row"):
        activation_patch(gpt2, CLEAN, CORRUPTED, metric=lambda logits: logits[:, -1].sum())


def test_results_as_json(gpt2):
    import json

    from glassllm.interp import direct_logit_attribution, integrated_gradients

    grid = activation_patch(gpt2, CLEAN, CORRUPTED, "z", "head", answer=7, wrong=8)
    data = json.loads(json.dumps(grid.as_dict()))
    assert data["axes"] == ["layer", "head"] and data["heads"] == ["H0", "H1"]
    np.testing.assert_allclose(data["normalized"], grid.normalized)
    dla = json.loads(json.dumps(direct_logit_attribution(gpt2, CLEAN, 7, 8).as_dict()))
    assert len(dla["labels"]) == len(dla["values"])
    ig = json.loads(json.dumps(integrated_gradients(gpt2, CLEAN, answer=7, wrong=8).as_dict()))
    assert ig["n_steps"] == 32 and len(ig["values"]) == len(CLEAN)


@pytest.mark.parametrize(("point", "heads"), [("k", 2), ("q", 4), ("pattern", 4)])
def test_grouped_query_heads_are_patched_by_hand(point, heads):
    """A Llama-shaped model with 2 key/value heads for 4 query heads: k and v grids have the KV
    heads (as TransformerLens's hook_k), q and the pattern the query heads."""
    model = random_model("llama", n_kv_head=2)
    result = activation_patch(model, CLEAN, CORRUPTED, point, "head", answer=7, wrong=8)
    assert result.values.shape == (2, heads)
    name = POINTS[point].format(layer=1)
    selector = (heads - 1,) if point == "pattern" else (slice(None), heads - 1)
    assert result.values[1, heads - 1] == pytest.approx(by_hand(model, name, selector), abs=1e-10)


def test_patched_logits_of_one_cell_give_that_cells_value(gpt2):
    from glassllm.interp import patched_logits

    result = activation_patch(gpt2, CLEAN, CORRUPTED, "z", "pos_head", answer=7, wrong=8)
    logits = patched_logits(gpt2, CLEAN, CORRUPTED, "z", layer=1, pos=2, head=1)
    assert logits.shape == (20,)
    assert logits[7] - logits[8] == pytest.approx(result.values[1, 2, 1], abs=1e-12)
    whole = patched_logits(gpt2, CLEAN, CORRUPTED, "resid_pre", layer=0)
    assert whole[7] - whole[8] == result.clean_metric


def test_a_training_model_is_patched_in_eval_mode_and_left_training():
    model = random_model("gpt2", dropout=0.5)
    model.eval()
    want = activation_patch(model, CLEAN, CORRUPTED, answer=7, wrong=8)
    model.train()
    got = activation_patch(model, CLEAN, CORRUPTED, answer=7, wrong=8)
    np.testing.assert_array_equal(got.values, want.values)
    assert model.training

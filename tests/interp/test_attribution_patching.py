"""Attribution patching: exact where the metric is linear in the activation, a first-order
estimate elsewhere (checked against finite differences of activation patching)."""

from __future__ import annotations

import numpy as np
import pytest

from glassllm.interp import activation_patch, attribution_patch
from tests.interp.interp_models import CLEAN, CORRUPTED, random_model


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_exact_where_the_logit_difference_is_linear(kind):
    """The logits are (n * w + b) @ W_U in the final norm's normalised output n: patching it is
    a linear change of the metric, and the estimate equals activation patching to rounding."""
    model = random_model(kind)
    point = "ln_final.hook_normalized"
    exact = activation_patch(model, CLEAN, CORRUPTED, point, answer=7, wrong=8)
    estimate = attribution_patch(model, CLEAN, CORRUPTED, point, answer=7, wrong=8)
    assert estimate.checks["linear"] == 1.0 and estimate.method == "attribution"
    assert np.abs(exact.effect).max() > 1e-3  # the check has something to check
    np.testing.assert_allclose(estimate.values, exact.values, atol=1e-12)


@pytest.mark.parametrize(
    ("name", "selector", "grid_cell"),
    [
        ("blocks.1.hook_resid_pre", (2,), ("resid_pre", "pos", (1, 2))),
        ("blocks.0.hook_resid_post", (5,), ("resid_post", "pos", (0, 5))),
        ("blocks.0.attn.hook_z", (slice(None), 1), ("z", "head", (0, 1))),
        ("blocks.1.attn.hook_pattern", (0, 5), ("pattern", "pos_head", (1, 5, 0))),
    ],
)
def test_the_estimate_is_the_derivative_of_patching_along_the_difference(name, selector, grid_cell):
    """Patch a cell with ``corrupted + eps (clean - corrupted)``: the metric's central
    difference over eps is the estimate, to O(eps^2) (finite differences in float64)."""
    model = random_model("gpt2")
    point, index, cell = grid_cell
    estimate = attribution_patch(model, CLEAN, CORRUPTED, point, index, answer=7, wrong=8)
    _, clean = model.run_with_cache(CLEAN, names=[name])
    _, corrupt = model.run_with_cache(CORRUPTED, names=[name])
    difference = clean[name][0] - corrupt[name][0]

    def metric_at(eps):
        def patch(act, _name):
            act[0][selector] += eps * difference[selector]

        logits = model.run_with_hooks(CORRUPTED, fwd_hooks=[(name, patch)]).data[0, -1]
        return logits[7] - logits[8]

    eps = 1e-5
    derivative = (metric_at(eps) - metric_at(-eps)) / (2 * eps)
    assert abs(derivative) > 1e-4  # a cell that matters
    assert estimate.effect[cell] == pytest.approx(derivative, rel=1e-6, abs=1e-9)


def test_the_same_grid_shapes_as_activation_patching():
    model = random_model("llama")
    for point, index in [("resid_mid", "pos"), ("k", "head"), ("z", "pos_head")]:
        exact = activation_patch(model, CLEAN, CORRUPTED, point, index, answer=7, wrong=8)
        estimate = attribution_patch(model, CLEAN, CORRUPTED, point, index, answer=7, wrong=8)
        assert estimate.values.shape == exact.values.shape
        assert estimate.clean_metric == exact.clean_metric
        assert estimate.corrupted_metric == pytest.approx(exact.corrupted_metric, abs=1e-12)
        assert estimate.checks["linear"] == 0.0

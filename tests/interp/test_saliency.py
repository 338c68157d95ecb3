"""Gradient x input and integrated gradients: against finite differences and completeness."""

from __future__ import annotations

import numpy as np
import pytest

from glassllm.interp import gradient_x_input, integrated_gradients, logit_diff
from glassllm.interp.saliency import path_quadrature
from tests.interp.interp_models import CLEAN, random_model


def metric_with_embedding(model, embedding):
    logits = model.run_with_hooks(CLEAN, fwd_hooks=[("hook_embed", lambda a, n: embedding)])
    return float(logit_diff(7, 8)(logits).data[0])


def test_gradient_x_input_is_the_directional_derivative_along_each_token_embedding():
    """score[p] = d/ds f(e with row p scaled by 1 + s) at s = 0: a central finite difference."""
    model = random_model("gpt2")
    result = gradient_x_input(model, CLEAN, answer=7, wrong=8)
    _, cache = model.run_with_cache(CLEAN, names=["hook_embed"])
    embed = cache["hook_embed"]
    h = 1e-6
    for p in range(len(CLEAN)):
        up, down = embed.copy(), embed.copy()
        up[0, p] *= 1 + h
        down[0, p] *= 1 - h
        derivative = (metric_with_embedding(model, up) - metric_with_embedding(model, down)) / (
            2 * h
        )
        assert result.values[p] == pytest.approx(derivative, rel=1e-6, abs=1e-9)
    assert result.gap is None and result.method == "gradient_x_input"


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_integrated_gradients_complete_at_the_default(dtype):
    model = random_model("gpt2", dtype=dtype)
    result = integrated_gradients(model, CLEAN, answer=7, wrong=8)
    zero = metric_with_embedding(model, np.zeros((1, len(CLEAN), 16), dtype=dtype))
    assert result.baseline_metric == pytest.approx(zero, abs=1e-6)
    assert result.metric == pytest.approx(metric_with_embedding(model, None), abs=1e-6)
    assert result.values.sum() - result.target == pytest.approx(result.gap, abs=1e-12)
    assert abs(result.gap) < 1e-3 * abs(result.target)
    assert (result.n_steps, result.quadrature) == (32, "gauss-legendre")


@pytest.mark.parametrize("quadrature", ["gauss-legendre", "midpoint"])
def test_the_completeness_gap_shrinks_with_steps(quadrature):
    model = random_model("gpt2")
    gaps = [
        abs(
            integrated_gradients(
                model, CLEAN, answer=7, wrong=8, n_steps=n, quadrature=quadrature
            ).gap
        )
        for n in (4, 16, 64)
    ]
    assert gaps[0] > gaps[1] > gaps[2] or gaps[2] < 1e-12


def test_the_geometric_rule_handles_the_zero_baseline_trap_of_a_rotary_model():
    """With rotary positions the token embedding is the whole residual stream, and scaled by t
    the norms make f jump near t = 0 (at t ~ 1e-6 here): Gauss-Legendre on [0, 1] misses it,
    the geometric panels converge."""
    model = random_model("llama")
    plain = integrated_gradients(model, CLEAN, answer=7, wrong=8, n_steps=128)
    gaps = [
        abs(
            integrated_gradients(
                model, CLEAN, answer=7, wrong=8, n_steps=n, quadrature="geometric"
            ).gap
        )
        for n in (44, 176)
    ]
    assert abs(plain.gap) > 0.1 * abs(plain.target)
    assert gaps[1] < gaps[0] and gaps[1] < 1e-3 * abs(plain.target)


def test_a_baseline_token_starts_the_path_at_its_embedding():
    model = random_model("gpt2")
    result = integrated_gradients(model, CLEAN, answer=7, wrong=8, baseline_token=0)
    pad = np.broadcast_to(model.wte.weight.data[0], (1, len(CLEAN), 16))
    assert result.baseline_metric == pytest.approx(metric_with_embedding(model, pad), abs=1e-12)
    assert abs(result.gap) < 1e-6 * max(1.0, abs(result.target))


@pytest.mark.parametrize("rule", ["gauss-legendre", "geometric", "midpoint"])
def test_each_rule_integrates_on_0_1(rule):
    nodes, weights = path_quadrature(rule, 44)
    assert weights.sum() == pytest.approx(1.0) and ((nodes > 0) & (nodes < 1)).all()
    assert weights @ nodes**3 == pytest.approx(0.25, rel=1e-3)


def test_bad_rules():
    with pytest.raises(ValueError, match="quadrature must be"):
        path_quadrature("simpson", 8)
    with pytest.raises(ValueError, match="n_steps"):
        path_quadrature("midpoint", 0)

"""glassllm.app.stats: per-step statistics that read the step and never change it."""

import json
import math

import numpy as np
import pytest

import glassllm
from glassllm import Tensor
from glassllm.app.stats import StepStats, rms, total_grad_norm, was_clipped
from glassllm.models import GPT, GPTConfig
from glassllm.nn.utils import clip_grad_norm_


def make_run():
    config = GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8, bias=True)
    model = GPT(config, rng=np.random.default_rng(0))
    optimizer = model.configure_optimizer(lr=1e-2, weight_decay=0.1)
    return model, optimizer


def steps(with_stats, n=3, clip=0.05):
    glassllm.manual_seed(5)
    model, optimizer = make_run()
    data_rng = np.random.default_rng(1)
    records = []
    stats = StepStats(model.named_parameters())
    for i in range(n):
        x = data_rng.integers(0, 13, (2, 8))
        y = data_rng.integers(0, 13, (2, 8))
        _, loss = model(x, y)
        loss.backward()
        norm = clip_grad_norm_(model.parameters(), clip)
        if with_stats:
            stats.before_update()
        optimizer.step()
        if with_stats:
            records.append(stats.after_update(i + 1, float(loss.data), 1e-2, norm, clip))
        optimizer.zero_grad()
    return model, optimizer, records


def test_a_run_with_stats_trains_bit_identically():
    plain_model, plain_opt, _ = steps(False)
    model, opt, records = steps(True)
    for (name, a), (_, b) in zip(
        plain_model.state_dict().items(), model.state_dict().items(), strict=True
    ):
        assert a.tobytes() == b.tobytes(), name
    for key, state in plain_opt.state.items():
        for field, value in state.items():
            assert np.array_equal(value, opt.state[key][field])
    assert len(records) == 3
    json.dumps(records, allow_nan=False)


def test_record_values_are_the_real_update():
    model, optimizer = make_run()
    x = np.arange(16).reshape(2, 8) % 13
    _, loss = model(x, (x + 1) % 13)
    loss.backward()
    norm = clip_grad_norm_(model.parameters(), 1e9)
    before = {n: (p.data.copy(), p.grad.copy()) for n, p in model.named_parameters()}
    stats = StepStats(model.named_parameters())
    stats.before_update()
    optimizer.step()
    record = stats.after_update(7, float(loss.data), 0.01, norm, 1e9)
    assert record["iter"] == 7 and record["clipped"] is False
    assert record["grad_norm"] == pytest.approx(total_grad_norm(model.parameters()))
    assert list(record["params"]) == [n for n, _ in model.named_parameters()]
    for name, param in model.named_parameters():
        w, g = before[name]
        w_rms, g_rms, ratio = record["params"][name]
        assert w_rms == pytest.approx(np.sqrt(np.mean(w.astype(np.float64) ** 2)))
        assert g_rms == pytest.approx(np.sqrt(np.mean(g.astype(np.float64) ** 2)))
        delta = param.data.astype(np.float64) - w
        if w_rms == 0:  # zero-initialised biases: the ratio is undefined
            assert ratio is None
        else:
            expected = math.log10(np.sqrt(np.mean(delta**2)) / w_rms)
            assert ratio == pytest.approx(expected, abs=1e-4)
    assert any(v[2] is None for v in record["params"].values())  # biases start at 0


def test_clipped_flag_follows_clip_grad_norm():
    _, _, records = steps(True, n=1, clip=1e-3)
    assert records[0]["clipped"] is True
    _, _, records = steps(True, n=1, clip=1e6)
    assert records[0]["clipped"] is False
    assert was_clipped(2.0, 0.0) is False
    assert was_clipped(float("nan"), 1.0) is True


def test_non_finite_numbers_become_none_and_order_is_enforced():
    w = Tensor(np.ones(3), requires_grad=True)
    stats = StepStats([("w", w)])
    with pytest.raises(RuntimeError, match="before_update"):
        stats.after_update(1, 0.0, 0.1, 0.0, 1.0)
    stats.before_update()
    record = stats.after_update(1, float("nan"), 0.1, float("inf"), 0.0)
    assert record["loss"] is None and record["grad_norm"] is None
    assert record["params"]["w"] == [1.0, 0.0, None]  # no gradient, no update
    assert rms(np.zeros(0)) == 0.0
    with pytest.raises(TypeError, match="not a Tensor"):
        StepStats([("w", np.ones(2))])

"""The GPT's hook points, run_with_cache, run_with_hooks and hooks(): every name and shape in
every family, cached logits equal to model(ids), the fused attention kept, replacements doing
what the unfused maths says, gradients against finite differences, generation with hooks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_gpt_families import FAMILIES, perturbed

import glassllm.functional as F
from glassllm import Tensor, gradcheck, no_grad
from glassllm.models import GPT, GPTConfig

IDS = np.array([[1, 2, 3, 4, 5, 6], [3, 1, 4, 1, 5, 9]])


@pytest.fixture(params=list(FAMILIES))
def family(request) -> str:
    return request.param


def expected_shapes(model: GPT, B: int, T: int) -> dict[str, tuple]:
    """The documented names and shapes (glassllm.models.hooks), from the model's sizes."""
    config = model.config
    attn = model.blocks[0].attn
    E, H, KV, hd = config.n_embd, attn.num_heads, attn.num_kv_heads, attn.head_size
    M = config.mlp_size
    shapes = {"hook_embed": (B, T, E)}
    if config.positions == "learned":
        shapes["hook_pos_embed"] = (B, T, E)
    norm = {"hook_scale": (B, T, 1), "hook_normalized": (B, T, E)}
    for i in range(config.n_layer):
        p = f"blocks.{i}."
        shapes[p + "hook_resid_pre"] = (B, T, E)
        shapes.update({f"{p}ln1.{k}": v for k, v in norm.items()})
        shapes[p + "attn.hook_q"] = (B, T, H, hd)
        shapes[p + "attn.hook_k"] = shapes[p + "attn.hook_v"] = (B, T, KV, hd)
        if config.qk_norm:  # applied per head in the (B, heads, T, hd) layout
            for which, heads in (("q", H), ("k", KV)):
                shapes[f"{p}attn.{which}_norm.hook_scale"] = (B, heads, T, 1)
                shapes[f"{p}attn.{which}_norm.hook_normalized"] = (B, heads, T, hd)
        if config.positions == "rotary":
            shapes[p + "attn.hook_rot_q"] = (B, T, H, hd)
            shapes[p + "attn.hook_rot_k"] = (B, T, KV, hd)
        shapes[p + "attn.hook_attn_scores"] = shapes[p + "attn.hook_pattern"] = (B, H, T, T)
        shapes[p + "attn.hook_z"] = (B, T, H, hd)
        shapes[p + "hook_attn_out"] = (B, T, E)
        if not config.parallel_residual:
            shapes[p + "hook_resid_mid"] = (B, T, E)
        shapes.update({f"{p}ln2.{k}": v for k, v in norm.items()})
        shapes[p + "mlp.hook_pre"] = shapes[p + "mlp.hook_post"] = (B, T, M)
        if config.mlp == "swiglu":
            shapes[p + "mlp.hook_pre_linear"] = (B, T, M)
        shapes[p + "hook_mlp_out"] = shapes[p + "hook_resid_post"] = (B, T, E)
    shapes.update({f"ln_final.{k}": v for k, v in norm.items()})
    return shapes


def test_every_hook_point_exists_with_its_documented_shape(family):
    model = perturbed(FAMILIES[family])
    logits, cache = model.run_with_cache(IDS)
    expected = expected_shapes(model, *IDS.shape)
    assert sorted(model.hook_points()) == sorted(expected)
    assert {name: cache[name].shape for name in cache} == expected
    assert all(point.name == name for name, point in model.hook_points().items())


def test_cached_logits_are_the_models_own_exactly(family):
    model = perturbed(FAMILIES[family])
    with no_grad():
        plain = model(IDS)[0].data
    logits, cache = model.run_with_cache(IDS)
    assert np.array_equal(logits.data, plain)
    last = f"blocks.{model.config.n_layer - 1}.hook_resid_post"
    with no_grad():  # the cache holds what the forward computed: the final norm of the last stream
        assert np.array_equal(model.ln_f(Tensor(cache[last])).data, model.hidden_states(IDS).data)
    # one sequence (1-D ids) is a batch of one, the batch axis kept
    single, single_cache = model.run_with_cache(IDS[0], names="hook_embed")
    assert single_cache["hook_embed"].shape == (1, 6, model.config.n_embd)
    assert np.array_equal(single.data, model.run_with_cache(IDS[:1])[0].data)


def test_reading_q_k_v_z_and_the_pattern_keeps_the_fused_attention(monkeypatch):
    model = perturbed(FAMILIES["gpt2"])
    with no_grad():
        plain = model(IDS)[0].data
    calls = []
    fused = F.packed_attention
    monkeypatch.setattr(F, "packed_attention", lambda *a, **k: calls.append(1) or fused(*a, **k))
    names = lambda n: n.endswith(("hook_q", "hook_k", "hook_v", "hook_z", "hook_pattern"))  # noqa: E731
    logits, cache = model.run_with_cache(IDS, names)
    assert len(calls) == model.config.n_layer and np.array_equal(logits.data, plain)
    same = model.run_with_hooks(IDS, [(names, lambda a, n: a.copy())])  # equal: no replacement
    assert len(calls) == 2 * model.config.n_layer and np.array_equal(same.data, plain)
    qkvz = lambda n: n.endswith(("hook_q", "hook_k", "hook_v", "hook_z"))  # noqa: E731
    edited = model.run_with_hooks(IDS, [(qkvz, lambda a, n: a * 1.5)])
    assert len(calls) == 3 * model.config.n_layer and not np.allclose(edited.data, plain)


def test_the_cached_pattern_is_the_softmax_of_the_masked_scores(family):
    model = perturbed(FAMILIES[family])
    _, cache = model.run_with_cache(IDS)
    scores = cache["blocks.0.attn.hook_attn_scores"]
    pattern = cache["blocks.0.attn.hook_pattern"]
    above = np.triu(np.ones((6, 6), dtype=bool), 1)
    assert np.isneginf(scores[..., above]).all() and (pattern[..., above] == 0).all()
    np.testing.assert_allclose(pattern.sum(-1), 1.0, rtol=1e-6)
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_allclose(pattern, expected / expected.sum(-1, keepdims=True), atol=1e-6)


def test_replacing_the_pattern_changes_z_as_the_unfused_maths_says(family):
    model = perturbed(FAMILIES[family])
    attn = model.blocks[0].attn
    group = attn.num_heads // attn.num_kv_heads

    def uniform_head_0(pattern, name):  # head 0 attends evenly to itself and everything before
        pattern[:, 0] = np.tril(np.ones((6, 6))) / np.arange(1, 7)[:, None]

    with model.hooks([("blocks.0.attn.hook_pattern", uniform_head_0)]):
        logits, cache = model.run_with_cache(IDS)
    v = cache["blocks.0.attn.hook_v"][:, :, 0 // group]  # (B, T, hd): head 0's kv head
    expected = np.cumsum(v, axis=1) / np.arange(1, 7)[None, :, None]
    np.testing.assert_allclose(cache["blocks.0.attn.hook_z"][:, :, 0], expected, atol=1e-5)
    _, clean = model.run_with_cache(IDS)  # the other heads as before (to rounding: unfused)
    np.testing.assert_allclose(
        cache["blocks.0.attn.hook_z"][:, :, 1:], clean["blocks.0.attn.hook_z"][:, :, 1:], atol=1e-5
    )
    assert not np.allclose(logits.data, model.run_with_cache(IDS, [])[0].data, atol=1e-4)


def test_replaced_scores_go_through_the_softmax_as_they_are():
    model = perturbed(FAMILIES["gpt2"])
    zeros = [("blocks.1.attn.hook_attn_scores", lambda s, n: np.zeros_like(s))]  # no mask left
    with model.hooks(zeros):
        _, cache = model.run_with_cache(IDS, "blocks.1.attn.hook_pattern")
    np.testing.assert_allclose(cache["blocks.1.attn.hook_pattern"], 1 / 6, rtol=1e-6)


def test_unknown_names_are_errors_and_attach_nothing():
    model = perturbed(FAMILIES["gpt2"])
    with pytest.raises(KeyError, match="hook_resid_pre"):  # the close match is suggested
        model.run_with_cache(IDS, ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_pr"])
    with pytest.raises(KeyError, match="unknown hook point"):
        model.run_with_hooks(IDS, [("hook_embed", print), ("blocks.9.hook_z", print)])
    with pytest.raises(ValueError, match="selects no hook point"):
        model.run_with_cache(IDS, lambda name: name.endswith("hook_resid_mid_typo"))
    with pytest.raises(TypeError, match="callable"):
        model.run_with_hooks(IDS, [("hook_embed", None)])
    _, cache = model.run_with_cache(IDS, "hook_embed")
    with pytest.raises(KeyError, match="not in this cache"):
        cache["blocks.0.hook_resid_pre"]
    assert not any(m._forward_hooks for m in model.modules())


def test_a_raising_hook_leaves_no_hook_behind_and_the_mode_comes_back():
    model = perturbed(FAMILIES["gpt2"]).train()

    def boom(array, name):
        raise RuntimeError(f"boom at {name}")

    with pytest.raises(RuntimeError, match="boom at blocks.1.hook_resid_pre"):
        model.run_with_hooks(
            IDS, [("hook_embed", lambda a, n: None), (lambda n: n.startswith("blocks.1."), boom)]
        )
    with pytest.raises(RuntimeError, match="boom"), model.hooks([("hook_embed", boom)]):
        model(IDS)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert all(m.training for m in model.modules())
    model.run_with_cache(IDS, metric=lambda logits: logits.sum())
    assert all(m.training for m in model.modules())


def test_a_replacement_of_the_wrong_shape_is_an_error():
    model = perturbed(FAMILIES["gpt2"])
    with pytest.raises(ValueError, match=r"hook on 'hook_embed' returned shape \(2, 6\)"):
        model.run_with_hooks(IDS, [("hook_embed", lambda a, n: a[..., 0])])


@pytest.mark.parametrize(
    "name",
    [
        "hook_embed",
        "hook_pos_embed",
        "blocks.0.hook_resid_pre",
        "blocks.0.attn.hook_q",
        "blocks.0.attn.hook_v",
        "blocks.0.attn.hook_attn_scores",
        "blocks.0.attn.hook_pattern",
        "blocks.1.ln1.hook_scale",
        "blocks.1.mlp.hook_post",
        "ln_final.hook_normalized",
    ],
)
def test_metric_gradients_match_finite_differences(name):
    """cache.grads[name] . d against the metric's central difference along d, the activation
    moved by a hook adding eps * d (the library's own replacement path)."""
    config = dataclasses.replace(FAMILIES["gpt2"], vocab_size=11, block_size=6)
    model = perturbed(config, dtype=np.float64)
    ids = IDS % 11
    metric = lambda logits: logits[:, -1, 3].sum() - logits[:, -1, 5].sum()  # noqa: E731
    before = [p.grad for p in model.parameters()]
    _, cache = model.run_with_cache(ids, metric=metric)
    assert [p.grad for p in model.parameters()] == before  # the parameters' grads untouched
    d = np.random.default_rng(0).standard_normal(cache[name].shape)
    if name.endswith("hook_attn_scores"):
        d[..., np.triu(np.ones((6, 6), dtype=bool), 1)] = 0.0  # -inf + eps stays -inf
    eps = 1e-6

    def moved(sign: float) -> float:
        with no_grad():
            logits = model.run_with_hooks(ids, [(name, lambda a, n: a + sign * eps * d)])
        return float(metric(logits).data)

    numeric = (moved(1.0) - moved(-1.0)) / (2 * eps)
    analytic = float(np.sum(np.where(np.isfinite(cache.grads[name]), cache.grads[name], 0) * d))
    assert analytic == pytest.approx(numeric, rel=1e-5, abs=1e-7)


def test_gradients_flow_through_a_numpy_replacement_to_the_parameters():
    """A steering vector added by a NumPy hook: the logits' gradient with respect to the
    parameters is that of the model with the vector added in the graph (finite differences)."""
    config = dataclasses.replace(FAMILIES["llama"], vocab_size=11, block_size=6)
    model = perturbed(config, dtype=np.float64)
    direction = np.random.default_rng(3).standard_normal(config.n_embd)
    steer = [("blocks.0.hook_resid_post", lambda a, n: a + 0.5 * direction)]
    ids = IDS % 11
    params = [model.ln_f.weight, model.blocks[1].mlp.up.weight]
    assert gradcheck(lambda *_: model.run_with_hooks(ids, steer)[:, -2:], params)


def test_generation_with_hooks_and_the_kv_cache(family):
    model = perturbed(FAMILIES[family])
    prompt = IDS[:, :3]
    plain = model.generate(prompt, 5, top_k=1)
    shapes = []
    record = [("blocks.1.attn.hook_pattern", lambda p, n: shapes.append(p.shape))]
    read_everything = (lambda n: True, lambda a, n: None)
    with model.hooks([*record, read_everything]):
        assert np.array_equal(model.generate(prompt, 5, top_k=1), plain)
        assert np.array_equal(model.generate(prompt, 5, top_k=1, use_cache=False), plain)
    H = model.blocks[1].attn.num_heads
    cached = [(2, H, 3, 3)] + [(2, H, 1, 4 + i) for i in range(4)]
    uncached = [(2, H, 3 + i, 3 + i) for i in range(5)]
    assert shapes == cached + uncached
    direction = 4.0 * np.random.default_rng(0).standard_normal(model.config.n_embd)
    with model.hooks([("blocks.0.hook_resid_post", lambda a, n: a + direction)]):
        steered = model.generate(prompt, 5, top_k=1)
    assert not np.array_equal(steered, plain)


def test_no_hook_attached_leaves_gpt2_training_bitwise_unchanged():
    """A hook attached and removed again leaves no trace: the same step's loss and gradients."""
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8, dropout=0.1)

    def step(attach: bool) -> list[np.ndarray]:
        model = GPT(config, rng=np.random.default_rng(0))
        with model.hooks([(lambda n: True, lambda a, n: None)] if attach else []):
            model(IDS[:, :4])  # the same dropout draws either way
        _, loss = model(IDS[:, :4], targets=IDS[:, 1:5])
        loss.backward()
        return [loss.data] + [p.grad for p in model.parameters()]

    assert all(np.array_equal(a, b) for a, b in zip(step(False), step(True), strict=True))


def test_a_replaced_module_is_found_again_never_hooked_silently_in_vain():
    model = perturbed(FAMILIES["gpt2"])
    model.run_with_cache(IDS)  # the model keeps its index of points
    fresh = type(model.blocks[1])(model.config, np.random.default_rng(5), np.float32, 1)
    model.blocks[1] = fresh
    _, cache = model.run_with_cache(IDS, "blocks.1.hook_resid_pre")
    assert "blocks.1.hook_resid_pre" in cache
    seen = []
    model.run_with_hooks(IDS, [("blocks.1.attn.hook_z", lambda a, n: seen.append(n))])
    assert seen == ["blocks.1.attn.hook_z"]
    assert model.hook_points()["blocks.1.attn.hook_z"] is fresh.attn.hook_z

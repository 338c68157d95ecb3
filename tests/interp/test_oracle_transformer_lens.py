"""transformer_lens.patching as the oracle: a random GPT-2-shaped model built in glassllm and in
TransformerLens from the same weights (no download, no folding or centring), and the patching
grids of both on the same prompts.

An optional oracle (`optional`: it fails under CI=true when missing, as tests/models' hook
oracle). Checked with TransformerLens 2.18 installed beside torch by ``pip install --no-deps
transformer-lens einops fancy_einsum jaxtyping typeguard beartype better_abc wadler_lindig``.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import optional

from glassllm import interp
from tests.interp.interp_models import CLEAN, CORRUPTED, random_model


@pytest.fixture(scope="module")
def tl():
    return optional("transformer_lens")


@pytest.fixture(scope="module")
def torch():
    return optional("torch")


def twin(model, tl, torch):
    """The TransformerLens HookedTransformer with ``model``'s weights."""
    c = model.config
    H, E = c.n_head, c.n_embd
    hd = E // H
    cfg = tl.HookedTransformerConfig(
        n_layers=c.n_layer,
        d_model=E,
        n_ctx=c.block_size,
        d_head=hd,
        n_heads=H,
        d_vocab=c.vocab_size,
        d_mlp=c.mlp_size,
        act_fn="gelu_new",
        normalization_type="LN",
        device="cpu",
        dtype=torch.float64,
        eps=c.norm_eps,
    )
    hooked = tl.HookedTransformer(cfg)
    sd = {name: torch.tensor(t) for name, t in model.state_dict().items()}
    new = {"embed.W_E": sd["wte.weight"], "pos_embed.W_pos": sd["wpe.weight"]}
    for i in range(c.n_layer):
        p, q = f"blocks.{i}.", f"blocks.{i}."
        new[q + "ln1.w"], new[q + "ln1.b"] = sd[p + "ln_1.weight"], sd[p + "ln_1.bias"]
        new[q + "ln2.w"], new[q + "ln2.b"] = sd[p + "ln_2.weight"], sd[p + "ln_2.bias"]
        w, b = sd[p + "attn.qkv.weight"], sd[p + "attn.qkv.bias"]  # (E, 3E): q | k | v
        for j, part in enumerate("QKV"):
            new[q + f"attn.W_{part}"] = w[:, j * E : (j + 1) * E].reshape(E, H, hd).permute(1, 0, 2)
            new[q + f"attn.b_{part}"] = b[j * E : (j + 1) * E].reshape(H, hd)
        new[q + "attn.W_O"] = sd[p + "attn.proj.weight"].reshape(H, hd, E)
        new[q + "attn.b_O"] = sd[p + "attn.proj.bias"]
        new[q + "mlp.W_in"], new[q + "mlp.b_in"] = sd[p + "mlp.fc.weight"], sd[p + "mlp.fc.bias"]
        new[q + "mlp.W_out"] = sd[p + "mlp.proj.weight"]
        new[q + "mlp.b_out"] = sd[p + "mlp.proj.bias"]
    new["ln_final.w"], new["ln_final.b"] = sd["ln_f.weight"], sd["ln_f.bias"]
    new["unembed.W_U"] = sd["wte.weight"].T.contiguous()
    new["unembed.b_U"] = torch.zeros(c.vocab_size, dtype=torch.float64)
    hooked.load_state_dict(new, strict=False)
    return hooked


@pytest.fixture(scope="module")
def pair(tl, torch):
    model = random_model("gpt2")
    return model, twin(model, tl, torch)


def tl_metric(logits):
    return (logits[0, -1, 7] - logits[0, -1, 8]).detach()


def test_the_twins_agree_on_logits_and_every_shared_hook_point(pair, torch):
    model, hooked = pair
    logits, cache = model.run_with_cache(CLEAN)
    tl_logits, tl_cache = hooked.run_with_cache(torch.tensor([CLEAN]))
    np.testing.assert_allclose(logits.data, tl_logits.detach().numpy(), atol=1e-10)
    # hook_normalized is left to tests/models (TransformerLens 2.x's unfolded LayerNorm hooks
    # its output after the gain and bias there, glassllm's is before them)
    shared = [name for name in cache if name in tl_cache and "hook_normalized" not in name]
    assert len(shared) > 20
    for name in shared:
        np.testing.assert_allclose(
            cache[name], tl_cache[name].detach().numpy(), atol=1e-10, err_msg=name
        )


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (("resid_pre", "pos"), "get_act_patch_resid_pre"),
        (("resid_mid", "pos"), "get_act_patch_resid_mid"),
        (("attn_out", "pos"), "get_act_patch_attn_out"),
        (("mlp_out", "pos"), "get_act_patch_mlp_out"),
        (("z", "head"), "get_act_patch_attn_head_out_all_pos"),
        (("v", "head"), "get_act_patch_attn_head_v_all_pos"),
        (("pattern", "head"), "get_act_patch_attn_head_pattern_all_pos"),
        (("z", "pos_head"), "get_act_patch_attn_head_out_by_pos"),
    ],
)
def test_patching_grids_equal_transformer_lens(pair, torch, ours, theirs):
    patching = optional("transformer_lens.patching")
    model, hooked = pair
    _, clean_cache = hooked.run_with_cache(torch.tensor([CLEAN]))
    want = getattr(patching, theirs)(hooked, torch.tensor([CORRUPTED]), clean_cache, tl_metric)
    got = interp.activation_patch(model, CLEAN, CORRUPTED, *ours, answer=7, wrong=8)
    np.testing.assert_allclose(got.values, want.detach().numpy(), atol=1e-10)

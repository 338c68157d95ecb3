"""Direct logit attribution: the parts add up to the model's logit difference, and each part is
what the model's own arithmetic makes of that component."""

from __future__ import annotations

import numpy as np
import pytest

from glassllm.interp import direct_logit_attribution
from tests.interp.interp_models import CLEAN, random_model

CONFIGS = {
    "gpt2": ("gpt2", {}),
    "gpt2 untied, parallel": ("gpt2", dict(tied_head=False, parallel_residual=True)),
    "llama": ("llama", {}),
    "llama untied": ("llama", dict(tied_head=False)),
}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_parts_sum_to_the_logit_difference(config, dtype):
    kind, overrides = CONFIGS[config]
    model = random_model(kind, dtype=dtype, **overrides)
    for position in (-1, 2):
        result = direct_logit_attribution(model, CLEAN, answer=7, wrong=8, position=position)
        logits = model.run_with_hooks(CLEAN).data[0, position].astype(np.float64)
        tolerance = 1e-12 if dtype == np.float64 else 1e-5
        assert result.logit_diff == pytest.approx(logits[7] - logits[8], abs=tolerance)
        assert abs(result.gap) < tolerance
        assert result.values.sum() - result.logit_diff == pytest.approx(result.gap)


def test_the_parts_and_their_labels():
    model = random_model("gpt2")
    result = direct_logit_attribution(model, CLEAN, 7, 8)
    assert result.labels == [
        "embed", "pos_embed",
        "L0H0", "L0H1", "L0 attn bias", "L0 mlp",
        "L1H0", "L1H1", "L1 attn bias", "L1 mlp",
        "ln_final bias",
    ]  # fmt: skip
    assert result.heads.shape == (2, 2) and result.mlps.shape == (2,)
    assert result.values[result.labels.index("L1H0")] == result.heads[1, 0]
    llama = direct_logit_attribution(random_model("llama"), CLEAN, 7, 8)
    assert "pos_embed" not in llama.labels and "ln_final bias" not in llama.labels


def test_a_head_share_is_the_change_when_its_output_is_removed_with_the_scale_frozen():
    """Zeroing head (1, 0)'s z at the last position, with the final norm's scale and the last
    MLP's output (which reads the head's output) held at their forward values, moves the logit
    difference by exactly that head's share."""
    model = random_model("gpt2")
    result = direct_logit_attribution(model, CLEAN, 7, 8)
    names = ["ln_final.hook_scale", "blocks.1.hook_mlp_out"]
    _, cache = model.run_with_cache(CLEAN, names=names)
    frozen, mlp_out = cache[names[0]], cache[names[1]]

    def zero_head(z, _name):
        z[0, -1, 0] = 0.0

    hooks = [
        ("blocks.1.attn.hook_z", zero_head),
        ("blocks.1.hook_mlp_out", lambda a, n: mlp_out),
        ("ln_final.hook_scale", lambda s, n: frozen),
    ]
    logits = model.run_with_hooks(CLEAN, fwd_hooks=hooks).data[0, -1]
    assert result.logit_diff - (logits[7] - logits[8]) == pytest.approx(
        result.heads[1, 0], abs=1e-12
    )


def test_bad_ids():
    with pytest.raises(ValueError, match="one sequence"):
        direct_logit_attribution(random_model("gpt2"), [CLEAN], 7, 8)

"""Experiments on a GPT through its hook points (`glassllm.models.hooks`): activation and
attribution patching, ablation, steering, direct logit attribution and token attribution.

Each experiment is one function returning a small result type that holds its arrays, its
labels and its exactness figures (a patching sweep's full-patch gap, DLA's sum-minus-logit-
difference, integrated gradients' completeness gap with its number of steps). One file per
method, its derivation in the module's docstring:

* `patching` (`activation_patch`; `patched_logits`: one cell's next-token logits) and
  `attribution_patching` (`attribution_patch`), over the grids of `grids` (a hook point per
  layer x position, head, or both);
* `ablation` (`ablate`, `ablation_hooks`): zero, mean or resampled heads, neurons, layers;
* `steering` (`steering_vector`, `generate_steered`): a contrast pair's mean difference added
  during generation;
* `dla` (`direct_logit_attribution`): each head's, MLP's and embedding's share of a logit
  difference through the final norm, its scale frozen;
* `saliency` (`gradient_x_input`, `integrated_gradients`) over the token embeddings;
* `metrics` (`logit_diff`): what the experiments measure.

>>> import numpy as np
>>> from glassllm.models import GPT, GPTConfig
>>> from glassllm import interp
>>> model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8),
...             rng=np.random.default_rng(0))
>>> result = interp.activation_patch(model, [1, 2, 3, 4], [1, 5, 3, 4], answer=6, wrong=7)
>>> result.values.shape, result.checks["full_patch_gap"]
((2, 4), 0.0)
>>> dla = interp.direct_logit_attribution(model, [1, 2, 3, 4], answer=6, wrong=7)
>>> abs(dla.gap) < 1e-6
True
"""

from glassllm.interp.ablation import AblationResult, ablate, ablation_hooks
from glassllm.interp.attribution_patching import attribution_patch
from glassllm.interp.dla import LogitAttribution, direct_logit_attribution
from glassllm.interp.grids import POINTS, PatchingResult
from glassllm.interp.metrics import logit_diff
from glassllm.interp.patching import activation_patch, patched_logits
from glassllm.interp.saliency import TokenAttribution, gradient_x_input, integrated_gradients
from glassllm.interp.steering import SteeringVector, generate_steered, steering_vector

__all__ = [
    "POINTS",
    "AblationResult",
    "LogitAttribution",
    "PatchingResult",
    "SteeringVector",
    "TokenAttribution",
    "ablate",
    "ablation_hooks",
    "activation_patch",
    "attribution_patch",
    "direct_logit_attribution",
    "generate_steered",
    "gradient_x_input",
    "integrated_gradients",
    "logit_diff",
    "patched_logits",
    "steering_vector",
]

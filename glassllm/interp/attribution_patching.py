"""Attribution patching: activation patching's first-order estimate, for every cell at once.

Patching cell c of activation a (clean value a', corrupted value a) changes the metric m by

    m(a + d) - m(a) = grad m(a) . d + O(|d|^2),   d = (a' - a) restricted to cell c

(Taylor at the corrupted run). So one forward of the clean prompt (its activations), one
forward and one backward of the corrupted prompt (its activations and ``d m / d a`` at every
hook point swept, `run_with_cache(metric=...)`), and an elementwise product summed over each
cell give the estimate for the whole grid:

    values[layer, cell] = m(corrupted) + sum over the cell of (a' - a) * d m / d a

It is exact when m is linear in the activation over the patch (the remainder vanishes): the
logit difference is linear in ``ln_final.hook_normalized`` (the logits are ``(n * w + b) @ W_U``),
so a sweep there equals activation patching to rounding; `checks["linear"]` says whether the
point is one such. Elsewhere the error is second order in the patch and can be large where
attention saturates or a norm's scale changes (Kramár et al., AtP*; Nanda's attribution
patching notes): use it to find the cells worth patching for real.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from glassllm.interp.grids import PatchingResult, grid, labels
from glassllm.interp.metrics import Metric, rows, total
from glassllm.interp.patching import default_metric, head_labels, one_blas_thread, prompt_pair

# Points at which a logit difference is exactly linear: the final norm's normalised output.
LINEAR_POINTS = ("ln_final.hook_normalized",)


def attribution_patch(
    model: Any,
    clean: Any,
    corrupted: Any,
    point: str = "resid_pre",
    index: str = "pos",
    *,
    metric: Metric | None = None,
    answer: int | None = None,
    wrong: int | None = None,
    layers: Any = None,
    tokens: Any = None,
) -> PatchingResult:
    """The attribution-patching estimate of `glassllm.interp.patching.activation_patch` with the
    same arguments (and result type, ``method="attribution"``), from two forwards and one
    backward."""
    clean_ids, corrupt_ids = prompt_pair(model, clean, corrupted)
    metric = default_metric(metric, answer, wrong)
    sweep = grid(model, point, index, clean_ids.shape[1], layers)
    names = list(sweep.names)
    with one_blas_thread(True):  # as activation_patch: small products, a busy box
        clean_logits, clean_cache = model.run_with_cache(clean_ids, names=names)
        corrupt_logits, corrupt_cache = model.run_with_cache(
            corrupt_ids, names=names, metric=total(metric)
        )
    clean_metric = float(rows(metric, clean_logits)[0])
    corrupt_metric = float(rows(metric, corrupt_logits)[0])
    estimates = []
    for name in names:
        # the product in float64: the sum over a cell is the figure compared with patching
        product = (clean_cache[name][0].astype(np.float64) - corrupt_cache[name][0]) * (
            corrupt_cache.grads[name][0]
        )
        estimates += [product[sweep.selector(cell)].sum() for cell in sweep.cells]
    return PatchingResult(
        values=corrupt_metric + sweep.place(estimates),
        clean_metric=clean_metric,
        corrupted_metric=corrupt_metric,
        names=sweep.names,
        layers=sweep.layers,
        index=sweep.index,
        positions=labels(tokens, clean_ids.shape[1]),
        heads=head_labels(sweep),
        method="attribution",
        checks={"linear": float(all(name in LINEAR_POINTS for name in names))},
    )

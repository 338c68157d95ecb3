"""Activation patching: which activations carry the difference between a clean and a corrupted
prompt.

Run the corrupted prompt, but at one hook point replace one cell of the activation (a position,
a head, or a head at a position: `glassllm.interp.grids`) by its value in the clean run, and
measure the metric. Where the metric comes back to its clean value, that cell carries what
the corruption changed; where it stays at the corrupted value, it carries none of it:

    values[layer, cell] = metric(run(corrupted, with act[layer][cell] := clean_act[layer][cell]))

Each cell is its own forward. TransformerLens runs them one by one (`generic_activation_patch`);
here the cells of one layer run as one batch: row r is the corrupted prompt with cell r
patched, and the metric gives one value per row. A transformer's rows never mix, so the batch
gives each row's metric as its own run would, to float rounding (batched matrix products may
sum in another order).

Checks that come with a residual sweep (``checks["full_patch_gap"]``): patching every position
of the first layer's point gives the clean run itself (for ``resid_pre`` at layer 0, the
embeddings: everything downstream is the clean forward), so that metric minus the clean metric
is 0 to rounding.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import numpy as np

from glassllm.autograd import no_grad
from glassllm.interp.grids import Grid, PatchingResult, grid, labels
from glassllm.interp.metrics import Metric, logit_diff, rows
from glassllm.threads import _BlasLimit

# Rows per batched forward: on the default model at 64 positions, 16 rows a batch swept faster
# than 64 (0.37 s against 0.55 s for 4 x 64 cells, one BLAS thread, a box otherwise idle).
BATCH_CELLS = 16


def activation_patch(
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
    batch_cells: int = BATCH_CELLS,
    blas_one_thread: bool = True,
) -> PatchingResult:
    """Patch each cell of ``point`` (per layer) from ``clean`` into ``corrupted`` and measure.

    ``clean``, ``corrupted``: token ids (T,) of the same length. ``metric(logits) -> (B,)``
    (`glassllm.interp.metrics`), by default ``logit_diff(answer, wrong)`` at the last position.
    ``point``, ``index``, ``layers``: the grid (`glassllm.interp.grids.grid`). ``tokens``:
    labels for the positions. ``blas_one_thread``: run the sweep's matrix products on one
    OpenBLAS thread (the count comes back after): its batches are small, and on a busy box
    (the page sweeps beside ``glassllm train``) two BLAS threads fighting for a core were
    measured 3x slower than one. Returns a `PatchingResult` (grid shape (layers, pos),
    (layers, heads) or (layers, pos, heads)); eval mode throughout, under no_grad.
    """
    clean_ids, corrupt_ids = prompt_pair(model, clean, corrupted)
    metric = default_metric(metric, answer, wrong)
    sweep = grid(model, point, index, clean_ids.shape[1], layers)
    if int(batch_cells) < 1:
        raise ValueError(f"batch_cells must be >= 1, got {batch_cells}")
    with no_grad(), one_blas_thread(blas_one_thread):
        clean_logits, clean_cache = model.run_with_cache(clean_ids, names=list(sweep.names))
        corrupt_logits = model.run_with_hooks(corrupt_ids)
        clean_metric = float(rows(metric, clean_logits)[0])
        corrupt_metric = float(rows(metric, corrupt_logits)[0])
        values = []
        for name in sweep.names:
            source = clean_cache[name][0]
            for first in range(0, len(sweep.cells), int(batch_cells)):
                cells = sweep.cells[first : first + int(batch_cells)]
                values.append(_patched_rows(model, corrupt_ids, metric, sweep, name, source, cells))
        checks = {}
        if sweep.index == "pos" and "resid" in sweep.names[0]:
            first_source = clean_cache[sweep.names[0]][0]
            everything = _patched_rows(
                model, corrupt_ids, metric, sweep, sweep.names[0], first_source, [None]
            )
            checks["full_patch_gap"] = float(everything[0] - clean_metric)
    return PatchingResult(
        values=sweep.place(np.concatenate(values)),
        clean_metric=clean_metric,
        corrupted_metric=corrupt_metric,
        names=sweep.names,
        layers=sweep.layers,
        index=sweep.index,
        positions=labels(tokens, clean_ids.shape[1]),
        heads=head_labels(sweep),
        method="activation",
        checks=checks,
    )


def patched_logits(
    model: Any,
    clean: Any,
    corrupted: Any,
    point: str,
    layer: int | None = None,
    pos: int | None = None,
    head: int | None = None,
) -> np.ndarray:
    """The last position's logits (V,) of the corrupted run with one cell of ``point`` at
    ``layer`` patched from the clean run: what a clicked cell of a sweep predicts next. ``pos``
    / ``head`` None spans that axis (both None: the whole activation)."""
    clean_ids, corrupt_ids = prompt_pair(model, clean, corrupted)
    index = (
        "pos_head"
        if pos is not None and head is not None
        else "head"
        if head is not None
        else "pos"
    )
    sweep = grid(model, point, index, clean_ids.shape[1], None if layer is None else [layer])
    name = sweep.names[0]
    cell = None if pos is None and head is None else (pos, head)
    with no_grad():
        _, cache = model.run_with_cache(clean_ids, names=[name])
        source = cache[name][0]

        def patch(act: np.ndarray, _name: str) -> np.ndarray:
            where = slice(None) if cell is None else sweep.selector(cell)
            act[0][where] = source[where]
            return act

        logits = model.run_with_hooks(corrupt_ids, fwd_hooks=[(name, patch)])
    return logits.data[0, -1].copy()


def one_blas_thread(wanted: bool) -> Any:
    """``with``: OpenBLAS on one thread inside (`glassllm.threads`' limit), where it can be set."""
    limit = _BlasLimit() if wanted else None
    return limit if limit is not None and limit.available else nullcontext()


def _patched_rows(
    model: Any,
    corrupt_ids: np.ndarray,
    metric: Metric,
    sweep: Grid,
    name: str,
    source: np.ndarray,
    cells: Any,
) -> np.ndarray:
    """The metric of ``len(cells)`` corrupted runs in one batch, row r with ``cells[r]`` of
    ``name`` set from ``source`` (the clean activation without its batch axis; a cell None
    patches the whole activation)."""
    batch = np.repeat(corrupt_ids, len(cells), axis=0)

    def patch(act: np.ndarray, _name: str) -> np.ndarray:
        for row, cell in enumerate(cells):
            where = slice(None) if cell is None else sweep.selector(cell)
            act[row][where] = source[where]
        return act

    return rows(metric, model.run_with_hooks(batch, fwd_hooks=[(name, patch)]))


def prompt_pair(model: Any, clean: Any, corrupted: Any) -> tuple[np.ndarray, np.ndarray]:
    """Two prompts as checked (1, T) id arrays of the same length."""
    pair = []
    for role, ids in (("clean", clean), ("corrupted", corrupted)):
        ids = np.asarray(ids)
        if ids.ndim == 2 and ids.shape[0] == 1:
            ids = ids[0]
        if ids.ndim != 1:
            raise ValueError(
                f"the {role} prompt must be one sequence of ids (T,), got shape {ids.shape}"
            )
        pair.append(model.check_idx(ids[None, :]))
    if pair[0].shape != pair[1].shape:
        raise ValueError(
            f"clean and corrupted prompts must have the same length, got {pair[0].shape[1]} and "
            f"{pair[1].shape[1]} tokens"
        )
    return pair[0], pair[1]


def default_metric(metric: Metric | None, answer: int | None, wrong: int | None) -> Metric:
    """``metric``, or the logit difference of ``answer`` over ``wrong`` at the last position."""
    if metric is not None:
        if answer is not None or wrong is not None:
            raise ValueError("give either metric or answer and wrong, not both")
        return metric
    if answer is None or wrong is None:
        raise ValueError(
            "give the answer and wrong tokens (the logit-difference metric) or a metric"
        )
    return logit_diff(answer, wrong)


def head_labels(sweep: Grid) -> list[str]:
    if sweep.index == "pos":
        return []
    count = sweep.shape[-1]
    return [f"H{h}" for h in range(count)]

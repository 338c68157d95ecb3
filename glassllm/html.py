"""Self-contained HTML panels for Jupyter's ``_repr_html_``: heatmaps, bars and tables drawn as
HTML tables with inline CSS, from the arrays and labels passed in.

Nothing is fetched (no CDN, no script, no stylesheet link), so a panel shows offline and in a
saved notebook exactly as it was drawn. Every label is escaped: token strings are untrusted text
(a token ``<script>`` shows as text). Each cell's number is in its ``title`` (the hover tooltip),
and in the cell itself when the grid is small enough to read. A panel is a pure function of
arrays and labels; the result types' ``_repr_html_`` methods (`glassllm.models.inspect`'s
``Inspection``, ``ActivationCache``, ``glassllm.interp``'s results) call the ones below.

>>> import numpy as np
>>> page = heatmap(np.array([[0.5, -1.0]]), ["L0"], ["<a>", "b"], title="demo")
>>> "&lt;a&gt;" in page and "<a>" not in page
True
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

import numpy as np

CELL_TEXT_MAX = 24  # columns up to which each cell prints its number
BOX = "font-family:monospace;font-size:11px;margin:4px 0"
CELL = "padding:2px 4px;border:1px solid #eee;text-align:right;min-width:14px"
HEAD = "padding:2px 4px;font-weight:normal;color:#444;white-space:nowrap"


def _fmt(value: float) -> str:
    return "nan" if not np.isfinite(value) else f"{value:.3g}"


def _colour(value: float, low: float, high: float, signed: bool) -> str:
    """A background colour: signed values blue (negative) - white - red (positive) around 0,
    unsigned ones white - blue from ``low`` to ``high``."""
    if not np.isfinite(value):
        return "#ccc"
    if signed:
        scale = max(abs(low), abs(high)) or 1.0
        t = float(np.clip(value / scale, -1.0, 1.0))
        r, g, b = (255, int(255 * (1 - t)), int(255 * (1 - t))) if t >= 0 else (
            int(255 * (1 + t)), int(255 * (1 + t)), 255)  # fmt: skip
    else:
        span = (high - low) or 1.0
        t = float(np.clip((value - low) / span, 0.0, 1.0))
        r, g, b = int(255 * (1 - 0.85 * t)), int(255 * (1 - 0.6 * t)), 255
    return f"#{r:02x}{g:02x}{b:02x}"


def _note(note: str) -> str:
    return f'<div style="color:#666">{escape(note)}</div>' if note else ""


def _range(values: np.ndarray) -> tuple[float, float, bool]:
    finite = values[np.isfinite(values)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
    return low, high, low < 0.0


def legend(low: float, high: float, signed: bool) -> str:
    """A colour bar from ``low`` to ``high`` with both ends' numbers (and 0 when signed)."""
    steps = np.linspace(low, high, 11) if not signed else np.linspace(
        -max(abs(low), abs(high)), max(abs(low), abs(high)), 11)  # fmt: skip
    swatches = "".join(
        f'<span style="display:inline-block;width:12px;height:10px;'
        f'background:{_colour(v, low, high, signed)}"></span>'
        for v in steps
    )
    middle = " 0 " if signed else " "
    return (
        f'<div style="{BOX}">colour: {_fmt(steps[0])} {swatches} {_fmt(steps[-1])}'
        f"{' (white = ' + middle.strip() + ')' if signed else ''}</div>"
    )


def heatmap(
    values: Any,
    rows: Sequence[Any],
    columns: Sequence[Any],
    title: str = "",
    row_title: str = "",
    column_title: str = "",
    note: str = "",
) -> str:
    """A 2-D array as a coloured table: ``rows`` / ``columns`` label the axes (escaped), the
    axis titles sit above the columns and beside the rows, a colour legend below."""
    grid = np.asarray(values, dtype=np.float64)
    if grid.ndim != 2 or grid.shape != (len(rows), len(columns)):
        raise ValueError(
            f"heatmap needs values of shape (rows, columns) = ({len(rows)}, {len(columns)}), "
            f"got {grid.shape}"
        )
    low, high, signed = _range(grid)
    show = grid.shape[1] <= CELL_TEXT_MAX
    head = "".join(f'<th style="{HEAD}">{escape(str(c))}</th>' for c in columns)
    body = []
    for label, line in zip(rows, grid, strict=True):
        cells = "".join(
            f'<td style="{CELL};background:{_colour(v, low, high, signed)}" '
            f'title="{escape(str(label))}, {escape(str(c))}: {_fmt(v)}">'
            f"{_fmt(v) if show else ''}</td>"
            for c, v in zip(columns, line, strict=True)
        )
        body.append(
            f'<tr><th style="{HEAD};text-align:right">{escape(str(label))}</th>{cells}</tr>'
        )
    caption = f"<b>{escape(title)}</b>" if title else ""
    return (
        f'<div style="{BOX}">{caption}'
        f'<div style="color:#666">{escape(row_title)} \u2193 \u00d7 {escape(column_title)} '
        f"\u2192</div>"
        f'<table style="border-collapse:collapse">'
        f'<tr><th style="{HEAD}"></th>{head}</tr>{"".join(body)}</table>'
        f"{legend(low, high, signed)}{_note(note)}</div>"
    )


def bars(values: Any, labels: Sequence[Any], title: str = "", note: str = "") -> str:
    """Signed values as horizontal bars, one labelled row each, the number beside the bar."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if len(values) != len(labels):
        raise ValueError(f"bars needs one label per value: {len(labels)} labels, {len(values)}")
    scale = float(np.max(np.abs(values[np.isfinite(values)]), initial=0.0)) or 1.0
    lines = []
    for label, v in zip(labels, values, strict=True):
        width = 0 if not np.isfinite(v) else int(round(100 * abs(v) / scale))
        colour = "#d33" if v >= 0 else "#36c"
        lines.append(
            f'<tr><th style="{HEAD};text-align:right">{escape(str(label))}</th>'
            f'<td style="padding:1px 4px;width:110px"><span style="display:inline-block;'
            f'height:9px;width:{width}px;background:{colour}"></span></td>'
            f'<td style="padding:1px 4px;text-align:right">{_fmt(v)}</td></tr>'
        )
    caption = f"<b>{escape(title)}</b>" if title else ""
    return (
        f'<div style="{BOX}">{caption}<table style="border-collapse:collapse">{"".join(lines)}'
        f"</table>{_note(note)}</div>"
    )


def table(headers: Sequence[Any], rows: Sequence[Sequence[Any]], title: str = "") -> str:
    """A plain table; every cell escaped."""
    head = "".join(f'<th style="{HEAD};text-align:left">{escape(str(h))}</th>' for h in headers)
    body = "".join(
        "<tr>"
        + "".join(f'<td style="{CELL};text-align:left">{escape(str(c))}</td>' for c in row)
        + "</tr>"
        for row in rows
    )
    caption = f"<b>{escape(title)}</b>" if title else ""
    return (
        f'<div style="{BOX}">{caption}<table style="border-collapse:collapse">'
        f"<tr>{head}</tr>{body}</table></div>"
    )


def tokens_line(tokens: Sequence[Any], values: Any, title: str = "") -> str:
    """Tokens in a row, each coloured by its value (a saliency map over the prompt)."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    low, high, signed = _range(values)
    spans = "".join(
        f'<span style="padding:1px 3px;margin:1px;background:{_colour(v, low, high, signed)}" '
        f'title="{escape(str(t))}: {_fmt(v)}">{escape(str(t))}</span>'
        for t, v in zip(tokens, values, strict=True)
    )
    caption = f"<b>{escape(title)}</b><br>" if title else ""
    return f'<div style="{BOX}">{caption}{spans}{legend(low, high, signed)}</div>'


def nbytes(count: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"


# The panels of the result types (each type's ``_repr_html_`` calls its own)

PANEL_MAX_HEADS = 8  # attention maps drawn by an Inspection panel
PANEL_MAX_POSITIONS = 32


def inspection_panel(inspection: Any, tokens: Sequence[Any] | None = None) -> str:
    """An `Inspection`: its sizes, the probability the logit lens gives each actual next token
    at each stage, and the attention maps of the first heads (first positions)."""
    ids = np.asarray(inspection.ids)
    labels = [str(t) for t in (tokens if tokens is not None else ids.tolist())]
    layers, heads, steps, _ = inspection.attention.shape
    shown = min(steps, PANEL_MAX_POSITIONS)
    cut = f"first {shown} of {steps} positions" if shown < steps else ""
    parts = [
        table(
            ["tokens", "layers", "heads", "attention check", "bytes"],
            [
                [
                    steps,
                    layers,
                    heads,
                    f"{inspection.attention_check:.2g}",
                    nbytes(inspection.nbytes),
                ]
            ],  # fmt: skip
            title="Inspection",
        )
    ]
    if steps > 1:
        parts.append(
            heatmap(
                inspection.lens.next_p[:, : shown - 1] if shown > 1 else inspection.lens.next_p,
                ["embed", *[f"block {i}" for i in range(layers)]],
                labels[1:shown] if shown > 1 else labels[1:],
                title="logit lens: p(actual next token)",
                row_title="stage",
                column_title="next token",
                note=cut,
            )
        )
    for n, (layer, head) in enumerate(np.ndindex(layers, heads)):
        if n == PANEL_MAX_HEADS:
            parts.append(_note(f"{layers * heads - n} more heads not drawn"))
            break
        parts.append(
            heatmap(
                inspection.attention[layer, head, :shown, :shown],
                labels[:shown],
                labels[:shown],
                title=f"attention L{layer}H{head}",
                row_title="query",
                column_title="key",
                note=cut,
            )
        )
    return "".join(parts)


def cache_panel(cache: Any) -> str:
    """An `ActivationCache`: one row per hook point (shape, dtype, bytes, gradient kept)."""
    rows = [
        [
            name,
            "x".join(map(str, cache[name].shape)),
            cache[name].dtype,
            nbytes(cache[name].nbytes),
            "yes" if name in cache.grads else "",
        ]  # fmt: skip
        for name in cache
    ]
    title = f"ActivationCache: {len(cache)} activations, {nbytes(cache.nbytes)}"
    return table(["hook point", "shape", "dtype", "bytes", "grad"], rows, title=title)


def patching_panel(result: Any) -> str:
    """A `PatchingResult`: the normalised effect (raw metric when clean = corrupted) per
    layer x position / head, one map per layer for a position x head sweep."""
    span = result.clean_metric - result.corrupted_metric
    grid, what = (result.effect / span, "normalised effect") if span else (result.values, "metric")
    rows = [str(n) if layer is None else f"L{layer}" for n, layer in zip(result.names,
            result.layers, strict=True)]  # fmt: skip
    checks = ", ".join(f"{k} {v:.3g}" for k, v in result.checks.items())
    note = (
        f"clean {result.clean_metric:.4g}, corrupted {result.corrupted_metric:.4g}; {checks}; "
        f"{result.names[0]}..."
    )
    title = f"{result.method} patching ({what})"
    if result.index != "pos_head":
        columns = result.positions if result.index == "pos" else result.heads
        return heatmap(grid, rows, columns, title, "layer", result.axes[1], note)
    return "".join(
        heatmap(
            grid[i],
            result.positions,
            result.heads,
            f"{title}, {row}",
            "position",
            "head",
            note if i == len(rows) - 1 else "",
        )  # fmt: skip
        for i, row in enumerate(rows)
    )


def logit_attribution_panel(result: Any) -> str:
    """A `LogitAttribution`: each part's bar, and the heads as a layer x head map."""
    note = (
        f"sum of parts {result.values.sum():.6g} = logit diff {result.logit_diff:.6g} "
        f"+ gap {result.gap:.2g} (answer {result.answer} vs {result.wrong}, position "
        f"{result.position})"
    )
    layers, heads = result.heads.shape
    return bars(result.values, result.labels, "direct logit attribution", note) + heatmap(
        result.heads, [f"L{i}" for i in range(layers)], [f"H{h}" for h in range(heads)],
        "heads' direct logit attribution", "layer", "head")  # fmt: skip


def token_attribution_panel(result: Any) -> str:
    """A `TokenAttribution`: the prompt coloured by each token's share, and the bars."""
    note = f"metric {result.metric:.4g}"
    if result.gap is not None:
        note += (
            f"; sum {result.values.sum():.6g} vs f(x) - f(baseline) {result.target:.6g}, "
            f"gap {result.gap:.2g} at {result.n_steps} {result.quadrature} steps"
        )
    title = result.method.replace("_", " ")
    return tokens_line(result.tokens, result.values, title) + bars(
        result.values, result.tokens, note=note
    )


def ablation_panel(result: Any, top: int = 8, tokens: Sequence[Any] | None = None) -> str:
    """An `AblationResult`: the next-token probabilities of the most likely tokens (before or
    after the ablation), side by side, and the KL divergence."""
    order = np.argsort(-np.maximum(result.base_probs, result.probs), kind="stable")[:top]
    name = (lambda i: str(tokens[i])) if tokens is not None else str
    rows = [
        [
            name(int(i)),
            f"{result.base_probs[i]:.4f}",
            f"{result.probs[i]:.4f}",
            f"{result.probs[i] - result.base_probs[i]:+.4f}",
        ]  # fmt: skip
        for i in order
    ]
    title = f"ablation ({result.how}) of {', '.join(result.parts)}: KL {result.kl:.4g} nats"
    return table(["next token", "p before", "p ablated", "change"], rows, title=title)

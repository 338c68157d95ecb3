"""Which input tokens a metric rests on: gradient x input, and integrated gradients over the
token embeddings, with completeness checked.

Both work on the token embedding ``e = hook_embed`` (B, T, E), the model's input after the
lookup; position is held fixed (a learned position embedding is added after ``hook_embed``,
rotary positions act inside attention), so a token's score is about *what* it is, not where.

**Gradient x input** (saliency): ``score[p] = sum_e (d f / d e)[p, e] * e[p, e]``, from one
forward and one backward. It is the first-order share of each token in ``f(e) - f(0)``, exact
only for an f linear in e.

**Integrated gradients** (Sundararajan et al.): along the straight path from a baseline ``b``
to ``e``,

    IG[p, e] = (e - b)[p, e] * integral_0^1 (d f / d e)(b + t (e - b))[p, e] dt

and by the fundamental theorem of calculus along the path (completeness) the scores add up to
``f(e) - f(b)``. The integral is a quadrature, so ``gap = sum(IG) - (f(e) - f(b))`` is its
error, reported beside ``n_steps``. Baseline: the zero embedding (with learned positions the
path starts at the position embedding alone, not at a zero residual), or ``baseline_token``'s
embedding at every position (a pad token). Quadrature: Gauss-Legendre on [0, 1] (exact for a
polynomial integrand of degree < 2 n_steps), ``"geometric"`` (Gauss-Legendre on panels
[0, 1e-10], [1e-10, 1e-9], ..., [0.1, 1]: for an integrand sharp near t = 0, as a zero
baseline gives when the whole residual stream is scaled by t, a rotary model's case: the
norm's ``LN(t x)`` changes only while ``t^2 var(x)`` is near ``eps``, and each later norm
amplifies, so f can jump at t ~ 1e-6), or ``"midpoint"`` (Captum's ``riemann_middle``, for
comparison). The path points run as batches of `PATH_ROWS`: a forward and a backward each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from glassllm.autograd import no_grad
from glassllm.interp.grids import labels
from glassllm.interp.metrics import Metric, rows, total
from glassllm.interp.patching import default_metric

QUADRATURES = ("gauss-legendre", "geometric", "midpoint")
PATH_ROWS = 64  # path points per batched forward
GEOMETRIC_DECADES = 10  # the geometric rule's panels: [0, 1e-10], then one per decade to 1


@dataclass
class TokenAttribution:
    """``values[p]``: position p's share of the metric. ``method`` ``"gradient_x_input"`` or
    ``"integrated_gradients"``; for the latter ``target = f(input) - f(baseline)``, ``gap =
    values.sum() - target`` (completeness), ``n_steps`` and ``quadrature``. ``tokens``: the
    position labels."""

    values: np.ndarray
    tokens: list[str]
    method: str
    metric: float
    baseline_metric: float | None = None
    gap: float | None = None
    n_steps: int | None = None
    quadrature: str | None = None

    @property
    def target(self) -> float | None:
        return None if self.baseline_metric is None else self.metric - self.baseline_metric

    def as_dict(self) -> dict:
        """JSON-ready: a score per token (what a page colours the prompt by) and, for
        integrated gradients, the completeness figures."""
        return {
            "method": self.method,
            "tokens": list(self.tokens),
            "values": self.values.tolist(),
            "metric": self.metric,
            "baseline_metric": self.baseline_metric,
            "target": self.target,
            "gap": self.gap,
            "n_steps": self.n_steps,
            "quadrature": self.quadrature,
        }

    def _repr_html_(self) -> str:  # Jupyter draws this panel instead of the repr
        from glassllm.html import token_attribution_panel

        return token_attribution_panel(self)

    def __repr__(self) -> str:
        tail = ""
        if self.gap is not None:
            tail = f"; sum {self.values.sum():.6g} vs f(x)-f(b) {self.target:.6g}, gap "
            tail += f"{self.gap:.2g} at {self.n_steps} {self.quadrature} steps"
        return f"TokenAttribution({self.method}, {len(self.values)} tokens{tail})"


def gradient_x_input(
    model: Any,
    ids: Any,
    *,
    metric: Metric | None = None,
    answer: int | None = None,
    wrong: int | None = None,
    tokens: Any = None,
) -> TokenAttribution:
    """Gradient x input of the metric (default: the logit difference of ``answer`` over
    ``wrong`` at the last position) on the token embedding of ``ids`` (T,)."""
    metric = default_metric(metric, answer, wrong)
    prompt = _prompt(model, ids)
    logits, cache = model.run_with_cache(prompt, names=["hook_embed"], metric=total(metric))
    embed = cache["hook_embed"][0].astype(np.float64)
    scores = (cache.grads["hook_embed"][0] * embed).sum(axis=-1)
    return TokenAttribution(
        scores,
        labels(tokens, prompt.shape[1]),
        "gradient_x_input",
        float(rows(metric, logits)[0]),
    )


def integrated_gradients(
    model: Any,
    ids: Any,
    *,
    metric: Metric | None = None,
    answer: int | None = None,
    wrong: int | None = None,
    n_steps: int = 32,
    quadrature: str = "gauss-legendre",
    baseline_token: int | None = None,
    tokens: Any = None,
) -> TokenAttribution:
    """Integrated gradients of the metric over the token embedding of ``ids`` (T,), from the
    zero embedding (or ``baseline_token``'s) along the straight path (see the module)."""
    metric = default_metric(metric, answer, wrong)
    prompt = _prompt(model, ids)
    nodes, weights = path_quadrature(quadrature, n_steps)
    with no_grad():
        _, cache = model.run_with_cache(prompt, names=["hook_embed"])
    embed = cache["hook_embed"][0]  # (T, E)
    if baseline_token is None:
        baseline = np.zeros_like(embed)
    else:
        token = model.check_idx(np.array([[baseline_token]]))[0, 0]
        baseline = np.broadcast_to(model.wte.weight.data[token], embed.shape)
    # the path's ends first (t = 1, t = 0: f(input), f(baseline)), then the quadrature nodes
    ts = np.concatenate([[1.0, 0.0], nodes])
    values, grads = [], []
    for first in range(0, len(ts), PATH_ROWS):
        chunk = ts[first : first + PATH_ROWS]
        f, g = _path_run(model, prompt, metric, embed, baseline, chunk)
        values.append(f)
        grads.append(g)
    f_all, g_all = np.concatenate(values), np.concatenate(grads)
    delta = embed.astype(np.float64) - baseline  # (T, E)
    averaged = np.tensordot(weights, g_all[2:], axes=1)  # (T, E): the integral of the gradient
    scores = (delta * averaged).sum(axis=-1)
    target = f_all[0] - f_all[1]
    return TokenAttribution(
        scores,
        labels(tokens, prompt.shape[1]),
        "integrated_gradients",
        float(f_all[0]),
        baseline_metric=float(f_all[1]),
        gap=float(scores.sum() - target),
        n_steps=len(nodes),
        quadrature=quadrature,
    )


def _path_run(
    model: Any,
    prompt: np.ndarray,
    metric: Metric,
    embed: np.ndarray,
    baseline: np.ndarray,
    ts: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The metric (R,) and its gradient (R, T, E) at the embeddings ``b + t (e - b)``, one
    row per ``t``: the replacement is hooked before the cache records ``hook_embed``, so the
    recorded gradient is the one at the path point."""
    batch = np.repeat(prompt, len(ts), axis=0)
    points = baseline + ts[:, None, None] * (embed.astype(np.float64) - baseline)

    def on_path(act: np.ndarray, _name: str) -> np.ndarray:
        return points.astype(act.dtype)

    with model.hooks([("hook_embed", on_path)]):
        logits, cache = model.run_with_cache(batch, names=["hook_embed"], metric=total(metric))
    return rows(metric, logits), cache.grads["hook_embed"].astype(np.float64)


def path_quadrature(quadrature: str, n_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes in (0, 1) and weights (summing to 1) of the named rule with ``n_steps`` nodes
    (``"geometric"``: rounded up to a multiple of its 11 panels)."""
    n = int(n_steps)
    if quadrature not in QUADRATURES:
        raise ValueError(f"quadrature must be one of {QUADRATURES}, got {quadrature!r}")
    if n < 1:
        raise ValueError(f"n_steps must be >= 1, got {n_steps}")
    if quadrature == "midpoint":
        return (np.arange(n) + 0.5) / n, np.full(n, 1.0 / n)
    if quadrature == "gauss-legendre":
        return _gauss_legendre(0.0, 1.0, n)
    # panels [0, 1e-10], [1e-10, 1e-9], ..., [0.1, 1]: as fine near 0 as a zero baseline needs
    edges = [0.0, *np.logspace(-GEOMETRIC_DECADES, 0, GEOMETRIC_DECADES + 1)]
    per_panel = -(-n // (len(edges) - 1))
    panels = [_gauss_legendre(a, b, per_panel) for a, b in zip(edges, edges[1:], strict=False)]
    return np.concatenate([p[0] for p in panels]), np.concatenate([p[1] for p in panels])


def _gauss_legendre(a: float, b: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    x, w = np.polynomial.legendre.leggauss(n)  # on [-1, 1], weights summing to 2
    return a + (b - a) * (x + 1) / 2, w * (b - a) / 2


def _prompt(model: Any, ids: Any) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"ids must be one sequence (T,), got shape {ids.shape}")
    return model.check_idx(ids[None, :])

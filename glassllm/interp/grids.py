"""What a patching sweep varies, shared by activation patching and attribution patching: a hook
point per layer, and the cells of its activation (positions, heads, or both), with the result
type both return.

A *point* is a short name (``"resid_pre"``, ``"z"``...; `POINTS` lists them) or a template
with ``{layer}`` (``"blocks.{layer}.attn.hook_z"``), or a full hook name without one (one
"layer": ``"ln_final.hook_normalized"``). The *index* says which slice of the activation one
cell is (the batch axis dropped):

* ``"pos"``: every feature at one position (every head too, on a head-shaped point): a
  (layer, pos) grid, TransformerLens's ``get_act_patch_resid_pre`` / ``..._by_pos``;
* ``"head"``: one head at every position: (layer, head), ``get_act_patch_attn_head_*_all_pos``;
* ``"pos_head"``: one head at one position: (layer, pos, head), ``..._by_pos``.

Head-shaped points are q, k, v, z (B, T, heads, hd: position axis 1, head axis 2) and the
attention scores and pattern (B, H, T, Tk: head axis 1, position axis 2, the query's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

POINTS = {
    "resid_pre": "blocks.{layer}.hook_resid_pre",
    "resid_mid": "blocks.{layer}.hook_resid_mid",
    "resid_post": "blocks.{layer}.hook_resid_post",
    "attn_out": "blocks.{layer}.hook_attn_out",
    "mlp_out": "blocks.{layer}.hook_mlp_out",
    "mlp_post": "blocks.{layer}.mlp.hook_post",
    "q": "blocks.{layer}.attn.hook_q",
    "k": "blocks.{layer}.attn.hook_k",
    "v": "blocks.{layer}.attn.hook_v",
    "z": "blocks.{layer}.attn.hook_z",
    "attn_scores": "blocks.{layer}.attn.hook_attn_scores",
    "pattern": "blocks.{layer}.attn.hook_pattern",
}
INDEXES = ("pos", "head", "pos_head")


@dataclass(frozen=True)
class Grid:
    """The hook names swept (one per layer) and the cells of each: ``cells`` is a list of
    ``(pos, head)`` (None where the cell spans that axis), the same for every layer."""

    names: tuple[str, ...]
    layers: tuple[int | None, ...]
    index: str
    cells: tuple[tuple[int | None, int | None], ...]
    shape: tuple[int, ...]  # the result grid's shape: (layers, pos) / (layers, head) / (l, p, h)
    head_axis: int  # in the activation without its batch axis
    pos_axis: int

    def selector(self, cell: tuple[int | None, int | None]) -> tuple:
        """The index of one cell in an activation without its batch axis."""
        pos, head = cell
        used = [
            axis for axis, at in ((self.pos_axis, pos), (self.head_axis, head)) if at is not None
        ]
        index: list[Any] = [slice(None)] * (max(used) + 1)
        if pos is not None:
            index[self.pos_axis] = pos
        if head is not None:
            index[self.head_axis] = head
        return tuple(index)

    def place(self, values: np.ndarray) -> np.ndarray:
        """The flat per-(layer, cell) values as the grid's shape."""
        return np.asarray(values, dtype=np.float64).reshape(self.shape)


def grid(model: Any, point: str, index: str, steps: int, layers: Any = None) -> Grid:
    """The `Grid` of ``point`` over ``layers`` (default all; ignored for a name without
    ``{layer}``) for a prompt of ``steps`` positions. Unknown names, indexes or layers are
    errors naming them."""
    if index not in INDEXES:
        raise ValueError(f"index must be one of {INDEXES}, got {index!r}")
    template = POINTS.get(point, point)
    n_layer = model.config.n_layer
    if "{layer}" in template:
        chosen = tuple(range(n_layer)) if layers is None else tuple(int(i) for i in layers)
        for layer in chosen:
            if not 0 <= layer < n_layer:
                raise ValueError(f"layer {layer} is outside the model's [0, {n_layer})")
        names = tuple(template.format(layer=layer) for layer in chosen)
    else:
        chosen, names = (None,), (template,)
    points = model.hook_points()
    for name in names:
        if name not in points:
            raise KeyError(f"unknown hook point {name!r} (model.hook_points() lists them)")
    attention_map = names[0].endswith(("hook_pattern", "hook_attn_scores"))
    head_shaped = attention_map or names[0].endswith(("hook_q", "hook_k", "hook_v", "hook_z"))
    if index != "pos" and not head_shaped:
        raise ValueError(f"{names[0]!r} has no head axis: use index='pos'")
    pos_axis, head_axis = (1, 0) if attention_map else (0, 1)
    heads = _heads(model, names[0]) if head_shaped else 0
    if index == "pos":
        cells, shape = [(p, None) for p in range(steps)], (len(names), steps)
    elif index == "head":
        cells, shape = [(None, h) for h in range(heads)], (len(names), heads)
    else:
        cells = [(p, h) for p in range(steps) for h in range(heads)]
        shape = (len(names), steps, heads)
    return Grid(names, chosen, index, tuple(cells), shape, head_axis, pos_axis)


def _heads(model: Any, name: str) -> int:
    config = model.config
    if name.endswith(("hook_k", "hook_v")):
        return config.n_kv_head or config.n_head
    return config.n_head


@dataclass
class PatchingResult:
    """A patching sweep. ``values[layer, ...]`` is the metric of the corrupted run with that one
    cell patched in from the clean run (measured by activation patching, estimated to first
    order by attribution patching: ``method``). ``effect`` is ``values - corrupted_metric``;
    ``normalized`` is ``effect / (clean_metric - corrupted_metric)``: 1 where the patch restores
    the clean behaviour fully, 0 where it does nothing (TransformerLens users plot this).

    Labels: ``names`` (the hook name of each row), ``layers``, ``positions`` (token labels of
    the corrupted prompt, or position numbers), ``heads``. ``checks`` holds the exactness
    figures computed with the sweep (e.g. ``"full_patch_gap"``: the metric with every cell of
    the first row patched at once, minus the clean metric, which must be 0 for a residual
    point).
    """

    values: np.ndarray
    clean_metric: float
    corrupted_metric: float
    names: tuple[str, ...]
    layers: tuple[int | None, ...]
    index: str
    positions: list[str]
    heads: list[str]
    method: str = "activation"
    checks: dict[str, float] = field(default_factory=dict)

    @property
    def effect(self) -> np.ndarray:
        return self.values - self.corrupted_metric

    @property
    def normalized(self) -> np.ndarray:
        span = self.clean_metric - self.corrupted_metric
        if span == 0.0:
            raise ZeroDivisionError(
                "clean and corrupted metrics are equal: nothing to normalise by"
            )
        return self.effect / span

    @property
    def axes(self) -> tuple[str, ...]:
        return {"pos": ("layer", "pos"), "head": ("layer", "head")}.get(
            self.index, ("layer", "pos", "head")
        )

    def as_dict(self) -> dict:
        """JSON-ready: the grid as nested lists with its axes and labels, what a page or a
        notebook panel draws (a heatmap of ``normalized`` with ``positions`` / ``heads`` as
        tick labels and ``names`` per row)."""
        span = self.clean_metric - self.corrupted_metric
        return {
            "method": self.method,
            "axes": list(self.axes),
            "values": self.values.tolist(),
            "normalized": (self.effect / span).tolist() if span else None,
            "clean_metric": self.clean_metric,
            "corrupted_metric": self.corrupted_metric,
            "names": list(self.names),
            "layers": list(self.layers),
            "positions": list(self.positions),
            "heads": list(self.heads),
            "checks": dict(self.checks),
        }

    def _repr_html_(self) -> str:  # Jupyter draws this panel instead of the repr
        from glassllm.html import patching_panel

        return patching_panel(self)

    def __repr__(self) -> str:
        shape = " x ".join(f"{n} {a}" for n, a in zip(self.values.shape, self.axes, strict=True))
        return (
            f"PatchingResult({self.method}, {self.names[0]}..., {shape}; clean "
            f"{self.clean_metric:.4g}, corrupted {self.corrupted_metric:.4g})"
        )


def labels(tokens: Any, steps: int) -> list[str]:
    """Position labels: the given token strings, else ``"0"``, ``"1"``..."""
    if tokens is None:
        return [str(p) for p in range(steps)]
    tokens = [str(t) for t in tokens]
    if len(tokens) != steps:
        raise ValueError(f"tokens has {len(tokens)} labels for {steps} positions")
    return tokens

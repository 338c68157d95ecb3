"""Direct logit attribution: how much each head, each MLP and the embeddings write the logit
difference directly, through the final norm, at one position.

The final residual stream at a position is a sum of what each part wrote (dropout off):

    x = embed + pos_embed + sum over layers l of (sum over heads h of z[l, h] @ W_O[l, h]
                                                  + b_O[l] + mlp_out[l])

where ``W_O[l, h]`` is head h's rows of the attention's output projection ``proj.weight``
(H hd, E) and ``b_O`` its bias. The final norm is ``n(x) * w + b`` with ``n(x) = (x -
mean(x)) / s`` (LayerNorm) or ``x / s`` (RMSNorm), ``s`` its scale. ``s`` depends on x, so
the logit difference is not linear in the parts; *freeze* ``s`` at its value in the forward
(``ln_final.hook_scale``), and centring is linear, so with ``u = W_U[:, answer] - W_U[:,
wrong]`` (``W_U`` the head: ``wte.weight`` transposed when tied, else ``lm_head.weight``):

    logit[answer] - logit[wrong] = sum over parts c of centre(c) / s . (w * u)  +  b . u

exactly, up to float rounding. Every figure is computed in float64 from the cached float
activations; ``gap`` is the sum of the parts minus the logit difference the model computed
(its size is the model's dtype's rounding). TransformerLens gets the same identity by folding
``w`` into ``W_U`` (``fold_ln``); glassllm ties ``W_U`` to ``wte``, so ``w`` is applied here
instead and no weight is changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from glassllm.interp.metrics import logit_diff, rows


@dataclass
class LogitAttribution:
    """Direct logit attribution at one position: ``values[i]`` is part ``labels[i]``'s share of
    ``logit_diff`` (the model's own); ``gap = values.sum() - logit_diff``. Parts, in order:
    ``embed``, ``pos_embed`` (learned positions only), ``L{l}H{h}`` per head and ``L{l} attn
    bias`` (with a bias) then ``L{l} mlp`` per layer, and ``ln_final bias`` (a LayerNorm with a
    bias). ``heads`` (n_layer, n_head) and ``mlps`` (n_layer,) are the same numbers in grids."""

    values: np.ndarray
    labels: list[str]
    logit_diff: float
    gap: float
    heads: np.ndarray
    mlps: np.ndarray
    position: int
    answer: int
    wrong: int

    def as_dict(self) -> dict:
        """JSON-ready: the bars (``labels``, ``values``), the grids and the exactness figure."""
        return {
            "labels": list(self.labels),
            "values": self.values.tolist(),
            "heads": self.heads.tolist(),
            "mlps": self.mlps.tolist(),
            "logit_diff": self.logit_diff,
            "gap": self.gap,
            "position": self.position,
            "answer": self.answer,
            "wrong": self.wrong,
        }

    def _repr_html_(self) -> str:  # Jupyter draws this panel instead of the repr
        from glassllm.html import logit_attribution_panel

        return logit_attribution_panel(self)

    def __repr__(self) -> str:
        top = np.argsort(-np.abs(self.values))[:3]
        parts = ", ".join(f"{self.labels[i]} {self.values[i]:+.4g}" for i in top)
        return (
            f"LogitAttribution(logit diff {self.logit_diff:.6g} = sum of {len(self.values)} parts "
            f"+ gap {self.gap:.2g}; largest: {parts})"
        )


def unembedding(model: Any) -> np.ndarray:
    """The head's matrix ``W_U`` (E, V) in float64: logits = final-norm output @ W_U."""
    if model.lm_head is not None:
        return model.lm_head.weight.data.astype(np.float64)  # Linear weights are (in, out)
    return model.wte.weight.data.astype(np.float64).T


def direct_logit_attribution(
    model: Any, ids: Any, answer: int, wrong: int, position: int = -1
) -> LogitAttribution:
    """Each part's direct contribution to ``logit[answer] - logit[wrong]`` at ``position`` of
    the prompt ``ids`` (T,), through the final norm with its scale frozen (see the module)."""
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"ids must be one sequence (T,), got shape {ids.shape}")
    config = model.config
    L, H = config.n_layer, config.n_head
    names = ["hook_embed", "ln_final.hook_scale"]
    if model.wpe is not None:
        names.append("hook_pos_embed")
    names += [f"blocks.{i}.attn.hook_z" for i in range(L)]
    names += [f"blocks.{i}.hook_mlp_out" for i in range(L)]
    logits, cache = model.run_with_cache(ids, names=names)
    measured = float(rows(logit_diff(answer, wrong, position), logits)[0])
    W_U = unembedding(model)
    norm = model.ln_f
    gain = norm.weight.data.astype(np.float64)
    scale = float(cache["ln_final.hook_scale"][0, position, 0])
    direction = gain * (W_U[:, int(answer)] - W_U[:, int(wrong)])  # (E,)
    centre = norm.__class__.__name__ == "LayerNorm"

    def read(vector: np.ndarray) -> float:  # one part's share, the norm's scale frozen
        vector = vector.astype(np.float64)
        if centre:
            vector = vector - vector.mean()
        return float(vector @ direction) / scale

    labels, values = ["embed"], [read(cache["hook_embed"][0, position])]
    if model.wpe is not None:
        labels.append("pos_embed")
        values.append(read(cache["hook_pos_embed"][0, position]))
    heads, mlps = np.zeros((L, H)), np.zeros(L)
    for layer, block in enumerate(model.blocks):
        proj = block.attn.proj
        z = cache[f"blocks.{layer}.attn.hook_z"][0, position].astype(np.float64)  # (H, hd)
        W_O = proj.weight.data.astype(np.float64).reshape(H, z.shape[1], -1)  # (H, hd, E)
        for head in range(H):
            heads[layer, head] = read(z[head] @ W_O[head])
            labels.append(f"L{layer}H{head}")
            values.append(heads[layer, head])
        if proj.bias is not None:
            labels.append(f"L{layer} attn bias")
            values.append(read(proj.bias.data))
        mlps[layer] = read(cache[f"blocks.{layer}.hook_mlp_out"][0, position])
        labels.append(f"L{layer} mlp")
        values.append(mlps[layer])
    bias = getattr(norm, "bias", None)
    if bias is not None:
        labels.append("ln_final bias")
        values.append(
            float(bias.data.astype(np.float64) @ (W_U[:, int(answer)] - W_U[:, int(wrong)]))
        )
    values = np.asarray(values)
    return LogitAttribution(
        values=values,
        labels=labels,
        logit_diff=measured,
        gap=float(values.sum() - measured),
        heads=heads,
        mlps=mlps,
        position=int(position),
        answer=int(answer),
        wrong=int(wrong),
    )

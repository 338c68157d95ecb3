"""Steering: add ``alpha * direction`` to the residual stream at one layer, at every position,
while the model runs or generates (activation addition, Turner et al.; contrastive activation
addition, Rimsky et al.).

The direction comes from a contrast pair (or two sets) of prompts: the mean of the activation
at the hook point over the positive prompts minus its mean over the negative ones,

    direction = mean_i act(positive_i)[last] - mean_j act(negative_j)[last]

at each prompt's last position (``position="last"``: where the prompt's meaning has been read;
``"mean"`` averages over every position instead). It is not normalised: ``alpha = 1`` adds the
difference as measured, so the strength reads in units of the contrast itself.

The hook adds the vector to whatever it is shown, so in KV-cached generation, whose steps show
one position (B, 1, E), the new token's residual is steered as the prompt's were, and the
cached keys and values of earlier steps already hold the steered stream. The replacement joins
the graph as a straight-through node (`glassllm.models.hooks`), whose gradient is exact here:
adding a constant has the identity as its derivative.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from glassllm.autograd import no_grad
from glassllm.interp.grids import POINTS


@dataclass
class SteeringVector:
    """``direction`` (E,) to add at ``name`` (``blocks.{layer}.hook_resid_pre`` by default);
    ``norm`` its length, beside the typical length of the activation there (``act_norm``: the
    mean over the contrast prompts' positions), so a strength can be judged."""

    direction: np.ndarray
    name: str
    layer: int
    norm: float
    act_norm: float

    def hooks(self, alpha: float) -> list[tuple[str, Any]]:
        """The hook list that adds ``alpha * direction`` at every position."""
        added = float(alpha) * self.direction

        def add(act: np.ndarray, _name: str) -> np.ndarray:
            return act + added.astype(act.dtype, copy=False)

        return [(self.name, add)]

    def __repr__(self) -> str:
        return (
            f"SteeringVector({self.name}, |direction| {self.norm:.4g}, "
            f"typical |activation| {self.act_norm:.4g})"
        )


def steering_vector(
    model: Any,
    positive: Any,
    negative: Any,
    layer: int,
    point: str = "resid_pre",
    position: str = "last",
) -> SteeringVector:
    """The mean-difference direction of ``positive`` over ``negative`` prompts (each one
    sequence of ids (T,) or a list of them, any lengths) at ``point`` of ``layer``."""
    if position not in ("last", "mean"):
        raise ValueError(f"position must be 'last' or 'mean', got {position!r}")
    layer = int(layer)
    if not 0 <= layer < model.config.n_layer:
        raise ValueError(f"layer {layer} is outside the model's [0, {model.config.n_layer})")
    name = POINTS.get(point, point).format(layer=layer)
    means, norms = [], []
    for role, prompts in (("positive", positive), ("negative", negative)):
        vectors = []
        for ids in _sequences(prompts, role):
            with no_grad():
                _, cache = model.run_with_cache(ids, names=[name])
            act = cache[name][0].astype(np.float64)  # (T, E)
            if act.ndim != 2:
                raise ValueError(f"{name!r} is not a residual-shaped point (B, T, E)")
            vectors.append(act[-1] if position == "last" else act.mean(axis=0))
            norms.append(np.linalg.norm(act, axis=-1).mean())
        means.append(np.mean(vectors, axis=0))
    direction = (means[0] - means[1]).astype(model.dtype)
    return SteeringVector(
        direction, name, layer, float(np.linalg.norm(direction)), float(np.mean(norms))
    )


def _sequences(prompts: Any, role: str) -> list[np.ndarray]:
    if isinstance(prompts, np.ndarray) and prompts.ndim == 1:
        prompts = [prompts]
    elif len(prompts) and np.ndim(prompts[0]) == 0:
        prompts = [prompts]  # one sequence given as a list of ids
    sequences = [np.asarray(ids) for ids in prompts]
    if not sequences or any(s.ndim != 1 or s.size == 0 for s in sequences):
        raise ValueError(f"the {role} prompts must be one or more non-empty sequences of ids")
    return sequences


def generate_steered(
    model: Any, ids: Any, vector: SteeringVector, alpha: float, max_new_tokens: int, **options: Any
) -> np.ndarray:
    """``model.generate(ids, max_new_tokens, **options)`` with ``alpha * vector.direction``
    added at its hook point in every step (the KV cache on, as generate's default)."""
    with model.hooks(vector.hooks(alpha)):
        return model.generate(ids, max_new_tokens, **options)

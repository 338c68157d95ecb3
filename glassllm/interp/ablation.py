"""Ablation: remove a part of the model and see what its output loses.

A part is a head (its slice of ``attn.hook_z``, before the output projection: the head then
writes nothing but the projection's bias, shared by all heads), an MLP neuron (its column of
``mlp.hook_post``, what the output projection reads), or a whole layer's attention or MLP
(``hook_attn_out`` / ``hook_mlp_out``, biases included). Its activation is replaced by

* ``"zero"``: 0 (the part writes nothing; off-distribution for the parts downstream);
* ``"mean"``: its mean over a reference batch of prompts and over their positions (one value
  per part, so it applies at any length and in generation): the part's typical value, without
  what this prompt gave it;
* ``"resample"``: its value on another prompt of the same length, position by position (a
  reference of one prompt, or one per row), Chan et al.'s resampling ablation: a real
  activation from the wrong input. Not in KV-cached generation, whose steps see one position.

`ablation_hooks` returns the hook list, to use with ``model.run_with_hooks``, ``with
model.hooks(...)`` (generation too: in a KV-cached step each hook sees one position, and a
reference value is taken at that position) or `ablate`, which runs the prompt with and
without the ablation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from glassllm.autograd import no_grad

HOW = ("zero", "mean", "resample")


@dataclass
class AblationResult:
    """The prompt's logits at the last position with and without the ablation, as next-token
    probabilities (V,), and what was ablated (``parts``: ``"L0H1"``, ``"L1N7"``, ``"L2 mlp"``)."""

    probs: np.ndarray
    base_probs: np.ndarray
    logits: np.ndarray
    base_logits: np.ndarray
    parts: list[str]
    how: str

    @property
    def kl(self) -> float:
        """KL(base || ablated) of the next-token distributions, in nats."""
        p, q = self.base_probs, self.probs
        keep = p > 0
        return float(np.sum(p[keep] * (np.log(p[keep]) - np.log(np.maximum(q[keep], 1e-300)))))

    def _repr_html_(self) -> str:  # Jupyter draws this panel instead of the repr
        from glassllm.html import ablation_panel

        return ablation_panel(self)

    def __repr__(self) -> str:
        return f"AblationResult({self.how}: {', '.join(self.parts)}; KL {self.kl:.4g} nats)"


def ablation_hooks(
    model: Any,
    heads: Any = (),
    neurons: Any = (),
    layers: Any = (),
    how: str = "zero",
    reference: Any = None,
) -> list[tuple[str, Any]]:
    """Hooks that ablate ``heads`` ``[(layer, head), ...]``, ``neurons`` ``[(layer, index)]``
    and ``layers`` ``[("attn" | "mlp", layer)]`` by ``how`` (`HOW`); ``reference``: token ids
    (N, T) for ``"mean"`` (N >= 1) and ``"resample"`` (N = 1, or one per ablated row)."""
    if how not in HOW:
        raise ValueError(f"how must be one of {HOW}, got {how!r}")
    config = model.config
    sites: dict[
        str, list[tuple]
    ] = {}  # hook name -> index after (B, T): (head,), (neuron,) or () for all
    for layer, head in heads:
        _check(layer, config.n_layer, "layer")
        _check(head, config.n_head, "head")
        sites.setdefault(f"blocks.{layer}.attn.hook_z", []).append((int(head),))
    for layer, neuron in neurons:
        _check(layer, config.n_layer, "layer")
        _check(neuron, config.mlp_size, "neuron")
        sites.setdefault(f"blocks.{layer}.mlp.hook_post", []).append((int(neuron),))
    for kind, layer in layers:
        _check(layer, config.n_layer, "layer")
        if kind not in ("attn", "mlp"):
            raise ValueError(f"a layer is ('attn' | 'mlp', layer), got {kind!r}")
        sites.setdefault(f"blocks.{layer}.hook_{kind}_out", []).append(())
    if not sites:
        raise ValueError("nothing to ablate: give heads, neurons or layers")
    values = _reference_values(model, list(sites), how, reference)
    return [(name, _replacer(where, values.get(name))) for name, where in sites.items()]


def _replacer(where: list[tuple], value: np.ndarray | None) -> Any:
    def replace(act: np.ndarray, name: str) -> np.ndarray:
        if value is not None and value.shape[1] not in (1, act.shape[1]):
            raise ValueError(
                f"a resample ablation of {name!r} needs prompts as long as the reference "
                f"({value.shape[1]} positions), got {act.shape[1]}"
            )
        if value is not None and value.shape[0] not in (1, act.shape[0]):
            raise ValueError(
                f"a resample ablation of {name!r} needs one reference prompt or one per row "
                f"({act.shape[0]}), got {value.shape[0]}"
            )
        source = None if value is None else np.broadcast_to(value, act.shape)
        for index in where:  # act (B, T, ...): the cell over every row and position
            full = (slice(None), slice(None), *index)
            act[full] = 0.0 if source is None else source[full]
        return act

    return replace


def _reference_values(model: Any, names: list[str], how: str, reference: Any) -> dict:
    if how == "zero":
        if reference is not None:
            raise ValueError("a zero ablation takes no reference prompts")
        return {}
    if reference is None:
        raise ValueError(f"a {how} ablation needs reference prompts (token ids (N, T))")
    ids = np.asarray(reference)
    ids = ids[None, :] if ids.ndim == 1 else ids
    with no_grad():
        _, cache = model.run_with_cache(ids, names=names)
    if how == "mean":
        return {name: cache[name].mean(axis=(0, 1), keepdims=True) for name in names}
    return {name: cache[name] for name in names}


def _check(value: Any, count: int, what: str) -> None:
    if not 0 <= int(value) < count:
        raise ValueError(f"{what} {value} is outside [0, {count})")


def ablate(
    model: Any,
    ids: Any,
    heads: Any = (),
    neurons: Any = (),
    layers: Any = (),
    how: str = "zero",
    reference: Any = None,
) -> AblationResult:
    """Run the prompt ``ids`` (T,) with and without the ablation (see `ablation_hooks`)."""
    hooks = ablation_hooks(model, heads, neurons, layers, how, reference)
    prompt = np.asarray(ids)[None, :]
    with no_grad():
        base = model.run_with_hooks(prompt).data[0, -1].astype(np.float64)
        ablated = model.run_with_hooks(prompt, fwd_hooks=hooks).data[0, -1].astype(np.float64)
    parts = [f"L{layer}H{head}" for layer, head in heads]
    parts += [f"L{layer}N{neuron}" for layer, neuron in neurons]
    parts += [f"L{layer} {kind}" for kind, layer in layers]
    return AblationResult(_softmax(ablated), _softmax(base), ablated, base, parts, how)


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max())
    return e / e.sum()

"""Four small expressions built from glassllm operations, for drawing their autograd graphs.

Each `Example` has named numeric inputs (a number or a small array each) that become leaf
Tensors with ``requires_grad=True``; `Example.build` runs the forward and returns the scalar
output with the labels of its tensors, and `run_example` adds the backward pass and exports
the graph (`glassllm.graph.export_graph`). No user code runs: the expressions are fixed
functions, only their numbers change.

* ``neuron``: micrograd's neuron ``o = tanh(x1 w1 + x2 w2 + b)``;
* ``cross_entropy``: softmax cross-entropy ``-log softmax(z)[0]`` of 3 logits, written out;
* ``layer_norm``: ``sum(LayerNorm(x) * c)`` over 4 numbers (``c`` weights each output, so the
  gradient is not trivially 0: LayerNorm's outputs always sum to ``sum(b)``);
* ``attention``: one causal attention head on 3 tokens of width 2, written out step by step.

>>> graph = run_example("neuron", {})
>>> [round(n["value"], 4) for n in graph["nodes"] if n["label"] == "o"]
[0.7071]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

import glassllm.functional as F
from glassllm.graph.export import export_graph
from glassllm.tensor import Tensor

Built = tuple[Tensor, dict[str, Tensor]]


@dataclasses.dataclass(frozen=True)
class Example:
    """A fixed expression: ``title``, its formula, and default values of its named inputs."""

    name: str
    title: str
    formula: str
    defaults: dict[str, Any]
    fn: Callable[[dict[str, Tensor]], Built]

    def build(self, values: Mapping[str, Any] | None = None, dtype: Any = np.float64) -> Built:
        """Forward pass on ``values`` (missing names take the defaults): ``(output, labels)``.

        Raises ValueError naming a bad input (unknown name, wrong shape, non-finite number).
        """
        leaves = self.leaves(values, dtype)
        output, labels = self.fn(leaves)
        return output, {**leaves, **labels}

    def leaves(
        self, values: Mapping[str, Any] | None, dtype: Any = np.float64
    ) -> dict[str, Tensor]:
        """The inputs as leaf Tensors (``requires_grad=True``), checked against the defaults."""
        values = dict(values or {})
        unknown = sorted(set(values) - set(self.defaults))
        if unknown:
            raise ValueError(
                f"example {self.name!r} has no input {unknown[0]!r}; its inputs are "
                f"{', '.join(self.defaults)}"
            )
        leaves = {}
        for name, default in self.defaults.items():
            value = values.get(name, default)
            try:
                array = np.array(value, dtype=dtype)
            except (TypeError, ValueError, OverflowError):  # OverflowError: an int like 10**400
                shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:37]}..."
                raise ValueError(f"input {name!r} must be numbers, got {shown}") from None
            if array.shape != np.shape(default):
                raise ValueError(
                    f"input {name!r} must have shape {np.shape(default)}, got {array.shape}"
                )
            if not np.all(np.isfinite(array)):
                raise ValueError(f"input {name!r} must be finite numbers")
            leaves[name] = Tensor(array, requires_grad=True)
        return leaves

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "formula": self.formula,
            "inputs": {k: np.asarray(v, dtype=float).tolist() for k, v in self.defaults.items()},
        }


def _neuron(t: dict[str, Tensor]) -> Built:
    x1w1 = t["x1"] * t["w1"]
    x2w2 = t["x2"] * t["w2"]
    total = x1w1 + x2w2
    n = total + t["b"]
    o = n.tanh()
    return o, {"x1*w1": x1w1, "x2*w2": x2w2, "x1*w1 + x2*w2": total, "n": n, "o": o}


def _cross_entropy(t: dict[str, Tensor]) -> Built:
    # Written out rather than the fused F.cross_entropy, so the graph shows its steps.
    p = F.softmax(t["logits"], axis=-1)  # (3,)
    p_target = p[0]  # the target class is fixed: class 0
    loss = -p_target.log()
    return loss, {"p = softmax(logits)": p, "p[0]": p_target, "L": loss}


def _layer_norm(t: dict[str, Tensor]) -> Built:
    y = F.layer_norm(t["x"], t["w"], t["b"])
    weighted = y * t["c"]
    out = weighted.sum()
    return out, {"y = LayerNorm(x)": y, "y*c": weighted, "L": out}


def _attention(t: dict[str, Tensor]) -> Built:
    x = t["x"]  # (3, 2): 3 tokens of width 2
    q, k, v = x @ t["Wq"], x @ t["Wk"], x @ t["Wv"]  # (3, 2) each
    scores = (q @ k.transpose(1, 0)) * (1.0 / math.sqrt(2.0))  # (3, 3)
    causal = Tensor(np.triu(np.full((3, 3), -np.inf), k=1))  # token i sees tokens <= i
    p = F.softmax(scores + causal, axis=-1)  # (3, 3) attention weights
    out = p @ v  # (3, 2)
    loss = (out * t["r"]).sum()  # a fixed readout, so every output entry matters differently
    labels = {
        "q": q,
        "k": k,
        "v": v,
        "scores": scores,
        "causal mask": causal,
        "P": p,
        "out = P v": out,
        "L": loss,
    }
    return loss, labels


EXAMPLES: dict[str, Example] = {
    e.name: e
    for e in [
        Example(
            "neuron",
            "A neuron (micrograd)",
            "o = tanh(x1·w1 + x2·w2 + b)",
            {"x1": 2.0, "x2": 0.0, "w1": -3.0, "w2": 1.0, "b": 6.8813735870195432},
            _neuron,
        ),
        Example(
            "cross_entropy",
            "Softmax cross-entropy of 3 logits",
            "L = -log softmax(logits)[0]  (target class 0)",
            {"logits": [2.0, 1.0, 0.1]},
            _cross_entropy,
        ),
        Example(
            "layer_norm",
            "LayerNorm of 4 numbers",
            "L = Σ c · LayerNorm(x; w, b)",
            {
                "x": [1.0, 2.0, 4.0, 8.0],
                "w": [1.0, 1.0, 1.0, 1.0],
                "b": [0.0, 0.0, 0.0, 0.0],
                "c": [1.0, -1.0, 0.5, 2.0],
            },
            _layer_norm,
        ),
        Example(
            "attention",
            "One attention head on 3 tokens",
            "L = Σ r · (softmax(q kᵀ/√2 + mask) v),  q = x Wq, k = x Wk, v = x Wv",
            {
                "x": [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]],
                "Wq": [[1.0, 0.5], [-0.5, 1.0]],
                "Wk": [[0.8, -0.2], [0.3, 0.9]],
                "Wv": [[1.0, 0.0], [0.0, 2.0]],
                "r": [[1.0, 0.0], [0.0, 1.0], [1.0, -1.0]],
            },
            _attention,
        ),
    ]
}


def run_example(name: str, values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Forward and backward of example ``name`` on ``values``; the exported graph, plus the
    example's ``name``, ``title`` and ``formula``."""
    if name not in EXAMPLES:
        raise ValueError(f"unknown example {name!r}; choose one of {', '.join(EXAMPLES)}")
    example = EXAMPLES[name]
    output, labels = example.build(values)
    output.backward()
    graph = export_graph(output, names=labels)
    return {"example": name, "title": example.title, "formula": example.formula, **graph}

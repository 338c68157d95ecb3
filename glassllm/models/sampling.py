"""How to sample: `SamplingOptions`, with the one set of bounds every surface uses.

The library's generation (`glassllm.models.generation.stream`), ``glassllm sample`` (its
``SampleConfig`` fields take their ranges from the constants here) and the viewer's
``/api/generate`` accept the same values. The viewer adds one limit of its own, documented
there: a request holds the model's lock while it runs, so it generates at most
``glassllm.app.view.api.MAX_NEW_TOKENS`` tokens.

>>> SamplingOptions(max_new_tokens=5, temperature=0.8, top_k=3, seed=1)
SamplingOptions(max_new_tokens=5, temperature=0.8, top_k=3, seed=1)
>>> SamplingOptions(max_new_tokens=-1)
Traceback (most recent call last):
ValueError: max_new_tokens must be >= 0, got -1
"""

from __future__ import annotations

import dataclasses

from glassllm._checks import is_integer

MAX_NEW_TOKENS = 1_000_000  # tokens one call generates per sample
# Below this, float32 logits / temperature can overflow to inf and the probabilities turn to nan
# (samples then come out as the last token of the vocabulary); it is greedy decoding already.
MIN_TEMPERATURE = 1e-6
# top_k beyond the vocabulary means "all tokens" (it is clipped to the vocabulary); the bound is
# the largest vocabulary a GPTConfig accepts, so any model's full vocabulary can be named.
MAX_TOP_K = 1_000_000_000


@dataclasses.dataclass(frozen=True)
class SamplingOptions:
    """What a sampler is asked for; checked at construction (a ValueError names every problem).

    ``p = softmax(top_k_mask(logits / temperature))``; ``seed`` seeds the generator when the
    caller gives none (None: glassllm.rng's default generator). Top-p will be one more field
    here, checked in `problems`, and applied in `glassllm.models.generation.probabilities`.
    """

    max_new_tokens: int = 100
    temperature: float = 1.0
    top_k: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))
        object.__setattr__(self, "max_new_tokens", int(self.max_new_tokens))  # numpy ints
        object.__setattr__(self, "temperature", float(self.temperature))
        if self.top_k is not None:
            object.__setattr__(self, "top_k", int(self.top_k))

    def problems(self) -> list[str]:
        """Every value outside its bounds, one message each (the library's wording)."""
        problems = []
        n = self.max_new_tokens
        if not is_integer(n):
            problems.append(f"max_new_tokens must be an integer, got {n!r}")
        elif n < 0:
            problems.append(f"max_new_tokens must be >= 0, got {n}")
        elif n > MAX_NEW_TOKENS:
            problems.append(f"max_new_tokens must be at most {MAX_NEW_TOKENS}, got {n}")
        t = self.temperature
        try:
            t = float(t)
        except (TypeError, ValueError, OverflowError):
            problems.append(f"temperature must be a number, got {t!r}")
        else:
            if not t > 0.0:  # also rejects NaN
                problems.append(f"temperature must be > 0, got {t}")
            elif t < MIN_TEMPERATURE:
                problems.append(
                    f"temperature must be at least {MIN_TEMPERATURE:g}, got {t:g} "
                    "(for greedy decoding use top_k=1)"
                )
        k = self.top_k
        if k is not None and (not is_integer(k) or not 1 <= k <= MAX_TOP_K):
            problems.append(
                f"top_k must be a positive integer or None (at most {MAX_TOP_K}), got {k!r}"
            )
        s = self.seed
        if s is not None and (not is_integer(s) or s < 0):
            problems.append(f"seed must be a non-negative integer or None, got {s!r}")
        return problems

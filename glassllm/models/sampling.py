"""How to sample: `SamplingOptions`, with the one set of bounds every surface uses, and the
filters that turn logits into the distribution a token is drawn from.

The library's generation (`glassllm.models.generation.stream`), ``glassllm sample`` (its
``SampleConfig`` fields take their ranges from the constants here) and the viewer's
``/api/generate`` accept the same values. The viewer adds one limit of its own, documented
there: a request holds the model's lock while it runs, so it generates at most
``glassllm.app.view.api.MAX_NEW_TOKENS`` tokens.

The filters run in the order transformers' logits processors apply them in ``generate``
(``_get_logits_processor``: temperature, top-k, top-p, min-p), each on the logits the one before
left, a removed token's logit set to -inf:

- top-k: keep the ``k`` largest logits (ties at the k-th kept);
- top-p (nucleus; TopPLogitsWarper): sort ascending, remove the tokens whose cumulative
  probability is ``<= 1 - top_p``, always keeping the most likely; ``top_p = 1`` keeps all;
- min-p (MinPLogitsWarper): remove the tokens whose probability is below ``min_p`` times the
  most likely one's; ``min_p = 0`` keeps all.

>>> SamplingOptions(max_new_tokens=5, temperature=0.8, top_k=3, seed=1)
SamplingOptions(max_new_tokens=5, temperature=0.8, top_k=3, seed=1, top_p=None, min_p=None)
>>> SamplingOptions(max_new_tokens=-1, top_p=0.0)
Traceback (most recent call last):
ValueError: max_new_tokens must be >= 0, got -1; top_p must be a number in (0, 1] or None, got 0.0
>>> logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], dtype=np.float32))
>>> def shown(p): return [round(float(x), 3) for x in p[0]]
>>> shown(distribution(logits, 1.0, top_p=0.75))   # 0.5 + 0.3: the fewest that reach 0.75
[0.625, 0.375, 0.0, 0.0]
>>> shown(distribution(logits, 1.0, min_p=0.2))    # 0.05 < 0.2 * 0.5
[0.526, 0.316, 0.158, 0.0]
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

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

    ``p = softmax(min_p(top_p(top_k(logits / temperature))))`` (`distribution`); ``seed``
    seeds the generator when the caller gives none (None: glassllm.rng's default generator).
    ``top_p`` in (0, 1] and ``min_p`` in [0, 1), None for off (after ``seed``, so positional
    construction keeps its meaning).
    """

    max_new_tokens: int = 100
    temperature: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    top_p: float | None = None
    min_p: float | None = None

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))
        object.__setattr__(self, "max_new_tokens", int(self.max_new_tokens))  # numpy ints
        object.__setattr__(self, "temperature", float(self.temperature))
        if self.top_k is not None:
            object.__setattr__(self, "top_k", int(self.top_k))
        for name in ("top_p", "min_p"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, float(getattr(self, name)))

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
        p = _fraction(self.top_p)
        if self.top_p is not None and not (p is not None and 0.0 < p <= 1.0):
            problems.append(f"top_p must be a number in (0, 1] or None, got {self.top_p!r}")
        m = _fraction(self.min_p)
        if self.min_p is not None and not (m is not None and 0.0 <= m < 1.0):
            problems.append(f"min_p must be a number in [0, 1) or None, got {self.min_p!r}")
        return problems


def _fraction(value: object) -> float | None:
    """``value`` as a finite float, None when it is not a number (a bool is not)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


# ---------------------------------------------------------------------------- the filters


def top_k_filter(scaled: np.ndarray, top_k: int | None) -> np.ndarray:
    """``scaled`` (B, V) with all but the ``top_k`` largest of each row set to -inf (ties at the
    k-th kept)."""
    if top_k is None or top_k >= scaled.shape[-1]:
        return scaled
    kth = np.partition(scaled, -top_k, axis=-1)[:, -top_k, None]  # (B, 1)
    return np.where(scaled < kth, -np.inf, scaled)  # (B, V)


def _softmax(scaled: np.ndarray) -> np.ndarray:
    import glassllm.functional as F
    from glassllm.tensor import Tensor

    return F.softmax(Tensor(scaled), axis=-1).data  # (B, V)


def top_p_filter(scaled: np.ndarray, top_p: float | None) -> np.ndarray:
    """Nucleus filtering as transformers' TopPLogitsWarper: in ascending order of logit, remove
    the tokens whose cumulative probability is ``<= 1 - top_p``; the most likely one stays."""
    if top_p is None or top_p >= 1.0:
        return scaled
    order = np.argsort(scaled, axis=-1, kind="stable")  # (B, V) ascending
    cumulative = np.cumsum(_softmax(np.take_along_axis(scaled, order, axis=-1)), axis=-1)
    remove_sorted = cumulative <= (1.0 - top_p)  # (B, V); a Python float keeps float32
    remove_sorted[:, -1] = False  # min_tokens_to_keep = 1
    remove = np.empty_like(remove_sorted)
    np.put_along_axis(remove, order, remove_sorted, axis=-1)
    return np.where(remove, -np.inf, scaled)


def min_p_filter(scaled: np.ndarray, min_p: float | None) -> np.ndarray:
    """As transformers' MinPLogitsWarper: remove the tokens whose probability is below ``min_p``
    times the largest probability of the row (that one always stays)."""
    if not min_p:
        return scaled
    probs = _softmax(scaled)  # (B, V)
    threshold = probs.max(axis=-1, keepdims=True) * min_p  # (B, 1)
    return np.where(probs < threshold, -np.inf, scaled)


def distribution(
    logits: np.ndarray,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
) -> np.ndarray:
    """The probabilities (B, V) a token is drawn from: ``logits`` (B, V) divided by the
    temperature, then top-k, top-p and min-p, then the softmax."""
    scaled = logits / temperature  # (B, V); a Python float keeps the dtype
    scaled = min_p_filter(top_p_filter(top_k_filter(scaled, top_k), top_p), min_p)
    return _softmax(scaled)

"""Sampling text from a GPT: the sampling rule, the key/value-cached loop, streaming.

``GPT.generate`` and ``GPT.generate_stream`` are thin entry points to ``generate`` and
``generate_stream`` here; the model file keeps only the model. Both check their options through
`SamplingOptions` and run `stream`, which takes the options object; `explain` records each
token's probability and its top alternatives, by token id.

Sampling: ``p = softmax(min_p(top_p(top_k(logits / temperature))))`` (the filters, in
transformers' order, are `glassllm.models.sampling`'s); one ``u ~ U[0, 1)`` per row from
``rng.random``; the token is the first index whose cumulative probability exceeds
``u * sum(p)`` (the inverse-CDF draw). The cached and the uncached paths draw the same random
numbers and compute the same logits, so they give the same tokens for the same seed.

The key/value cache: each block keeps an ``nn.KVCache`` (of its ``n_kv_head`` key/value heads,
already rotated where positions are rotary; a local layer's window applies to the cached keys
as to the recomputed ones), so after the prompt a new token costs one position (run on arrays by
`glassllm.models.decoding.next_position` where no hook could see the difference: the same bits
without the engine's bookkeeping, which was a quarter to a third of a SmolLM2 token). Its
capacity is what the call can use, the prompt plus ``max_new_tokens`` capped at ``block_size``,
never a whole block up front. Once the context
exceeds ``block_size``, sliding the window shifts every token's position (learned or rotary) and
invalidates what is cached, so from then on each token runs the uncached forward over the last
``block_size`` tokens, of which the last block computes only the last position
(``last_position_hidden``): the same numbers as the model's own forward over that window.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

import glassllm.nn as nn
from glassllm._checks import is_integer
from glassllm.autograd import no_grad
from glassllm.models import decoding, sampling
from glassllm.models.sampling import SamplingOptions
from glassllm.rng import get_rng
from glassllm.tensor import Tensor

if TYPE_CHECKING:
    from glassllm.models.gpt import GPT, Block


def generate(
    model: GPT,
    idx: Any,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    rng: np.random.Generator | None = None,
    use_cache: bool = True,
    *,
    top_p: float | None = None,
    min_p: float | None = None,
) -> np.ndarray:
    """Sample ``max_new_tokens`` tokens after ``idx`` (B, T); returns the int array (B, T + new).

    Runs under no_grad and in eval mode whatever the caller's state, and restores both.
    """
    options = SamplingOptions(max_new_tokens, temperature, top_k, top_p=top_p, min_p=min_p)
    idx = model.check_idx(idx, crop_to_block=True)
    steps = stream(model, idx, options, rng, use_cache)
    return np.concatenate([idx, *(ids[:, None] for ids, _ in steps)], axis=1)


def generate_stream(
    model: GPT,
    idx: Any,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    rng: np.random.Generator | None = None,
    use_cache: bool = True,
    *,
    top_p: float | None = None,
    min_p: float | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """`stream` with the options spelled out (``GPT.generate_stream``'s signature)."""
    options = SamplingOptions(max_new_tokens, temperature, top_k, top_p=top_p, min_p=min_p)
    return stream(model, idx, options, rng, use_cache)


def stream(
    model: GPT,
    idx: Any,
    options: SamplingOptions,
    rng: np.random.Generator | None = None,
    use_cache: bool = True,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(next_ids (B,), probs (B, vocab_size))`` per generated token; ``probs`` is the
    distribution the token was drawn from (after temperature, top-k, top-p and min-p).

    The context is cropped to the last ``block_size`` tokens. Arguments are checked here, so bad
    input raises at the call, before the first token. no_grad and eval mode are entered around
    each step only, never held while the caller runs between tokens. ``rng=None`` draws from a
    generator seeded with ``options.seed``, or without a seed from ``glassllm.rng``'s default.
    """
    idx = model.check_idx(idx, crop_to_block=True)
    if not isinstance(options, SamplingOptions):
        raise TypeError(f"options must be SamplingOptions, got {type(options).__name__}")
    if rng is None and options.seed is not None:
        rng = np.random.default_rng(options.seed)
    return _steps(model, idx, options, get_rng(rng), bool(use_cache))


def _steps(
    model: GPT,
    idx: np.ndarray,
    options: SamplingOptions,
    rng: np.random.Generator,
    use_cache: bool,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    block_size = model.config.block_size
    top_k = None if options.top_k is None else min(options.top_k, model.config.vocab_size)
    modules = [m for m in model.modules() if not m._is_hook_point]  # points have no mode
    caches: list[nn.KVCache] | None = None
    # why: a cache never holds more than the prompt and the tokens fed back (the window stops
    # caching at block_size), and a whole block would be 8192 or 131072 positions per layer for
    # SmolLM2 or Llama-3.2: hundreds of MB to GB allocated for a one-line answer.
    capacity = min(idx.shape[1] + options.max_new_tokens, block_size)
    for _ in range(options.max_new_tokens):
        with _inference(modules):
            if not use_cache or idx.shape[1] >= block_size:
                # A full window slides at the next token, shifting every learned position:
                # keys/values cached now could never be reused, so none are stored.
                caches = None
                h = last_position_hidden(model, idx[:, -block_size:])  # (B, 1, E)
            elif caches is not None:
                h = decoding.next_position(model, idx[:, -1:], caches, modules)  # (B, 1, E)
            else:  # first step: fill the caches from the prompt, sized for this call only
                caches = [nn.KVCache(capacity=capacity) for _ in model.blocks]
                h = model.hidden_states(idx, caches)  # (B, T, E)
            logits = model.head(h[:, -1, :]).data  # (B, V)
        probs = probabilities(logits, options.temperature, top_k, options.top_p, options.min_p)
        next_ids = sample(probs, rng)  # (B,)
        idx = np.concatenate([idx, next_ids[:, None]], axis=1)  # (B, T + 1)
        yield next_ids, probs


@dataclasses.dataclass
class TokenChoice:
    """One generated token and what it was drawn from, by token id (a tokenizer words them)."""

    step: int  # 1 for the first generated token
    token_id: int
    prob: float  # the probability it was drawn with
    # the (up to) ``top`` most likely token ids with their probabilities, most likely first;
    # tokens that top-k, top-p or min-p ruled out are not listed: they were not weighed
    alternatives: list[tuple[int, float]]


def explain(
    model: GPT,
    idx: Any,
    options: SamplingOptions,
    rng: np.random.Generator | None = None,
    top: int = 5,
) -> tuple[np.ndarray, list[list[TokenChoice]]]:
    """Generate like `stream` and record every choice: ``(ids (B, T + new), choices)`` with
    ``choices[b][i].token_id == ids[b, T + i]``; the probabilities are the sampler's own."""
    if not is_integer(top) or top < 1:
        raise ValueError(f"top must be a positive integer, got {top!r}")
    idx = model.check_idx(idx, crop_to_block=True)
    choices: list[list[TokenChoice]] = [[] for _ in range(idx.shape[0])]
    new_ids = []
    for step, (next_ids, probs) in enumerate(stream(model, idx, options, rng), start=1):
        ranked = np.argsort(-probs, axis=-1, kind="stable")[:, :top]  # (B, top)
        for b, row in enumerate(choices):
            row.append(
                TokenChoice(
                    step=step,
                    token_id=int(next_ids[b]),
                    prob=float(probs[b, next_ids[b]]),
                    alternatives=[
                        (int(i), float(probs[b, i])) for i in ranked[b] if probs[b, i] > 0.0
                    ],
                )
            )
        new_ids.append(next_ids[:, None])
    return np.concatenate([idx, *new_ids], axis=1), choices


def probabilities(
    logits: np.ndarray,
    temperature: float,
    top_k: int | None,
    top_p: float | None = None,
    min_p: float | None = None,
) -> np.ndarray:
    """``softmax(logits / temperature)`` (B, V) over the ``top_k`` largest logits of each row
    (ties at the k-th are kept), then nucleus (``top_p``) and ``min_p`` filtering:
    `glassllm.models.sampling.distribution`."""
    return sampling.distribution(logits, temperature, top_k, top_p, min_p)  # (B, V)


def sample(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One token id per row of ``probs`` (B, V), drawn the inverse-CDF way ``rng.choice`` works.

    A zero-probability token is never chosen: the cumulative sum does not rise across it.
    """
    cdf = np.cumsum(probs, axis=-1)  # (B, V)
    u = rng.random(probs.shape[0], dtype=cdf.dtype) * cdf[:, -1]  # (B,)
    above = cdf > u[:, None]  # (B, V)
    ids = np.argmax(above, axis=-1).astype(np.int64)  # (B,) first index past u
    # u * sum can round up to the sum itself in float32, leaving no index past it (argmax
    # would then say 0): take the last token that has probability instead.
    missed = ~above[:, -1]  # (B,)
    if missed.any():
        ids[missed] = probs.shape[-1] - 1 - np.argmax(probs[missed, ::-1] > 0, axis=-1)
    return ids


def last_position_hidden(model: GPT, idx: np.ndarray) -> Tensor:
    """The final-norm output at the last position only, (B, 1, E), without caches.

    Equal to ``model.hidden_states(idx)[:, -1:]``; the last block computes only that position
    (``block_last_position``). For generation, under no_grad; ``idx`` is already checked.
    """
    x = model.embed(idx)  # (B, T, E)
    *body, last = model.blocks
    for block in body:
        x = block(x)  # (B, T, E)
    return model.ln_f(block_last_position(last, x))  # (B, 1, E)


def block_last_position(block: Block, x: Tensor) -> Tensor:
    """``block(x)[:, -1:]`` (B, 1, E), with the query, attention, projection and MLP computed for
    the last position alone (keys and values still come from every position): the same
    numbers for about a quarter of the block's work at T = 256.
    """
    if _has_hooks(block):  # every hook sees what it sees in a whole forward
        return block(x)[:, -1:]  # (B, 1, E)
    h = block.ln_1(x)  # (B, T, E)
    cache = nn.KVCache(capacity=x.shape[1])
    if x.shape[1] > 1:
        block.attn.prefill(h[:, :-1], cache)  # keys/values of positions 0..T-2
    return block.residual(x[:, -1:], block.attn(h[:, -1:], kv_cache=cache))  # (B, 1, E)


def _has_hooks(block: nn.Module) -> bool:
    return any(m._forward_hooks or m._forward_pre_hooks for m in block.modules())


@contextmanager
def _inference(modules: list[nn.Module]) -> Iterator[None]:
    """no_grad and eval mode for one step; each module's previous mode comes back after. The
    module list is built once per stream (`nn.eval_mode` takes it, so no walk per token)."""
    with nn.eval_mode(modules), no_grad():
        yield

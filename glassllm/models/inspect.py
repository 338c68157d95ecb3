"""Look inside a GPT's forward pass: attention, residual stream, logit lens and MLP activations.

`inspect(model, ids)` runs the model's own forward (``model(idx)``, the very call that training
and scoring make) and records, on the way, what its hook points (`glassllm.models.hooks`) saw:
forward hooks attached for the duration of the call only, so the numbers are those of
`GPT.forward` and cannot drift from it:

* ``blocks.0.hook_resid_pre``: the embedding output ``wte[ids] + wpe[positions]`` (residual
  stream 0); ``blocks.{i}.hook_resid_post``: the residual stream after block ``i``;
* ``blocks.{i}.attn.hook_pattern``: the attention probabilities, computed beside the fused op
  (which never forms them) from the layer's own queries and keys, QK-norm and rotary positions
  included, with its scale and window (a grouped-query head reads its kv head);
* ``blocks.{i}.attn.hook_v`` and ``hook_z``: the values, and the fused attention's output, against
  which the recomputed ``P @ V`` is checked (``attention_check``);
* ``blocks.{i}.mlp.hook_post``: the MLP's hidden activations, its "neurons": ``GELU(fc(x))``,
  or ``silu(gate(x)) * up(x)`` for a SwiGLU MLP (the product is what the output projection
  reads, so each unit's value is its whole contribution's weight).

The logit lens (`logit_lens`) reads every residual stream through the final norm and the head
(``model.ln_f`` then ``model.head``), exactly as the forward reads the last one: its last row is
the model's own next-token distribution. When the head is tied to ``wte``, the embedding row
mostly predicts the current token itself (``x @ wte^T`` is largest for
``x ~ wte[token]``). The whole lens is ``(L + 1, T, V)`` numbers (for GPT-2 at T = 1024, 13 x
1024 x 50257 floats): by default it is computed a few rows at a time and only the ``lens_top``
most likely tokens of each row and the probability of the actual next token are kept;
``full_lens=True`` keeps every probability as well.

>>> import numpy as np
>>> from glassllm.models import GPT, GPTConfig
>>> model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8),
...             rng=np.random.default_rng(0))
>>> seen = inspect(model, [1, 2, 3])
>>> seen.attention.shape, seen.residual.shape, seen.mlp.shape
((2, 2, 3, 3), (3, 3, 8), (2, 3, 32))
>>> seen.lens.top_ids.shape, seen.lens.next_p.shape, seen.lens.full is None
((3, 3, 5), (3, 2), True)
>>> inspect(model, [1, 2, 3], full_lens=True).lens.full.shape
(3, 3, 11)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from contextlib import ExitStack

import numpy as np

import glassllm.functional as F
from glassllm.autograd import no_grad
from glassllm.models.gpt import GPT
from glassllm.nn.module import Module
from glassllm.tensor import Tensor

# Where each recorded quantity comes from (the page names these beside each panel). Each is
# "path: name (comment)", name a function or Class.attribute defined in that file.
SOURCES = {
    "attention": (
        "glassllm/nn/attention.py: CausalSelfAttention.forward (blocks[i].attn.hook_pattern, "
        "computed beside the fused op in glassllm/nn/attention_hooks.py)"
    ),
    "residual": "glassllm/models/gpt.py: Block.forward (hook_resid_pre, hook_resid_post)",
    "lens": "glassllm/models/inspect.py: logit_lens (GPT.ln_f then GPT.head)",
    "mlp": "glassllm/models/gpt.py: MLP.forward (blocks[i].mlp.hook_post)",
    "logits": "glassllm/models/gpt.py: GPT.forward",
}

LENS_TOP = 5  # tokens kept per lens cell by default
# Lens rows (stage, position) computed at once: about this many probabilities, whatever V is.
LENS_CHUNK = 1 << 20


@dataclasses.dataclass
class LogitLens:
    """The logit lens of one pass: for each stage of the residual stream (row 0 the embedding
    output, row i + 1 the output of block i) and each position, the next-token distribution
    ``softmax(head(ln_f(residual)))``, reduced to what can be shown.

    top_ids: (L + 1, T, k) int64, the k most likely tokens, most likely first (`top_k`)
    top_p:   (L + 1, T, k) their probabilities
    next_p:  (L + 1, T - 1) the probability of the token that actually comes next, ``ids[t + 1]``
    full:    (L + 1, T, V) every probability (``full[-1] = softmax(logits)``), only when asked
             for (``inspect(..., full_lens=True)``); None otherwise
    """

    top_ids: np.ndarray
    top_p: np.ndarray
    next_p: np.ndarray
    full: np.ndarray | None = None


@dataclasses.dataclass
class Inspection:
    """What one forward pass over ``ids`` (T tokens) computed; NumPy arrays of the model's dtype.

    ids:        (T,) int64, the tokens
    logits:     (T, V) ``model(ids)`` logits
    attention:  (L, H, T, T) attention probabilities [layer][head][query][key]; each row sums
                to 1 and is 0 above the diagonal (a query sees itself and earlier keys only)
    residual:   (L + 1, T, E) the residual stream: row 0 the embedding output, row i + 1 the
                output of block i
    lens:       `LogitLens`: the next-token distribution each stage of the stream would give
                (``softmax(head(ln_f(residual[i])))``), as top tokens per stage and position
    mlp:        (L, T, M) hidden activations of each block's MLP (the input of its ``proj``:
                GELU for GPT-2's MLP, ``silu(gate) * up`` for SwiGLU)
    attention_check: max |P @ V - fused attention output| over the blocks (0 or float rounding)
    """

    ids: np.ndarray
    logits: np.ndarray
    attention: np.ndarray
    residual: np.ndarray
    lens: LogitLens
    mlp: np.ndarray
    attention_check: float

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays held (what keeping this inspection costs)."""
        arrays = [
            self.ids,
            self.logits,
            self.attention,
            self.residual,
            self.mlp,
            self.lens.top_ids,
            self.lens.top_p,
            self.lens.next_p,
        ]
        if self.lens.full is not None:
            arrays.append(self.lens.full)
        return sum(array.nbytes for array in arrays)

    def _repr_html_(self) -> str:  # Jupyter draws this panel instead of the repr
        from glassllm.html import inspection_panel

        return inspection_panel(self)


def inspect(
    model: GPT, ids: Sequence[int] | np.ndarray, lens_top: int = LENS_TOP, full_lens: bool = False
) -> Inspection:
    """Run ``model`` on ``ids`` (1-D, 1 <= T <= block_size) and record its insides.

    lens_top: tokens kept per cell of the logit lens; full_lens: keep the whole
    ``(L + 1, T, V)`` lens too (for a GPT-2-sized vocabulary and context, gigabytes).

    Runs under no_grad and in eval mode (no dropout), restoring the model's mode afterwards.
    Not thread-safe: the recording briefly attaches hooks to ``model``, and no_grad is
    process-global, so callers serialise model computations.
    """
    if not isinstance(model, GPT):
        raise TypeError(f"inspect needs a GPT, got {type(model).__name__}")
    idx = np.asarray(ids)
    if idx.ndim != 1:
        raise ValueError(f"ids must be a 1-D sequence of token ids, got shape {idx.shape}")
    idx = model.check_idx(idx[None, :])  # (1, T): the model's own checks and messages
    layers, steps = len(model.blocks), idx.shape[1]
    attn = model.blocks[0].attn
    dtype, E, M = model.dtype, model.config.n_embd, model.config.mlp_size
    # Written layer by layer into arrays of their final shape: no list of layers stacked
    # afterwards, which would hold both copies at once (GPT-2 at T = 1024: 600 MB of attention)
    residual = np.empty((layers + 1, steps, E), dtype)
    attention = np.empty((layers, attn.num_heads, steps, steps), dtype)
    mlp = np.empty((layers, steps, M), dtype)
    values: list[np.ndarray | None] = [None] * layers  # (T, KV, hd) per block
    fused: list[np.ndarray | None] = [None] * layers  # (T, H, hd) per block
    targets = {"blocks.0.hook_resid_pre": (residual, 0)}
    for i in range(layers):
        p = f"blocks.{i}."
        targets[p + "hook_resid_post"] = (residual, i + 1)
        targets[p + "attn.hook_pattern"] = (attention, i)
        targets[p + "mlp.hook_post"] = (mlp, i)
        targets[p + "attn.hook_v"] = (values, i)
        targets[p + "attn.hook_z"] = (fused, i)
    fired: dict[str, int] = dict.fromkeys(targets, 0)

    def recorder(name: str) -> Callable:
        store, row = targets[name]

        def record(_point: Module, _args: tuple, out: Tensor) -> None:
            store[row] = out.data[0] if isinstance(store, np.ndarray) else np.array(out.data[0])
            fired[name] += 1

        return record

    points = model.hook_points()
    with ExitStack() as stack:
        stack.enter_context(model.evaluating())
        stack.enter_context(no_grad())
        for name in targets:
            stack.callback(points[name].register_forward_hook(recorder(name)).remove)
        logits, _ = model(idx)  # (1, T, V)
        if any(count != 1 for count in fired.values()):
            raise RuntimeError("inspect: the forward did not run each block exactly once")
        lens = logit_lens(model, residual, idx[0], lens_top, full_lens)

    check = max(_attention_gap(attention[i], values[i], fused[i]) for i in range(layers))
    return Inspection(
        ids=idx[0],
        logits=logits.data[0],
        attention=attention,
        residual=residual,
        lens=lens,
        mlp=mlp,
        attention_check=check,
    )


def logit_lens(
    model: GPT, residual: np.ndarray, ids: np.ndarray, top: int = LENS_TOP, full: bool = False
) -> LogitLens:
    """The lens of residual streams ``(S, T, E)`` of tokens ``ids (T,)``: each row read through
    ``model.ln_f`` and ``model.head``, then softmax; about `LENS_CHUNK` probabilities at a time,
    of which the ``top`` largest per row and the next token's are kept (all of them if ``full``).
    Call under no_grad."""
    stages, steps, embed = residual.shape
    vocab = model.config.vocab_size
    rows = residual.reshape(stages * steps, embed)
    next_ids = np.tile(np.append(ids[1:], 0), stages)  # (S * T,): position T - 1 has none
    top = min(top, vocab)
    top_ids = np.empty((stages * steps, top), dtype=np.int64)
    top_p = np.empty((stages * steps, top), dtype=residual.dtype)
    next_p = np.empty(stages * steps, dtype=residual.dtype)
    everything = np.empty((stages * steps, vocab), dtype=residual.dtype) if full else None
    chunk = max(1, LENS_CHUNK // vocab)
    for start in range(0, stages * steps, chunk):
        stop = min(start + chunk, stages * steps)
        p = F.softmax(model.head(model.ln_f(Tensor(rows[start:stop]))), axis=-1).data  # (c, V)
        top_ids[start:stop], top_p[start:stop] = top_k(p, top)
        next_p[start:stop] = p[np.arange(stop - start), next_ids[start:stop]]
        if everything is not None:
            everything[start:stop] = p
    return LogitLens(
        top_ids=top_ids.reshape(stages, steps, top),
        top_p=top_p.reshape(stages, steps, top),
        next_p=next_p.reshape(stages, steps)[:, :-1],
        full=None if everything is None else everything.reshape(stages, steps, vocab),
    )


def top_k(values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest entries along the last axis, largest first, equal values by lower
    index: ``(indices int64, values)``, each ``(..., min(k, n))``. A partition
    (``np.argpartition``) then a sort of the ``k`` chosen, not a sort of all ``n``; which of
    several entries equal to the ``k``-th largest are kept is unspecified."""
    n = values.shape[-1]
    k = min(k, n)
    if k < n:
        chosen = np.argpartition(values, n - k, axis=-1)[..., n - k :]  # (..., k), any order
    else:
        chosen = np.broadcast_to(np.arange(n), values.shape)
    picked = np.take_along_axis(values, chosen, axis=-1)
    order = np.lexsort((chosen, -picked), axis=-1)  # by value descending, then by index
    return (
        np.take_along_axis(chosen, order, axis=-1).astype(np.int64),
        np.take_along_axis(picked, order, axis=-1),
    )


def _attention_gap(probs: np.ndarray, v: np.ndarray, z: np.ndarray) -> float:
    """max |P @ V - z| of one layer: ``probs (H, T, T)``, ``v (T, KV, hd)``, the fused output
    ``z (T, H, hd)``; a grouped-query head reads its kv head."""
    heads, steps, _ = probs.shape
    kv_heads = v.shape[1]
    groups = probs.reshape(kv_heads, heads // kv_heads, steps, steps)
    out = (groups @ v.transpose(1, 0, 2)[:, None]).reshape(heads, steps, -1)  # (H, T, hd)
    return float(np.max(np.abs(out - z.transpose(1, 0, 2)))) if out.size else 0.0

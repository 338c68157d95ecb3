"""Look inside a GPT's forward pass: attention, residual stream, logit lens and MLP activations.

`inspect(model, ids)` runs the model's own forward (``model(idx)``, the very call that training
and scoring make) and records, on the way, what each sub-module produced. The recording wraps the
``forward`` of a few sub-modules for the duration of the call only (an instance attribute that
shadows the class method and is removed afterwards), so the numbers are those of `GPT.forward`
and cannot drift from it:

* ``model.drop`` output: the embedding output ``wte[ids] + wpe[positions]`` (residual stream 0);
* ``blocks[i]`` output: the residual stream after block ``i``;
* ``blocks[i].attn.qkv`` output: the packed queries, keys and values of block ``i``, from which
  the attention probabilities are recomputed with the fused attention's own forward
  (``functional/attention.py: _attention_forward``), since the fused op does not return them;
* ``blocks[i].attn.proj`` input: the fused attention's output, against which the recomputed
  ``P @ V`` is checked (``attention_check``);
* ``blocks[i].mlp.gelu`` output: the MLP's GELU activations.

The logit lens reads every residual stream through the final LayerNorm and the tied head
(``model.ln_f`` then ``model.head``), exactly as the forward reads the last one: its last row
is the model's own next-token distribution. Because the head is tied to ``wte``, the embedding
row mostly predicts the current token itself (``x @ wte^T`` is largest for ``x ~ wte[token]``).

>>> import numpy as np
>>> from glassllm.models import GPT, GPTConfig
>>> model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8),
...             rng=np.random.default_rng(0))
>>> seen = inspect(model, [1, 2, 3])
>>> seen.attention.shape, seen.residual.shape, seen.lens.shape, seen.mlp.shape
((2, 2, 3, 3), (3, 3, 8), (3, 3, 11), (2, 3, 32))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import numpy as np

import glassllm.functional as F
from glassllm.autograd import no_grad
from glassllm.functional.attention import _attention_forward, _mask_bias
from glassllm.models.gpt import GPT
from glassllm.nn.module import Module
from glassllm.tensor import Tensor

# Where each recorded quantity comes from (the page names these beside each panel).
SOURCES = {
    "attention": "glassllm/functional/attention.py: _attention_forward (on blocks[i].attn.qkv)",
    "residual": "glassllm/models/gpt.py: GPT.hidden_states (model.drop and blocks[i] outputs)",
    "lens": "glassllm/models/gpt.py: GPT.ln_f then GPT.head (tied to wte)",
    "mlp": "glassllm/models/gpt.py: MLP.gelu output (blocks[i].mlp.gelu)",
    "logits": "glassllm/models/gpt.py: GPT.forward",
}


@dataclasses.dataclass
class Inspection:
    """What one forward pass over ``ids`` (T tokens) computed; NumPy arrays of the model's dtype.

    ids:        (T,) int64, the tokens
    logits:     (T, V) ``model(ids)`` logits
    attention:  (L, H, T, T) attention probabilities [layer][head][query][key]; each row sums
                to 1 and is 0 above the diagonal (a query sees itself and earlier keys only)
    residual:   (L + 1, T, E) the residual stream: row 0 the embedding output, row i + 1 the
                output of block i
    lens:       (L + 1, T, V) softmax of ``head(ln_f(residual[i]))``: the next-token
                distribution each stage of the stream would give; ``lens[-1] = softmax(logits)``
    mlp:        (L, T, 4E) GELU activations of each block's MLP
    attention_check: max |P @ V - fused attention output| over the blocks (0 or float rounding)
    """

    ids: np.ndarray
    logits: np.ndarray
    attention: np.ndarray
    residual: np.ndarray
    lens: np.ndarray
    mlp: np.ndarray
    attention_check: float


def inspect(model: GPT, ids: Sequence[int] | np.ndarray) -> Inspection:
    """Run ``model`` on ``ids`` (1-D, 1 <= T <= block_size) and record its insides.

    Runs under no_grad and in eval mode (no dropout), restoring the model's mode afterwards.
    Not thread-safe: the recording briefly wraps sub-modules of ``model``, and no_grad is
    process-global, so callers serialise model computations.
    """
    if not isinstance(model, GPT):
        raise TypeError(f"inspect needs a GPT, got {type(model).__name__}")
    idx = np.asarray(ids)
    if idx.ndim != 1:
        raise ValueError(f"ids must be a 1-D sequence of token ids, got shape {idx.shape}")
    idx = model.check_idx(idx[None, :])  # (1, T): the model's own checks and messages
    num_heads = model.config.n_head
    embeddings: list[np.ndarray] = []
    streams: list[np.ndarray] = []
    probabilities: list[np.ndarray] = []
    attention_outputs: list[np.ndarray] = []
    activations: list[np.ndarray] = []

    def record_qkv(_args: tuple, qkv: Tensor) -> None:
        probabilities.append(_attention_probabilities(qkv.data, num_heads))

    with ExitStack() as stack:
        stack.enter_context(_eval_mode(model))
        stack.enter_context(no_grad())
        stack.enter_context(_recording(model.drop, lambda _a, out: embeddings.append(out.data)))
        for block in model.blocks:
            stack.enter_context(_recording(block, lambda _a, out: streams.append(out.data)))
            stack.enter_context(_recording(block.attn.qkv, record_qkv))
            stack.enter_context(
                _recording(block.attn.proj, lambda args, _o: attention_outputs.append(args[0].data))
            )
            stack.enter_context(
                _recording(block.mlp.gelu, lambda _a, out: activations.append(out.data))
            )
        logits, _ = model(idx)  # (1, T, V)
        if len(streams) != len(model.blocks) or len(embeddings) != 1:
            raise RuntimeError("inspect: the forward did not run each block exactly once")
        residual = np.concatenate([embeddings[0], *streams], axis=0)  # (L + 1, T, E)
        lens = F.softmax(model.head(model.ln_f(Tensor(residual))), axis=-1).data  # (L+1, T, V)

    attention = np.stack([p[0] for p, _ in probabilities])  # (L, H, T, T)
    check = max(
        float(np.max(np.abs(out - fused))) if out.size else 0.0
        for (_, out), fused in zip(probabilities, attention_outputs, strict=True)
    )
    return Inspection(
        ids=idx[0],
        logits=logits.data[0],
        attention=attention,
        residual=residual,
        lens=lens,
        mlp=np.stack([a[0] for a in activations]),
        attention_check=check,
    )


def _attention_probabilities(qkv: np.ndarray, num_heads: int) -> tuple[np.ndarray, np.ndarray]:
    """Causal attention of a packed ``qkv`` (B, T, 3E), as `F.packed_attention` computes it:
    ``(P (B, nh, T, T), output (B, T, E))`` with the heads of the output merged again."""
    batch, steps, three_embed = qkv.shape
    head_size = three_embed // 3 // num_heads
    heads = qkv.reshape(batch, steps, 3, num_heads, head_size).transpose(2, 0, 3, 1, 4)
    bias = _mask_bias(steps, steps, True, None, qkv.dtype)
    scale = 1.0 / np.sqrt(head_size)
    out, residuals = _attention_forward(
        heads[0], heads[1], heads[2], float(scale), bias, 0.0, None, qkv.dtype
    )  # (B, nh, T, hs)
    probs = residuals[3]  # (B, nh, T, T)
    merged = out.transpose(0, 2, 1, 3).reshape(batch, steps, num_heads * head_size)
    return probs, merged


@contextmanager
def _recording(module: Module, record: Callable[[tuple, Any], None]) -> Iterator[None]:
    """Call ``record(args, output)`` after each ``module(*args)`` while the context is open."""
    if "forward" in module.__dict__:
        raise RuntimeError(f"{type(module).__name__} is already being recorded")
    original = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        output = original(*args, **kwargs)
        record(args, output)
        return output

    object.__setattr__(module, "forward", forward)  # shadows the class's forward on this object
    try:
        yield
    finally:
        module.__dict__.pop("forward", None)


@contextmanager
def _eval_mode(model: Module) -> Iterator[None]:
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, mode in modes:
            object.__setattr__(module, "training", mode)

"""A GPT language model built from glassllm.nn layers, read top to bottom like nanoGPT's model.py.

One decoder, configured (`GPTConfig`, in ``glassllm.models.config``): token embedding (plus a
learned position embedding, or rotary positions inside attention) -> dropout -> n_layer
pre-norm blocks of ``x + attn(ln_1(x))``, ``x + mlp(ln_2(x))`` (or, with a parallel residual,
``x + attn(ln_1(x)) + mlp(ln_2(x))``) -> final norm -> logits through the token embedding matrix
(the head *tied* to ``wte``: one parameter, used twice) or an own ``lm_head``. GPT-2, Llama,
Qwen2/3, GPT-NeoX and GPT-Neo are configurations of it.

Parameter names are flat (no ``transformer.`` wrapper prefix) and are the checkpoint tensor names;
`parameter_shapes` is the table of them, with nanoGPT's names beside ours.

Linear weights are stored (in, out), so ``y = x @ W``: the transpose of PyTorch's layout.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

import glassllm.functional as F
import glassllm.nn as nn
from glassllm.models import generation, hooks
from glassllm.models.config import (  # noqa: F401  (re-exported: glassllm.models.gpt.X)
    MAX_CONTEXT,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_VOCAB,
    MAX_WIDTH,
    GPTConfig,
    llama_config,
    parameter_count,
    parameter_shapes,
    size_problems,
)
from glassllm.optim import AdamW
from glassllm.rng import get_rng
from glassllm.tensor import Tensor

# Scale of every Linear weight and embedding at initialisation (GPT-2).
INIT_STD = 0.02


class MLP(nn.Module):
    """Position-wise feed-forward: Linear(E, M) -> GELU -> Linear(M, E) -> dropout; M is 4E for
    GPT-2, GELU its tanh approximation (``mlp="gelu"``: the exact erf one, GPT-NeoX)."""

    def __init__(self, config: GPTConfig, rng: np.random.Generator | None, dtype: Any) -> None:
        super().__init__()
        E, M, bias = config.n_embd, config.mlp_size, config.has_bias("mlp")
        self.fc = nn.Linear(E, M, bias=bias, dtype=dtype, rng=rng)
        self.gelu = nn.GELU(approximate="tanh" if config.mlp == "gelu_tanh" else "none")
        self.proj = nn.Linear(M, E, bias=bias, dtype=dtype, rng=rng)
        self.dropout = nn.Dropout(config.dropout, rng=rng)
        self.hook_pre = nn.HookPoint()  # (B, T, M) fc(x), before the GELU
        self.hook_post = nn.HookPoint()  # (B, T, M) after it: what proj reads

    def forward(self, x: Tensor) -> Tensor:
        x = self.hook_post(self.gelu(self.hook_pre(self.fc(x))))  # (B, T, M)
        return self.dropout(self.proj(x))  # (B, T, E)


class SwiGLUMLP(nn.SwiGLU):
    """Llama's gated feed-forward: ``proj(silu(gate(x)) * up(x))`` (`nn.SwiGLU`), then dropout.

    Hook points as TransformerLens's gated MLP: ``hook_pre`` ``gate(x)`` (before the SiLU),
    ``hook_pre_linear`` ``up(x)``, ``hook_post`` ``silu(gate(x)) * up(x)`` (what proj reads).
    """

    def __init__(self, config: GPTConfig, rng: np.random.Generator | None, dtype: Any) -> None:
        bias = config.has_bias("mlp")
        super().__init__(config.n_embd, config.mlp_size, bias=bias, dtype=dtype, rng=rng)
        self.dropout = nn.Dropout(config.dropout, rng=rng)
        self.hook_pre = nn.HookPoint()  # (B, T, M)
        self.hook_pre_linear = nn.HookPoint()  # (B, T, M)
        self.hook_post = nn.HookPoint()  # (B, T, M)

    def forward(self, x: Tensor) -> Tensor:  # nn.SwiGLU.forward with the hook points
        gate, up = self.hook_pre(self.gate(x)), self.hook_pre_linear(self.up(x))  # (B, T, M)
        hidden = self.hook_post(F.swiglu(gate, up))  # (B, T, M)
        return self.dropout(self.proj(hidden))  # (B, T, E)


def norm_layer(config: GPTConfig, dtype: Any) -> nn.Module:
    """The configuration's normalisation over the residual width: LayerNorm or RMSNorm."""
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, eps=config.norm_eps, dtype=dtype)
    return nn.LayerNorm(
        config.n_embd, eps=config.norm_eps, bias=config.has_bias("norm"), dtype=dtype
    )


class Block(nn.Module):
    """Pre-norm transformer block: the residual stream passes through untouched, each sub-layer
    adds its contribution (which is why the residual projections get a smaller initial scale).
    ``layer`` is the block's index (local attention is chosen per block).

    Hook points (B, T, E), TransformerLens's: ``hook_resid_pre`` (the input), ``hook_attn_out``,
    ``hook_resid_mid`` (input + attention; none with a parallel residual, as TransformerLens),
    ``hook_mlp_out``, ``hook_resid_post`` (the output)."""

    def __init__(
        self, config: GPTConfig, rng: np.random.Generator | None, dtype: Any, layer: int = 0
    ) -> None:
        super().__init__()
        E = config.n_embd
        self.parallel_residual = config.parallel_residual
        self.ln_1 = norm_layer(config, dtype)
        self.attn = nn.CausalSelfAttention(
            E,
            config.n_head,
            dropout=config.dropout,
            bias=config.bias,
            dtype=dtype,
            rng=rng,
            num_kv_heads=config.n_kv_head,
            head_dim=config.head_dim,
            qkv_bias=config.has_bias("qkv"),
            out_bias=config.has_bias("attn_out"),
            qk_norm=config.qk_norm,
            norm_eps=config.norm_eps,
            rotary_dim=config.rotary_size or None,
            rope_theta=config.rope_theta,
            rope_scaling=config.rope_scaling,
            rotary_interleaved=config.rotary_interleaved,
            scale=config.attention_scale,
            window=config.window_of(layer),
        )
        self.ln_2 = norm_layer(config, dtype)
        self.mlp = (
            SwiGLUMLP(config, rng, dtype) if config.mlp == "swiglu" else MLP(config, rng, dtype)
        )
        self.hook_resid_pre, self.hook_attn_out = nn.HookPoint(), nn.HookPoint()
        if not self.parallel_residual:
            self.hook_resid_mid = nn.HookPoint()
        self.hook_mlp_out, self.hook_resid_post = nn.HookPoint(), nn.HookPoint()

    def forward(self, x: Tensor, kv_cache: nn.KVCache | None = None) -> Tensor:
        x = self.hook_resid_pre(x)  # (B, T, E)
        return self.residual(x, self.attn(self.ln_1(x), kv_cache=kv_cache))  # (B, T, E)

    def residual(self, x: Tensor, attended: Tensor) -> Tensor:
        """The block's output from its input ``x`` and the attention's output ``attended``."""
        attended = self.hook_attn_out(attended)  # (B, T, E)
        if self.parallel_residual:  # GPT-NeoX: both sub-layers read the block's input
            return self.hook_resid_post(x + attended + self.hook_mlp_out(self.mlp(self.ln_2(x))))
        x = self.hook_resid_mid(x + attended)  # (B, T, E)
        return self.hook_resid_post(x + self.hook_mlp_out(self.mlp(self.ln_2(x))))  # (B, T, E)


class GPT(nn.Module):
    """Decoder-only language model of any `GPTConfig` (GPT-2 by default).

    >>> import numpy as np
    >>> from glassllm.models import GPT, GPTConfig
    >>> config = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8)
    >>> model = GPT(config, rng=np.random.default_rng(0))
    >>> idx = np.array([[1, 2, 3]])
    >>> logits, loss = model(idx, targets=np.array([[2, 3, 4]]))
    >>> logits.shape, loss.shape
    ((1, 3, 11), ())
    >>> model.generate(idx, max_new_tokens=4, rng=np.random.default_rng(0)).shape
    (1, 7)
    >>> llama = GPT(llama_config(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8))
    >>> llama(idx)[0].shape, "wpe" in llama.state_dict()
    ((1, 3, 11), False)
    """

    def __init__(
        self,
        config: GPTConfig,
        rng: np.random.Generator | None = None,
        dtype: Any = np.float32,
        init: bool = True,
    ) -> None:
        """``init=False`` builds the model without initialising it (`glassllm.nn.init.skip_init`):
        no random number is drawn and the parameters hold unspecified values until a checkpoint
        or file is read into them."""
        if not isinstance(config, GPTConfig):
            raise TypeError(f"GPT needs a GPTConfig, got {type(config).__name__}")
        super().__init__()
        with contextlib.nullcontext() if init else nn.init.skip_init():
            self._build(config, rng, dtype)

    def _build(self, config: GPTConfig, rng: np.random.Generator | None, dtype: Any) -> None:
        # rng draws the initial weights and, during training, the dropout masks. Left None, the
        # masks come from glassllm.rng's default generator at call time, so manual_seed (and a
        # checkpoint that saves that generator) governs them.
        init_rng = get_rng(rng)
        self.config = config
        self.dtype = np.dtype(dtype)
        E = config.n_embd
        self.wte = nn.Embedding(config.vocab_size, E, dtype=dtype, rng=init_rng)
        self.wpe = (  # rotary positions live inside attention instead
            nn.Embedding(config.block_size, E, dtype=dtype, rng=init_rng)
            if config.positions == "learned"
            else None
        )
        self.drop = nn.Dropout(config.dropout, rng=rng)
        self.blocks = nn.ModuleList([Block(config, rng, dtype, i) for i in range(config.n_layer)])
        self.ln_f = norm_layer(config, dtype)
        # A tied head has no module: the output projection is wte.weight itself (weight tying),
        # so the parameter list holds it once and its gradient sums both uses.
        self.lm_head = (
            None
            if config.tied_head
            else nn.Linear(E, config.vocab_size, bias=False, dtype=dtype, rng=init_rng)
        )
        # TransformerLens's embedding sites (B, T, E); hook_pos_embed only with learned positions
        self.hook_embed = nn.HookPoint()
        if self.wpe is not None:
            self.hook_pos_embed = nn.HookPoint()
        self._init_weights(init_rng)
        hooks.name_hook_points(self)

    def _init_weights(self, rng: np.random.Generator) -> None:
        """GPT-2 initialisation, for every configuration: Linear weights and embeddings
        N(0, 0.02), biases zero, norms ones/zeros, and the two projections that write into the
        residual stream per block (attn.proj, mlp.proj) N(0, 0.02/sqrt(2 * n_layer)) so the
        stream's variance does not grow with depth."""
        residual_std = INIT_STD / math.sqrt(2 * self.config.n_layer)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = residual_std if name.endswith(("attn.proj", "mlp.proj")) else INIT_STD
                nn.init.normal_(module.weight, mean=0.0, std=std, rng=rng)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=INIT_STD, rng=rng)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                nn.init.ones_(module.weight)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    # ------------------------------------------------------------------ forward

    def forward(
        self,
        idx: Any,
        targets: Any = None,
        kv_caches: list[nn.KVCache] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Logits for every position, and the mean cross-entropy when ``targets`` are given.

        idx: int array (B, T), T <= block_size. targets: int array (B, T) or None; a target of -1
        is ignored (as in nanoGPT), the loss is the mean over the other positions.
        Returns (logits (B, T, vocab_size), loss scalar Tensor or None). Unlike nanoGPT, inference
        also returns logits for all T positions (useful for scoring text); generate() computes the
        head on the last position only.
        kv_caches: one nn.KVCache per block (used by generate); positions then start at the cache
        length, and idx holds only the new tokens.
        """
        x = self.hidden_states(idx, kv_caches)  # (B, T, E)
        logits = self.head(x)  # (B, T, V)
        if targets is None:
            return logits, None
        targets = self._check_targets(targets, logits.shape[:2])
        # ignore_index=-1 as nanoGPT: a target of -1 marks a position that does not count.
        return logits, F.cross_entropy(logits, targets, ignore_index=-1)

    def hidden_states(self, idx: Any, kv_caches: list[nn.KVCache] | None = None) -> Tensor:
        """Final-norm output (B, T, E) for tokens ``idx`` placed after what the caches hold."""
        idx = self.check_idx(idx)
        start = 0
        if kv_caches is not None:
            if len(kv_caches) != len(self.blocks):
                raise ValueError(
                    f"kv_caches has {len(kv_caches)} entries but the model has "
                    f"{len(self.blocks)} blocks"
                )
            start = kv_caches[0].length
        if start + idx.shape[1] > self.config.block_size:
            raise ValueError(
                f"sequence length {start + idx.shape[1]} exceeds block_size "
                f"{self.config.block_size}"
            )
        x = self.embed(idx, start)  # (B, T, E)
        for i, block in enumerate(self.blocks):
            x = block(x, kv_cache=None if kv_caches is None else kv_caches[i])  # (B, T, E)
        return self.ln_f(x)  # (B, T, E)

    def embed(self, idx: np.ndarray, start: int = 0) -> Tensor:
        """Token (plus learned position) embedding, then dropout: (B, T, E) for checked ids at
        positions ``start, start + 1, ...``."""
        tok_emb = self.hook_embed(self.wte(idx))  # (B, T, E)
        if self.wpe is None:  # rotary: each attention layer rotates q and k by position
            return self.drop(tok_emb)  # (B, T, E)
        positions = np.arange(start, start + idx.shape[1])  # (T,)
        pos_emb = self.wpe(positions)  # (T, E), broadcast over the batch
        if self.hook_pos_embed.active:  # shown (B, T, E), as TransformerLens
            pos_emb = self.hook_pos_embed(hooks.broadcast_to(pos_emb, tok_emb.shape))
        return self.drop(tok_emb + pos_emb)  # (B, T, E)

    def head(self, x: Tensor) -> Tensor:
        """Output head: logits (..., V) = x @ wte.weightᵀ when tied, else ``lm_head(x)``."""
        if self.lm_head is not None:
            return self.lm_head(x)  # (B, T, V)
        return self.wte.attend(x)  # (B, T, V): x @ wte.weight^T

    def check_idx(self, idx: Any, crop_to_block: bool = False) -> np.ndarray:
        """``idx`` as an int64 (B, T) array of in-vocabulary ids, T >= 1; longer than block_size
        only when ``crop_to_block`` (generation keeps the last block_size tokens itself)."""
        idx = np.asarray(idx.data if isinstance(idx, Tensor) else idx)
        if idx.ndim != 2:
            raise ValueError(f"idx must have shape (B, T), got shape {idx.shape}")
        if not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(f"idx must hold integer token ids, got dtype {idx.dtype}")
        if idx.shape[1] == 0:
            raise ValueError("idx must hold at least one token per row, got T = 0")
        if idx.shape[1] > self.config.block_size and not crop_to_block:
            raise ValueError(
                f"sequence length T={idx.shape[1]} exceeds block_size={self.config.block_size}"
            )
        low, high = int(idx.min()), int(idx.max())
        if low < 0 or high >= self.config.vocab_size:
            bad = low if low < 0 else high
            raise ValueError(
                f"token id {bad} is outside the vocabulary [0, {self.config.vocab_size})"
            )
        return idx.astype(np.int64, copy=False)

    def _check_targets(self, targets: Any, shape: tuple[int, ...]) -> np.ndarray:
        targets = np.asarray(targets.data if isinstance(targets, Tensor) else targets)
        if targets.shape != tuple(shape):
            raise ValueError(
                f"targets shape {targets.shape} does not match idx shape {tuple(shape)}"
            )
        if not np.issubdtype(targets.dtype, np.integer):
            raise ValueError(f"targets must hold integer token ids, got dtype {targets.dtype}")
        return targets

    # --------------------------------------------------------------- generation

    def generate(
        self,
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
        """Sample ``max_new_tokens`` tokens after ``idx`` (B, T): the int array (B, T + new).
        ``top_p`` (nucleus) and ``min_p`` filter the distribution after top-k.

        See ``glassllm.models.generation`` for the sampling rule and the key/value cache.
        """
        return generation.generate(
            self, idx, max_new_tokens, temperature, top_k, rng, use_cache, top_p=top_p, min_p=min_p
        )

    def generate_stream(
        self,
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
        """Yield ``(next_ids (B,), probs (B, vocab_size))`` per generated token; ``probs`` is the
        distribution after temperature, top-k, ``top_p`` and ``min_p``.

        See ``glassllm.models.generation.generate_stream``.
        """
        return generation.generate_stream(
            self, idx, max_new_tokens, temperature, top_k, rng, use_cache, top_p=top_p, min_p=min_p
        )

    # ------------------------------------------------------------- hook points

    def hook_points(self) -> dict[str, nn.HookPoint]:
        """``{TransformerLens name: HookPoint}`` of every site (`glassllm.models.hooks`)."""
        return hooks.hook_points(self)

    def reset_hooks(self) -> None:
        """Remove every hook from every hook point (TransformerLens's ``reset_hooks``)."""
        for point in hooks.hook_points(self).values():
            point.remove_hooks()

    def run_with_cache(
        self,
        ids: Any,
        names: hooks.NameFilter = None,
        *,
        metric: Callable[[Tensor], Tensor] | None = None,
    ) -> tuple[Tensor, hooks.ActivationCache]:
        """``(logits, cache)`` of ``model(ids)`` (see `glassllm.models.hooks.run_with_cache`)."""
        return hooks.run_with_cache(self, ids, names, metric=metric)

    def run_with_hooks(
        self, ids: Any, fwd_hooks: Iterable[tuple[Any, hooks.HookFn]] = ()
    ) -> Tensor:
        """The logits of ``model(ids)`` with ``fwd_hooks`` attached
        (`glassllm.models.hooks.run_with_hooks`)."""
        return hooks.run_with_hooks(self, ids, fwd_hooks)

    def hooks(
        self, fwd_hooks: Iterable[tuple[Any, hooks.HookFn]] = ()
    ) -> contextlib.AbstractContextManager[GPT]:
        """``with model.hooks(fwd_hooks):`` the hooks attached for the body
        (`glassllm.models.hooks.hooks`)."""
        return hooks.hooks(self, fwd_hooks)

    # ---------------------------------------------------------------- training

    def configure_optimizer(
        self, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.95)
    ) -> AdamW:
        """AdamW with weight decay on the matrices (ndim >= 2: Linear weights, embeddings) and none
        on biases and LayerNorm parameters. Params carry their names, so optimizer state maps onto
        checkpoint tensor names."""
        decay = [(n, p) for n, p in self.named_parameters() if p.ndim >= 2]
        no_decay = [(n, p) for n, p in self.named_parameters() if p.ndim < 2]
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        return AdamW(groups, lr=lr, betas=betas, weight_decay=weight_decay)

    def num_parameters(self, non_embedding: bool = False) -> int:
        """Number of parameter values (the tied head counted once). non_embedding=True leaves out
        the position embedding, as nanoGPT reports (wte stays: it is also the output layer)."""
        total = sum(p.size for p in self.parameters())
        if non_embedding and self.wpe is not None:
            total -= self.wpe.weight.size
        return total

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> GPT:
        """Removed: a model does not read file formats; each format's loader builds the model
        (`glassllm.hf.load_model`), so models never import a loader."""
        raise AttributeError(
            "GPT.from_pretrained was removed: the model does not read files; use "
            "glassllm.hf.load_model(path) (glassllm.hf.load_pretrained for its tokenizer too)"
        )

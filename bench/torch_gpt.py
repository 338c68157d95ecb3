"""The PyTorch reference GPT the benchmarks race against: nanoGPT's model.py at this size.

Same architecture as ``glassllm.models.GPT`` (token + learned position embeddings, pre-LayerNorm
blocks of fused-qkv causal self-attention and a 4x MLP with tanh-GELU, final LayerNorm, output head
tied to the token embedding, no biases, no dropout), written the way nanoGPT writes it, so the
PyTorch side is what a nanoGPT user actually runs on a CPU: ``F.scaled_dot_product_attention`` with
``is_causal=True``, AdamW without ``fused`` (nanoGPT enables it only on CUDA), ``clip_grad_norm_``.

One deliberate difference from nanoGPT: GELU is the tanh approximation (nanoGPT's ``nn.GELU()`` is
exact erf), because glassllm's GPT uses tanh and the benchmarks check that both models compute the
same loss from the same weights (``copy_from_glassllm``).

Parameter names follow nanoGPT (``transformer.h.0.attn.c_attn.weight``); ``glassllm_names`` maps
them onto glassllm's flat names. glassllm stores Linear weights (in, out), PyTorch (out, in): copies
transpose them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F


@dataclass
class TorchGPTConfig:
    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    gelu: str = "tanh"  # nanoGPT: "none" (exact erf)


class LayerNorm(nn.Module):
    """LayerNorm without bias (nanoGPT: PyTorch's LayerNorm takes no bias=False before 2.1)."""

    def __init__(self, ndim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, None, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: TorchGPTConfig) -> None:
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.n_head = config.n_head
        self.n_embd = config.n_embd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: TorchGPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.gelu = nn.GELU(approximate=config.gelu)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: TorchGPTConfig) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TorchGPT(nn.Module):
    def __init__(self, config: TorchGPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=LayerNorm(config.n_embd),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        _, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(
                logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1
            )
            return logits, loss
        # nanoGPT inference: the head on the last position only.
        return self.lm_head(x[:, [-1], :]), None

    def configure_optimizer(
        self, lr: float, weight_decay: float, betas: tuple[float, float]
    ) -> torch.optim.AdamW:
        """nanoGPT's configure_optimizers on a CPU: decay on >= 2-D tensors, not fused."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=lr, betas=betas)

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """nanoGPT's generate: no key/value cache, the whole (cropped) context every token."""
        for _ in range(max_new_tokens):
            idx_cond = (
                idx if idx.size(1) <= self.config.block_size else idx[:, -self.config.block_size :]
            )
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("Inf")
            probs = F.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1, generator=generator)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


def glassllm_names(n_layer: int) -> dict[str, str]:
    """nanoGPT parameter name -> glassllm GPT parameter name (the tied head appears once: wte)."""
    names = {
        "transformer.wte.weight": "wte.weight",
        "transformer.wpe.weight": "wpe.weight",
        "transformer.ln_f.weight": "ln_f.weight",
    }
    for i in range(n_layer):
        t, g = f"transformer.h.{i}.", f"blocks.{i}."
        names |= {
            t + "ln_1.weight": g + "ln_1.weight",
            t + "attn.c_attn.weight": g + "attn.qkv.weight",
            t + "attn.c_proj.weight": g + "attn.proj.weight",
            t + "ln_2.weight": g + "ln_2.weight",
            t + "mlp.c_fc.weight": g + "mlp.fc.weight",
            t + "mlp.c_proj.weight": g + "mlp.proj.weight",
        }
    return names


# Weights that are Linear layers on both sides: (in, out) in glassllm, (out, in) in PyTorch.
_LINEAR_SUFFIXES = ("c_attn.weight", "c_proj.weight", "c_fc.weight")


def copy_from_glassllm(model: TorchGPT, glassllm_state: dict[str, np.ndarray]) -> None:
    """Load glassllm GPT weights (``{name: ndarray}``, e.g. ``state_dict()``) into ``model``."""
    ours = dict(model.named_parameters())  # the tied lm_head.weight is listed once, as wte
    names = glassllm_names(model.config.n_layer)
    missing = sorted(set(names.values()) - set(glassllm_state))
    if missing:
        raise KeyError(f"glassllm state lacks {missing}")
    with torch.no_grad():
        for torch_name, glass_name in names.items():
            array = np.asarray(glassllm_state[glass_name])
            if torch_name.endswith(_LINEAR_SUFFIXES):
                array = array.T
            target = ours[torch_name]
            if tuple(array.shape) != tuple(target.shape):
                raise ValueError(
                    f"{glass_name} {array.shape} does not fit {torch_name} {tuple(target.shape)}"
                )
            target.copy_(torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)))

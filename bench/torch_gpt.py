"""The PyTorch reference GPT that the tests and the benchmarks hold glassllm to: nanoGPT's model.py,
the architecture of ``glassllm.models.GPT``, written the way nanoGPT writes it (AdamW not fused,
as nanoGPT on a CPU; generation without a key/value cache), built from a glassllm ``GPTConfig``
(its vocab_size, block_size, n_layer, n_head, n_embd, bias) and two choices:
``attention`` "sdpa" (``F.scaled_dot_product_attention``) or "manual" (written out); ``gelu``
"tanh" (glassllm's, so both compute the same loss from the same weights) or "none" (nanoGPT's
exact erf). Names follow nanoGPT (``torch_name``); Linear weights are (in, out) in glassllm
and (out, in) here (:func:`to_torch_layout`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

from glassllm.hf import config_to_hf, name_to_hf, state_dict_to_hf

Output = tuple[torch.Tensor, torch.Tensor | None]  # (logits, loss: None without targets)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: Any, attention: str = "sdpa") -> None:
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head, self.n_embd, self.attention = config.n_head, config.n_embd, attention
        causal = torch.tril(torch.ones(config.block_size, config.block_size, dtype=torch.bool))
        self.register_buffer("causal", causal.view(1, 1, config.block_size, config.block_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(~self.causal[:, :, :T, :T], float("-inf"))
            y = F.softmax(att, dim=-1) @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: Any, gelu: str = "tanh") -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate=gelu)  # "none": exact erf, nanoGPT's nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: Any, gelu: str = "tanh", attention: str = "sdpa") -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, attention)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config, gelu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TorchGPT(nn.Module):
    def __init__(self, config: Any, gelu: str = "tanh", attention: str = "sdpa") -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                h=nn.ModuleList([Block(config, gelu, attention) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT
        for module in self.modules():  # nanoGPT's _init_weights, leaves in apply()'s order
            if isinstance(module, (nn.Linear, nn.Embedding)):
                torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> Output:
        _, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            return logits, F.cross_entropy(logits.flatten(0, 1), targets.view(-1), ignore_index=-1)
        return self.lm_head(x[:, [-1], :]), None  # inference: the head on the last position only

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
        self, idx: torch.Tensor, max_new_tokens: int, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """nanoGPT's generate at temperature 1 without top-k: no key/value cache, the whole
        (cropped) context through the model for every token."""
        for _ in range(max_new_tokens):
            logits, _ = self(idx[:, -self.config.block_size :])
            probs = F.softmax(logits[:, -1, :], dim=-1)
            idx = torch.cat((idx, torch.multinomial(probs, 1, generator=generator)), dim=1)
        return idx


# glassllm GPT parameter name -> nanoGPT's, which are Hugging Face GPT-2's (the tied head once).
torch_name = name_to_hf


def to_torch_layout(name: str, array: np.ndarray) -> np.ndarray:
    """A glassllm parameter (or its gradient) in PyTorch's layout, given the nanoGPT name: the
    weights of Linear layers on both sides are (in, out) in glassllm, (out, in) in PyTorch."""
    return array.T if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")) else array


class TorchLlama(nn.Module):
    """The Llama-style twin: transformers' ``LlamaModel`` and head of a glassllm Llama-style
    ``GPTConfig`` (``glassllm.models.llama_config``), called as :class:`TorchGPT` is; its fused
    attention ("sdpa") or the written-out one ("manual": transformers' "eager")."""

    def __init__(self, config: Any, attention: str = "sdpa", **_: Any) -> None:
        super().__init__()
        import transformers

        hf_config = transformers.LlamaConfig(**config_to_hf(config))
        hf_config._attn_implementation = "eager" if attention == "manual" else "sdpa"
        llama = transformers.LlamaForCausalLM(hf_config)
        self.model, self.lm_head = llama.model, llama.lm_head  # the names of its files

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> Output:
        logits = self.lm_head(self.model(input_ids=idx, use_cache=False).last_hidden_state)
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.view(-1))

    configure_optimizer = TorchGPT.configure_optimizer


def torch_state(glassllm_model: Any, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """glassllm tensors of ``glassllm_model`` (its weights or their gradients, by glassllm name)
    under its twin's names, in its layout (the tied head once, as the embedding)."""
    if glassllm_model.config.positions == "rotary":
        return state_dict_to_hf(arrays, glassllm_model.config)
    return {torch_name(n): to_torch_layout(torch_name(n), a) for n, a in arrays.items()}


def twin(glassllm_model: Any, **choices: Any) -> TorchGPT | TorchLlama:
    """A TorchGPT (a TorchLlama for a Llama-style model) with the glassllm model's configuration
    and weights (dtype: float32, or float64 when the glassllm GPT is float64). ``choices``:
    ``attention``, ``gelu``."""
    config = glassllm_model.config
    model = (TorchLlama if config.positions == "rotary" else TorchGPT)(config, **choices)
    weights = {name: p.data for name, p in glassllm_model.named_parameters()}
    if next(iter(weights.values())).dtype == np.float64:
        model = model.double()
    state = torch_state(glassllm_model, weights)
    tensors = {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in state.items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False)  # a mis-shaped one raises
    missing = set(missing) & set(dict(model.named_parameters()))  # the tied head is named once
    if missing or unexpected:
        raise KeyError(f"parameters differ: {sorted(missing | set(unexpected))}")
    return model

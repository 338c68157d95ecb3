"""Small models for the experiment tests: GPT-2- and Llama-shaped, float32 or float64, with
weights large enough (std 0.3, norm gains and biases random) that every part matters."""

from __future__ import annotations

import numpy as np

from glassllm.models import GPT, GPTConfig, llama_config

VOCAB = 20


def random_model(kind: str = "gpt2", dtype=np.float64, seed: int = 0, **overrides) -> GPT:
    if kind == "gpt2":
        config = GPTConfig(
            vocab_size=VOCAB,
            block_size=16,
            n_layer=2,
            n_head=2,
            n_embd=16,
            bias=True,
            **overrides,
        )
    else:
        config = llama_config(
            vocab_size=VOCAB, block_size=16, n_layer=2, n_head=4, n_embd=16, **overrides
        )
    model = GPT(config, rng=np.random.default_rng(seed), dtype=dtype)
    rng = np.random.default_rng(seed + 1)
    for param in model.parameters():
        param.data[...] = (rng.standard_normal(param.shape) * 0.3).astype(dtype)
    return model


CLEAN = [1, 2, 3, 4, 5, 6]
CORRUPTED = [1, 2, 9, 4, 5, 6]

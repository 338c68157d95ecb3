"""Sample from a trained GPT checkpoint, and look at what the model predicts next.

    python examples/sample.py out-tiny/ckpt.safetensors --prompt "The " --max-new-tokens 200

The checkpoint holds the model's shape and the tokenizer's vocabulary next to the weights, so
nothing else is needed. ``glassllm sample`` does the same with more options (and ``--explain``).
"""

from __future__ import annotations

import argparse

import numpy as np

import glassllm.functional as F
from glassllm import no_grad
from glassllm.app.run_state import load_trained_model

parser = argparse.ArgumentParser(description="Sample from a glassllm GPT checkpoint.")
parser.add_argument("checkpoint", nargs="?", default="out-tiny/ckpt.safetensors")
parser.add_argument("--prompt", default="\n")
parser.add_argument("--max-new-tokens", type=int, default=300)
parser.add_argument("--temperature", type=float, default=0.8)
parser.add_argument("--top-k", type=int, default=None)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

# Model (in eval mode), tokenizer and metadata, from the file alone: the file is verified (its
# digest) and every metadata value checked before anything is built from it.
try:
    model, tokenizer, metadata = load_trained_model(args.checkpoint)
except (ValueError, OSError) as error:  # missing, damaged, or not a glassllm GPT checkpoint
    parser.error(str(error))
print(f"{args.checkpoint}: step {metadata.get('iteration')}, {model.config}")

try:
    idx = np.array([tokenizer.encode(args.prompt)])  # (1, T)
except ValueError as error:  # a character the model never saw in training
    parser.error(str(error))

# What does the model expect right after the prompt? One forward pass, no graph.
with no_grad():
    logits, _ = model(idx[:, -model.config.block_size :])  # (1, T, vocab)
    probs = F.softmax(logits[:, -1, :], axis=-1).data[0]  # (vocab,) for the next position
print("next-token guesses:", ", ".join(
    f"{tokenizer.token_repr(int(i))} {p:.1%}" for i, p in
    sorted(enumerate(probs), key=lambda pair: -pair[1])[:5]
))  # fmt: skip

# Generation: the key/value cache makes each new token cost one position.
out = model.generate(
    idx, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
    rng=np.random.default_rng(args.seed),
)  # fmt: skip  # (1, T + max_new_tokens)
print(tokenizer.decode(out[0].tolist()))

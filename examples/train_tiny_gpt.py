"""Train a tiny GPT with the whole training loop in plain sight: nanoGPT's train.py on glassllm.

``glassllm train`` runs this same loop (with resume, Ctrl-C and a progress bar added, in
glassllm/app/train.py); here it is top to bottom, to read and to change.

    python examples/train_tiny_gpt.py                          # the Python docs, a few minutes
    python examples/train_tiny_gpt.py --data shakespeare --max-iters 2000
    python examples/sample.py out-tiny/ckpt.safetensors        # then sample from it

Every configuration value below can be overridden on the command line: --n-layer 2, --lr 3e-3.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import glassllm
from glassllm import no_grad
from glassllm.app.run_state import RunState
from glassllm.data import CharTokenizer, get_batch, load_text, split_train_val
from glassllm.models import GPT, GPTConfig
from glassllm.nn.utils import clip_grad_norm_
from glassllm.optim.lr_scheduler import cosine_with_warmup

# ----------------------------------------------------------------------------- configuration
# nanoGPT's shakespeare_char settings for a laptop CPU ("I only have a macbook").
defaults = dict(
    data="builtin",  # 'builtin' (the Python docs), 'shakespeare', or a text file
    out_dir="out-tiny",
    n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0,
    batch_size=12, max_iters=2000, lr=1e-3, min_lr=1e-4, warmup_iters=100, lr_decay_iters=2000,
    weight_decay=0.1, beta1=0.9, beta2=0.99, grad_clip=1.0,
    eval_interval=250, eval_iters=20, log_interval=50, seed=1337,
)  # fmt: skip
parser = argparse.ArgumentParser(description="Train a tiny GPT, nanoGPT style.")
for key, value in defaults.items():
    parser.add_argument("--" + key.replace("_", "-"), type=type(value), default=value)
cfg = parser.parse_args()
# A run shorter than the default decays over its own length unless told otherwise.
cfg.lr_decay_iters = min(cfg.lr_decay_iters, max(cfg.max_iters, cfg.warmup_iters))

# ------------------------------------------------------------------------------------- data
text = load_text(cfg.data)
tokenizer = CharTokenizer.from_text(text)  # vocabulary: the sorted set of characters
ids = tokenizer.encode_array(text)  # (N,) int64
train_data, val_data = split_train_val(ids)  # first 90% / last 10%
print(f"{len(text):,} characters, vocabulary of {tokenizer.vocab_size}")

# Separate generators: training batches, and the model (initial weights, then dropout masks).
batch_rng = np.random.default_rng([cfg.seed, 1])
model_rng = np.random.default_rng([cfg.seed, 0])

# ------------------------------------------------------------------------- model, optimizer
model_config = GPTConfig(
    vocab_size=tokenizer.vocab_size, block_size=cfg.block_size, n_layer=cfg.n_layer,
    n_head=cfg.n_head, n_embd=cfg.n_embd, dropout=cfg.dropout, bias=False,
)  # fmt: skip
model = GPT(model_config, rng=model_rng)
print(f"{model.num_parameters() / 1e6:.2f}M parameters")
# AdamW, with weight decay on the matrices only (not on biases and LayerNorm gains).
optimizer = model.configure_optimizer(cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2))


def estimate_loss() -> dict[str, float]:
    """Mean loss over eval_iters batches of each split: eval mode (no dropout), no graph."""
    model.eval()
    losses = {}
    with no_grad():
        for split, data in (("train", train_data), ("val", val_data)):
            rng = np.random.default_rng([cfg.seed, 2])  # the same batches at every evaluation
            total = 0.0
            for _ in range(cfg.eval_iters):
                x, y = get_batch(data, cfg.block_size, cfg.batch_size, rng)  # (B, T), (B, T)
                _, loss = model(x, y)
                total += float(loss.data)
            losses[split] = total / cfg.eval_iters
    model.train()
    return losses


def save_checkpoint(iteration: int, best_val_loss: float) -> None:
    """Weights, AdamW moments, and what `glassllm sample` needs to rebuild the model: its shape
    and the tokenizer's vocabulary, in the metadata schema of `glassllm train` (RunState)."""
    state = RunState(
        model_config=model_config,
        tokenizer=tokenizer,  # the vocabulary travels with the weights
        iteration=iteration,
        best_val_loss=best_val_loss,
        last_eval_iteration=iteration,
        elapsed_s=time.perf_counter() - started,
    )
    glassllm.save(out_dir / "ckpt.safetensors", model, optimizer, state.to_metadata())


out_dir = Path(cfg.out_dir)
out_dir.mkdir(parents=True, exist_ok=True)

# ---------------------------------------------------------------------------- training loop
started = time.perf_counter()
best_val_loss = float("inf")
for iteration in range(cfg.max_iters + 1):
    # Learning rate: linear warmup, then cosine decay down to min_lr.
    lr = cosine_with_warmup(iteration, cfg.lr, cfg.min_lr, cfg.warmup_iters, cfg.lr_decay_iters)
    for group in optimizer.param_groups:
        group["lr"] = lr

    if iteration % cfg.eval_interval == 0 or iteration == cfg.max_iters:
        losses = estimate_loss()
        print(f"step {iteration}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        best_val_loss = min(best_val_loss, losses["val"])
        save_checkpoint(iteration, best_val_loss)
    if iteration == cfg.max_iters:
        break

    step_started = time.perf_counter()
    x, y = get_batch(train_data, cfg.block_size, cfg.batch_size, batch_rng)  # (B, T), (B, T)
    logits, loss = model(x, y)  # (B, T, vocab), mean cross-entropy over B*T predictions
    loss.backward()  # reverse-mode autograd fills p.grad for every parameter
    if cfg.grad_clip > 0.0:  # 0 turns clipping off, as in nanoGPT
        clip_grad_norm_(model.parameters(), cfg.grad_clip)  # rescale if the global norm > grad_clip
    optimizer.step()  # AdamW update, in place
    optimizer.zero_grad()  # grads back to None for the next step
    if iteration % cfg.log_interval == 0:
        step_ms = 1000 * (time.perf_counter() - step_started)
        print(f"iter {iteration}: loss {float(loss.data):.4f}, lr {lr:.2e}, {step_ms:.0f} ms")

print(f"trained {cfg.max_iters} steps in {time.perf_counter() - started:.0f} s")

# ------------------------------------------------------------------------------- a sample
prompt = np.array([tokenizer.encode("\n" if "\n" in tokenizer.stoi else text[0])])  # (1, 1)
out = model.generate(prompt, max_new_tokens=300, temperature=0.8, rng=np.random.default_rng(0))
print(tokenizer.decode(out[0].tolist()))

"""A tiny trained run for the viewer's tests: checkpoint, log.jsonl and stats.jsonl in out_dir.

Trained by a short loop written here (what `glassllm train` does, with `StatsLog` called as the
training loop calls it), saved in the checkpoint format `glassllm sample` reads.
"""

import json
from pathlib import Path

import numpy as np

import glassllm
from glassllm import no_grad
from glassllm.app.run_state import CHECKPOINT_FORMAT
from glassllm.app.stats import StatsLog
from glassllm.data import CharTokenizer, get_batch
from glassllm.models import GPT, GPTConfig
from glassllm.nn.utils import clip_grad_norm_

TEXT = "".join(
    f"def f{i}(x, y):\n    return x * {i} + y  # line {i}\n\n"
    f"class Box{i}:\n    def get(self):\n        return self.value{i % 7}\n\n"
    for i in range(40)
) + "# <img src=x onerror=window.__xss=1> is text, not markup\n"


def make_run(out_dir, steps=60, eval_interval=20, stats_interval=2, seed=0):
    """Train a 2-layer GPT for ``steps`` steps; write its files into ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = CharTokenizer.from_text(TEXT)
    data = np.array(tokenizer.encode(TEXT), dtype=np.int64)
    split = int(0.9 * len(data))
    train, val = data[:split], data[split:]
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layer=2, n_head=2,
                       n_embd=32)
    model = GPT(config, rng=np.random.default_rng(seed))
    optimizer = model.configure_optimizer(lr=1e-2, weight_decay=0.1)
    stats = StatsLog(out_dir / "stats.jsonl", model.named_parameters(), stats_interval, 1.0)
    stats.start(None)
    rng = np.random.default_rng(seed + 1)
    log_lines = []
    best = None

    def evaluate(iteration):
        nonlocal best
        eval_rng = np.random.default_rng(seed + 2)
        with no_grad():
            model.eval()
            losses = {name: float(model(*get_batch(split_data, 32, 8, eval_rng))[1].data)
                      for name, split_data in (("train", train), ("val", val))}
            model.train()
        best = losses["val"] if best is None else min(best, losses["val"])
        log_lines.append(json.dumps({"iter": iteration, "train_loss": losses["train"],
                                     "val_loss": losses["val"], "lr": 1e-2}))

    evaluate(0)
    for iteration in range(1, steps + 1):
        x, y = get_batch(train, 32, 8, rng)
        _, loss = model(x, y)
        loss.backward()
        norm = clip_grad_norm_(model.parameters(), 1.0)
        stats.before_update(iteration - 1, norm, (iteration - 1) % eval_interval == 0)
        optimizer.step()
        stats.after_update(float(loss.data), 1e-2)
        optimizer.zero_grad()
        if iteration % eval_interval == 0:
            evaluate(iteration)
    metadata = {
        "format": CHECKPOINT_FORMAT,
        "iteration": steps,
        "best_val_loss": best,
        "model_config": config.to_dict(),
        "tokenizer": tokenizer.to_dict(),
    }
    model.eval()
    glassllm.save(out_dir / "ckpt.safetensors", model, optimizer, metadata)
    (out_dir / "log.jsonl").write_text("\n".join(log_lines) + "\n")
    return out_dir

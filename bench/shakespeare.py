"""Train nanoGPT's shakespeare_char "I only have a macbook" model and report where the loss lands.

    python bench/shakespeare.py                                # glassllm, seed 1337
    python bench/shakespeare.py --sides glassllm,nanogpt --seed 1
    python bench/shakespeare.py --sides glassllm,glassllm-llama    # GPT-2 vs Llama-style recipe
    python bench/shakespeare.py --data path/to/input.txt --max-iters 2000

Sides: ``glassllm``, ``glassllm train``'s defaults in the shipped Trainer; ``glassllm-llama``, the
same with ``--arch llama`` (RoPE, RMSNorm, SwiGLU, GQA at GPT-2's parameter count); ``nanogpt``:
nanoGPT's own RNG, initialisation, exact GELU and batches (the ``torch`` control on the Trainer's
own weights and batches was retired in issue 19: tests/test_bench.py checks that step for step).
Reported: train and val loss over the *whole* splits, the eval_iters-batch estimates, wall time,
ms/step, parameters.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common as C
import numpy as np

from glassllm.data import bits_per_character, get_batch, sequential_batches

SIDES = ("glassllm", "glassllm-llama", "nanogpt")
DEFAULT_SIDES = ("glassllm",)

Loss = Callable[[np.ndarray, np.ndarray], float]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(rounds=1)
    parser.add_argument("--data", default="shakespeare", help="'shakespeare' or a text file")
    parser.add_argument("--max-iters", type=int, default=2000)
    parser.add_argument("--eval-interval", type=int, default=250)
    parser.add_argument("--eval-iters", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--size", default="tiny", choices=list(C.SIZES), help="tiny: the recipe's")
    parser.add_argument("--target", type=float, default=1.90, help="full-val loss to reach")
    parser.add_argument("--tokenizer", choices=["char", "bpe"], default="char")
    parser.add_argument("--vocab-size", type=int, default=None, help="bpe's (default 512)")


def estimate(loss: Loss, trainer: Any) -> dict[str, float]:
    """``Trainer.evaluate`` for any model: the mean loss of the same eval_iters batches."""
    cfg, out = trainer.config, {}
    shape = (cfg.block_size, cfg.batch_size)
    for index, split in enumerate(("train", "val")):
        data, rng = getattr(trainer.corpus, split), np.random.default_rng([cfg.seed, 2, index])
        losses = [loss(*get_batch(data, *shape, rng)) for _ in range(cfg.eval_iters)]
        out[split] = sum(losses) / cfg.eval_iters
    return out


def split_loss(loss: Loss, data: np.ndarray, block_size: int) -> float:
    """Mean cross-entropy over every non-overlapping block_size window of ``data``."""
    total, count = 0.0, 0
    for x, y in sequential_batches(data, block_size, 64):
        total, count = total + loss(x, y) * y.size, count + y.size
    return total / count


def train_torch(args: argparse.Namespace, trainer: Any) -> tuple[Loss, list, list[float]]:
    """nanoGPT's loop, model and batches in PyTorch on the trainer's recipe: (loss, evaluations,
    ends of steps)."""
    import torch
    from torch_gpt import TorchGPT

    cfg = trainer.config
    torch.manual_seed(args.seed)
    model = TorchGPT(trainer.model.config, gelu="none")
    data, T = trainer.corpus.train, cfg.block_size

    def next_batch() -> tuple[np.ndarray, np.ndarray]:  # nanoGPT's get_batch
        starts = torch.randint(len(data) - T, (cfg.batch_size,)).numpy()
        offsets = starts[:, None] + np.arange(T)
        return data[offsets].astype(np.int64), data[offsets + 1].astype(np.int64)

    step = C.torch_step(trainer, model, next_batch)[1]

    def loss(x: np.ndarray, y: np.ndarray) -> float:
        with torch.no_grad():
            return float(model(torch.from_numpy(x.copy()), torch.from_numpy(y.copy()))[1])

    evaluations, ends = [], []
    for it in range(cfg.max_iters + 1):
        if it % cfg.eval_interval == 0 or it == cfg.max_iters:
            evaluations.append({"iter": it, **estimate(loss, trainer)})
        if it < cfg.max_iters:
            step()
            ends.append(time.perf_counter())
    return loss, evaluations, ends


FRAMEWORK = {"glassllm": "glassllm", "glassllm-llama": "glassllm, --arch llama"}
FRAMEWORK["nanogpt"] = "nanoGPT in PyTorch (own RNG)"


def worker(args: argparse.Namespace) -> dict[str, Any]:
    from glassllm import no_grad

    C.prepare_worker(args)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = C.glassllm_trainer(
            Path(tmp), args.size, args.seed, data=args.data,
            max_iters=args.max_iters, eval_interval=args.eval_interval,
            eval_iters=args.eval_iters, tokenizer=args.tokenizer, vocab_size=args.vocab_size,
            arch="llama" if args.worker == "glassllm-llama" else "gpt2",
        )  # fmt: skip
        start = time.perf_counter()
        if args.worker.startswith("glassllm"):
            ends: list[float] = []
            fit = trainer.fit(progress=False, on_step=lambda *_: ends.append(time.perf_counter()))
            evaluations = [
                {"iter": e["iter"], "train": e["train_loss"], "val": e["val_loss"]}
                for e in fit.evaluations
            ]

            def loss(x: np.ndarray, y: np.ndarray) -> float:
                with no_grad():
                    return float(trainer.model(x, y)[1].data)
        else:
            loss, evaluations, ends = train_torch(args, trainer)
        wall = time.perf_counter() - start
        val = split_loss(loss, trainer.corpus.val, trainer.config.block_size)
        train = split_loss(loss, trainer.corpus.train, trainer.config.block_size)
    per_char = trainer.characters_per_token  # bits per character: comparable across tokenizers
    return {
        "framework": FRAMEWORK[args.worker],
        "train loss (whole split)": train,
        "val loss (whole split)": val,
        "val bits/char": bits_per_character(val, per_char["val"]),
        "train bits/char": bits_per_character(train, per_char["train"]),
        "tokenizer": f"{args.tokenizer}-{trainer.tokenizer.vocab_size}",
        "val, eval_iters-batch estimate": evaluations[-1]["val"],
        "reached the target": val <= args.target,
        "run s": wall,
        "ms/step": C.median(np.diff([start, *ends])) * 1e3,
        "peak RSS MiB": C.peak_rss_bytes() / 2**20,
        "allocator tuned": args.worker.startswith("glassllm"),
        "parameters": trainer.model.num_parameters(),
        "config": trainer.model.config.to_dict(),
        "evals": evaluations,
    }


LOSSES = ["train loss (whole split)", "val loss (whole split)", "val, eval_iters-batch estimate"]
FORMATS = dict.fromkeys(LOSSES, ".4f") | dict.fromkeys(["val bits/char", "train bits/char"], ".3f")


def parent(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    if args.data not in ("builtin", "shakespeare") and not Path(args.data).is_file():
        raise SystemExit(f"--data {args.data}: no such file (or: shakespeare)")
    runs, config = {}, dict(data=args.data, max_iters=args.max_iters, target_val_loss=args.target)
    for side in args.sides:
        figures = C.run_side(args, side, args.threads[0])
        evals = ", ".join(f"{e['iter']}: {e['val']:.3f}" for e in figures["evals"])
        name, groups = f"{side} seed {args.seed}", {str(args.seed): {side: figures}}
        note = f"{name}, val loss estimated during training (iteration: loss): {evals}."
        runs[name] = dict(config=config, group="seed", formats=FORMATS, groups=groups, notes=[note])
    return runs


C.run_as_script(__name__)

"""Tokens per second of generation: glassllm with its key/value cache, without it, and PyTorch the
nanoGPT way (no cache: the whole cropped context through the model for every token).

    python bench/sample.py                        # tiny size at block_size 64 and 256, 3 rounds
    python bench/sample.py --size mid --block-sizes 256 --rounds 5

Random weights, one sequence (batch 1), temperature 1, no top-k, from a one-token prompt. Two
regimes per block size, timed token by token:
- fill: the first block_size - 1 tokens, while the context grows to block_size (the cache's home
  ground: one new position per token instead of the whole context);
- slide: the next block_size tokens, with the context cropped to the last block_size. With learned
  absolute positions a sliding window moves every token's position, so the cache is refilled from
  the whole window each token.
Each side runs in its own process, alternating, with the same thread count.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import common as C
import numpy as np

SIDES = ("glassllm-cache", "glassllm-nocache", "torch")
DEFAULT_SIDES = SIDES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", default="tiny", choices=list(C.SIZES))
    parser.add_argument("--block-sizes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--seed", type=int, default=0)


def token_times(args: argparse.Namespace, block_size: int) -> list[float]:
    """Seconds of each of 2 * block_size - 1 tokens, after an untimed warm-up of 8 tokens."""
    config = C.model_config(args.size, block_size=block_size)
    if args.worker == "torch":
        import torch
        from torch_gpt import TorchGPT, TorchGPTConfig

        torch.manual_seed(args.seed)
        model = TorchGPT(TorchGPTConfig(**config)).eval()
        generator = torch.Generator().manual_seed(args.seed)
        idx = torch.zeros((1, 1), dtype=torch.long)
        model.generate(idx, 8, generator=generator)
        tokens = [time.perf_counter()]
        for _ in range(2 * block_size - 1):  # nanoGPT's generate, one token per call
            idx = model.generate(idx, 1, generator=generator)
            tokens.append(time.perf_counter())
    else:
        from glassllm.models import GPT, GPTConfig

        model = GPT(GPTConfig(**config), rng=np.random.default_rng(args.seed))
        rng, use_cache = np.random.default_rng(args.seed), args.worker == "glassllm-cache"
        prompt = np.zeros((1, 1), dtype=np.int64)
        for _ in model.generate_stream(prompt, 8, rng=rng, use_cache=use_cache):
            pass
        stream = model.generate_stream(prompt, 2 * block_size - 1, rng=rng, use_cache=use_cache)
        tokens = [time.perf_counter()] + [time.perf_counter() for _ in stream]
    return [b - a for a, b in zip(tokens, tokens[1:], strict=False)]


def worker(args: argparse.Namespace) -> dict[str, Any]:
    if args.worker == "torch":
        C.set_torch_threads(args.threads)
    else:
        from glassllm.app.allocator import tune_allocator

        tune_allocator()
    out = {}
    for block_size in args.block_sizes:
        times = token_times(args, block_size)
        fill, slide = times[: block_size - 1], times[block_size - 1 :]
        out[str(block_size)] = {"fill": len(fill) / sum(fill), "slide": len(slide) / sum(slide)}
    return {"tokens_per_s": out}


def parent(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    results = C.alternate(args, args.threads[0])
    table: dict[str, dict[str, dict[str, float]]] = {}
    for side, runs in results.items():
        for bs in map(str, args.block_sizes):
            table.setdefault(bs, {})[side] = {
                regime: C.median([r["tokens_per_s"][bs][regime] for r in runs])
                for regime in ("fill", "slide")
            }
    payload = {
        "config": C.model_config(args.size),
        "threads": args.threads[0],
        "rounds": args.rounds,
        "tokens_per_s": table,
    }
    return {args.size: payload}


def render(runs: dict[str, Any]) -> str:
    """RESULTS.md's block: tokens per second per block size, regime and side."""
    run = next(iter(runs.values()))
    headers = ["block_size", "regime", "glassllm with cache tok/s", "glassllm no cache tok/s"]
    headers += ["PyTorch nanoGPT (no cache) tok/s", "cache / PyTorch"]
    rows = []
    for bs, sides in run["tokens_per_s"].items():
        for regime in ("fill", "slide"):
            row = [bs, regime, *(sides.get(s, {}).get(regime, "-") for s in SIDES)]
            both = "glassllm-cache" in sides and "torch" in sides
            row.append(sides["glassllm-cache"][regime] / sides["torch"][regime] if both else "-")
            rows.append(row)
    return "\n".join(
        [
            C.machine_line(run["machine"]),
            "",
            f"{C.fmt_dict(run['config'])}; batch 1, {run['threads']} threads, median of "
            f"{run['rounds']} alternating rounds. *fill*: the first block_size - 1 tokens from a "
            "one-token prompt; *slide*: the next block_size tokens with the context cropped to "
            "block_size (learned positions shift, so the cache is refilled each token).",
            "",
            C.table(headers, rows),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    return C.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())

"""Tokens per second of generation: glassllm with its key/value cache, without it, and PyTorch the
nanoGPT way (no cache: the whole cropped context through the model for every token).

    python bench/sample.py                        # block_size 64 and 256, 3 rounds
    python bench/sample.py --block-sizes 256 --rounds 5

Model: the nanoGPT CPU shape (n_layer=4, n_head=4, n_embd=128, vocab 65), random weights, one
sequence (batch 1), temperature 1, no top-k, starting from a one-token prompt. Two regimes per
block size, timed token by token:
- fill: the first block_size - 1 tokens, while the context grows to block_size (the cache's home
  ground: one new position per token instead of the whole context);
- slide: the next block_size tokens, with the context cropped to the last block_size. With learned
  absolute positions a sliding window moves every token's position, so glassllm's cache is
  refilled from the whole window each token: this regime costs what uncached generation costs.
Each side runs in its own process, alternating, with the same thread count.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import _harness as H

SCRIPT = Path(__file__).resolve()
SIDES = ("glassllm-cache", "glassllm-nocache", "torch")


def token_times_glassllm(
    block_size: int, use_cache: bool, new_tokens: int, seed: int
) -> list[float]:
    import _steps
    import numpy as np

    model = _steps.glassllm_model({**H.NANOGPT_CPU, "block_size": block_size}, seed)
    prompt = np.zeros((1, 1), dtype=np.int64)
    rng = np.random.default_rng(seed)
    for _ in model.generate_stream(prompt, 8, rng=rng, use_cache=use_cache):  # warm-up
        pass
    stamps = [time.perf_counter()]
    for _ in model.generate_stream(prompt, new_tokens, rng=rng, use_cache=use_cache):
        stamps.append(time.perf_counter())
    return [b - a for a, b in zip(stamps, stamps[1:], strict=False)]


def token_times_torch(block_size: int, new_tokens: int, seed: int) -> list[float]:
    import torch
    from torch.nn import functional as F
    from torch_gpt import TorchGPT, TorchGPTConfig

    torch.manual_seed(seed)
    model = TorchGPT(TorchGPTConfig(**{**H.NANOGPT_CPU, "block_size": block_size})).eval()
    generator = torch.Generator().manual_seed(seed)
    model.generate(torch.zeros((1, 1), dtype=torch.long), 8, generator=generator)  # warm-up
    idx = torch.zeros((1, 1), dtype=torch.long)
    times = []
    with torch.no_grad():
        for _ in range(new_tokens):  # nanoGPT's generate, one token per iteration, timed
            start = time.perf_counter()
            idx_cond = idx if idx.size(1) <= block_size else idx[:, -block_size:]
            logits, _ = model(idx_cond)
            probs = F.softmax(logits[:, -1, :], dim=-1)
            idx = torch.cat((idx, torch.multinomial(probs, 1, generator=generator)), dim=1)
            times.append(time.perf_counter() - start)
    return times


def worker(args: argparse.Namespace) -> None:
    if args.worker == "torch":
        H.set_torch_threads(args.threads)
    else:
        import _steps

        _steps.tune_allocator()
    out = {}
    for block_size in args.block_sizes:
        new_tokens = 2 * block_size - 1
        if args.worker == "torch":
            times = token_times_torch(block_size, new_tokens, args.seed)
        else:
            times = token_times_glassllm(
                block_size, args.worker == "glassllm-cache", new_tokens, args.seed
            )
        fill, slide = times[: block_size - 1], times[block_size - 1 :]
        out[str(block_size)] = {
            "fill_tokens_per_s": len(fill) / sum(fill),
            "slide_tokens_per_s": len(slide) / sum(slide),
        }
    first = out[str(args.block_sizes[0])]
    H.emit({"by_block_size": out, "tokens_per_s": first["fill_tokens_per_s"]})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--block-sizes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument(
        "--write-results", action="store_true", help="also refresh bench/RESULTS.md"
    )
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0

    common = [
        "--threads",
        str(args.threads),
        "--seed",
        str(args.seed),
        "--block-sizes",
        *map(str, args.block_sizes),
    ]
    runners = {
        side: (lambda side=side: H.run_worker(SCRIPT, ["--worker", side, *common], args.threads))
        for side in args.sides.split(",")
    }
    results = H.alternate(runners, args.rounds)
    table: dict[str, dict[str, dict[str, float]]] = {}
    for side, runs in results.items():
        for bs in map(str, args.block_sizes):
            table.setdefault(bs, {})[side] = {
                regime: H.median([r["by_block_size"][bs][f"{regime}_tokens_per_s"] for r in runs])
                for regime in ("fill", "slide")
            }
    rows = []
    for bs, sides in table.items():
        for regime in ("fill", "slide"):
            row = [bs, regime, *(sides.get(s, {}).get(regime, "-") for s in SIDES)]
            both = "glassllm-cache" in sides and "torch" in sides
            row.append(sides["glassllm-cache"][regime] / sides["torch"][regime] if both else "-")
            rows.append(row)
    H.print_table(
        [
            "block_size",
            "regime",
            "glassllm cache tok/s",
            "glassllm no cache tok/s",
            "torch (nanoGPT) tok/s",
            "cache / torch",
        ],
        rows,
    )
    path = H.write_json(
        "sample",
        {
            "config": H.NANOGPT_CPU,
            "threads": args.threads,
            "rounds": args.rounds,
            "tokens_per_s": table,
            "per_round": results,
        },
    )
    print(f"wrote {path}")
    if args.write_results:
        import report

        report.main([])
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Generation speed and memory: glassllm's hf.load_model vs transformers, same GPT-2 files.

Both engines load one Hugging Face directory with random weights made here (no download; GPT-2
small's shape by default: 12 layers, 12 heads, width 768, vocabulary 50257, context 1024), and
generate greedily with their key/value caches: glassllm ``generate(top_k=1)``, transformers
``generate(do_sample=False, use_cache=True)``. Each measurement runs in its own process with its
thread count fixed before NumPy or torch is imported; engines alternate, and the order flips every
round, so a change in the machine's load hits both. Reported per engine and thread count: median
tokens per second over the timed runs of every round, resident memory after loading, peak
resident memory, and whether both engines produced the same ids.

    python bench/hf_generate.py                        # GPT-2 small, 1 and 2 threads
    python bench/hf_generate.py --shape tiny --rounds 1 --repeats 1 --new-tokens 8   # smoke test

Needs torch and transformers for the comparison (``--engines glassllm`` runs without them).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common as C
import numpy as np

SIDES = ("glassllm", "transformers")
DEFAULT_SIDES = SIDES
SHAPES = {
    "gpt2": dict(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768),
    "tiny": dict(vocab_size=512, block_size=128, n_layer=2, n_head=2, n_embd=64),
}
MB = 2**20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(threads=[1, 2], rounds=2)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="gpt2")
    parser.add_argument("--engines", nargs="+", help="the sides, space-separated (as --sides)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per process")
    parser.add_argument("--json", type=Path, dest="out", help="as --out")
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One engine, one thread count: load, warm up, time ``repeats`` generations."""
    prompt = np.random.default_rng(0).integers(0, 512, size=(1, args.prompt_tokens))
    before, start = C.rss_bytes(), time.perf_counter()
    if args.worker == "glassllm":
        from glassllm.hf import load_model

        model = load_model(args.model_dir)

        def generate() -> list[int]:
            return model.generate(prompt, args.new_tokens, top_k=1)[0].tolist()
    else:
        import torch
        import transformers

        C.set_torch_threads(args.threads)
        model = transformers.GPT2LMHeadModel.from_pretrained(args.model_dir).eval()
        ids = torch.from_numpy(prompt)

        def generate() -> list[int]:
            with torch.no_grad():
                out = model.generate(
                    ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                    min_new_tokens=args.new_tokens, do_sample=False, use_cache=True, pad_token_id=0,
                )  # fmt: skip
            return out[0].tolist()

    load_s, loaded = time.perf_counter() - start, C.rss_bytes()
    generate()  # warm-up
    times = C.time_calls(generate, args.repeats)
    return {
        "tok_s": [args.new_tokens / t for t in times],
        "load_s": load_s,
        "rss_before_load_mb": before / MB,
        "rss_after_load_mb": loaded / MB,
        "peak_mb": C.high_water_bytes() / MB,
        "ids": generate(),
    }


def parent(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    from glassllm.hf import save_pretrained
    from glassllm.models import GPT, GPTConfig

    args.sides = args.engines or args.sides
    by_threads: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="glassllm-hf-bench-") as scratch:
        model_dir = str(Path(scratch) / args.shape)
        model = GPT(GPTConfig(**SHAPES[args.shape], bias=True), rng=np.random.default_rng(0))
        save_pretrained(model, None, model_dir, overwrite=True)
        del model
        for threads in args.threads:
            results = C.alternate(args, threads, "--model-dir", model_dir, flip=True)
            by_threads[str(threads)] = {
                side: {
                    "tok_s": C.median([s for r in runs for s in r["tok_s"]]),
                    "rss_after_load_mb": C.median([r["rss_after_load_mb"] for r in runs]),
                    "peak_mb": max(r["peak_mb"] for r in runs),
                    "load_s": C.median([r["load_s"] for r in runs]),
                    "ids": [r["ids"] for r in runs],
                }
                for side, runs in results.items()
            }
    ids = {tuple(i) for sides in by_threads.values() for s in sides.values() for i in s["ids"]}
    payload = {"shape": SHAPES[args.shape], "prompt_tokens": args.prompt_tokens}
    payload |= {"new_tokens": args.new_tokens, "same_ids": len(ids) == 1}
    return {args.shape: {**payload, "by_threads": by_threads}}


def render(runs: dict[str, Any]) -> str:
    """Per shape: one row per thread count and engine, then whether the greedy ids agree."""
    headers = ["threads", "engine", "median tok/s", "RSS after load MB", "peak MB", "load s"]
    lines = []
    for shape, run in runs.items():
        rows = [
            [t, side, v["tok_s"], v["rss_after_load_mb"], v["peak_mb"], v["load_s"]]
            for t, sides in run["by_threads"].items()
            for side, v in sides.items()
        ]
        lines += [
            C.machine_line(run["machine"]),
            f"\n{shape}: {run['prompt_tokens']}-token prompt, {run['new_tokens']} new tokens, "
            "greedy\n",
            C.table(headers, rows),
            f"\nsame greedy ids across engines and runs: {run['same_ids']}",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return C.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())

"""Whether a second thread pays for a split: one elementwise pass cut in two, glassllm's worker
threads against PyTorch's intra-op pool, each side in its own process, alternating.

    python bench/handoff.py                      # 2 threads, 3 rounds
    python bench/handoff.py --elements 16384 262144 --rounds 5

For each size, ``exp`` over ``2 n`` float32 elements on one thread and on two: glassllm's
``threads.run_blocks`` with each worker taking ``n`` (np.exp into halves of one output), PyTorch's
``torch.exp`` at ``set_num_threads(1)`` and ``(2)``. "gain" is one thread's time over two's. The
"empty region" row is `run_blocks` on two tasks that do nothing, timed alone ("tight") and
after 1 ms of the caller's own work ("after 1 ms"): the hand-off's cost when the other core has
gone idle, which is what a split in a training step meets. The machine line names the kernel's
idle driver and its guest halt polling: on a virtual machine that does not poll, each wake of an
idle vCPU is an exit to the host (tens of microseconds), and glassllm's workers, which wait in
the kernel, pay it where PyTorch's OpenMP workers, which spin, do not (bench/RESULTS.md, LOG.md).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import common as C
import numpy as np

SIDES = DEFAULT_SIDES = ("glassllm", "torch")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--elements", type=int, nargs="+", default=[1 << 14, 1 << 16, 1 << 18, 1 << 20],
        help="elements per thread (each split is of twice as many)",
    )  # fmt: skip
    parser.add_argument("--budget", type=float, default=0.3, help="seconds of timing per figure")


def timed(fn: Callable[[], Any], budget: float, before: Callable[[], Any] | None = None) -> float:
    """Median microseconds of ``fn()`` over about ``budget`` seconds, at least 20 calls
    (``before()`` untimed ahead of each)."""
    one = C.time_calls(fn, repeats=1, warmup=1)[0]
    return C.median(C.time_calls(fn, max(20, int(budget / one)), before=before)) * 1e6


def busy(seconds: float) -> None:
    """The caller's own work between regions: a spin, so its core stays busy and the other idles."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def worker(args: argparse.Namespace) -> dict[str, Any]:
    C.prepare_worker(args)
    rng, results = np.random.default_rng(0), {}
    if args.worker == "torch":
        import torch

        for n in args.elements:
            x = torch.from_numpy(rng.standard_normal(2 * n, dtype=np.float32))
            out = torch.empty_like(x)
            figures = {}
            for key, threads in (("one", 1), ("split", args.threads)):
                torch.set_num_threads(threads)
                figures[key] = timed(partial(torch.exp, x, out=out), args.budget)
            results[str(n)] = figures
        return results
    from glassllm import threads as pool

    pool.set_num_threads(args.threads)
    for n in args.elements:
        x = rng.standard_normal(2 * n, dtype=np.float32)
        out = np.empty_like(x)
        halves = [(x[:n], out[:n]), (x[n:], out[n:])]
        blocks = [lambda a=a, o=o: np.exp(a, out=o) for a, o in halves]
        whole = timed(partial(np.exp, x, out=out), args.budget)
        split = timed(partial(pool.run_blocks, blocks), args.budget)
        results[str(n)] = {"one": whole, "split": split}
    nothing = [lambda: None] * args.threads
    results["empty region"] = {
        "tight": timed(lambda: pool.run_blocks(nothing), args.budget),
        "after 1 ms": timed(lambda: pool.run_blocks(nothing), args.budget, lambda: busy(1e-3)),
    }
    return results


def parent(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    threads = args.threads[0]
    rounds = C.alternate(args, threads)
    groups: dict[str, dict[str, dict[str, Any]]] = {}
    for n in args.elements:
        for side, payloads in rounds.items():
            one = C.median([p[str(n)]["one"] for p in payloads])
            split = C.median([p[str(n)]["split"] for p in payloads])
            figures = {"1 thread µs": one, f"{threads} threads µs": split, "gain": one / split}
            groups.setdefault(f"exp, {n} per thread", {})[side] = figures
    if "glassllm" in rounds:
        empty = rounds["glassllm"]
        groups["empty region"] = {
            "glassllm": {
                "tight µs": C.median([p["empty region"]["tight"] for p in empty]),
                "after 1 ms µs": C.median([p["empty region"]["after 1 ms"] for p in empty]),
            }
        }
    config = dict(threads=threads, rounds=args.rounds)
    return {"handoff": dict(config=config, group="split", groups=groups)}


C.run_as_script(__name__)

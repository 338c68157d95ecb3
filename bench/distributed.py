"""Data-parallel steps on 1 and N ranks (glassllm.distributed over MPI), 1 BLAS thread per rank.

    python bench/distributed.py                          # tiny GPT, N = 1 and 2, 20 steps
    python bench/distributed.py --size mid --steps 4 --warmup 1 --batch-size 4 --ranks 1

On common.py's harness; the one special case: the worker of N > 1 ranks is ``mpiexec -n N`` of
this file (the ranks of one run are one measurement, and rank 0 reports the slowest rank's
figures). ``--threads``: BLAS threads per rank; ``--rounds``: the rank counts alternate.

A step: the global batch, forward+backward on this rank's rows, ``DataParallel.sync_gradients``
(timed as the arrival check, where a rank waits for the slower one, and the Allreduce), clip,
AdamW; reported per N: ms per step, tokens/s, Allreduce ms and share of the step, arrival wait.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import common as C
import numpy as np

SIDES = DEFAULT_SIDES = ("steps",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(threads=[1], rounds=1)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--size", choices=list(C.SIZES), default="tiny")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=C.BATCH_SIZE, help="global")


def slowest_ms(world: Any, seconds: list[float]) -> float:
    """The slowest rank's median, in milliseconds (a collective: every rank calls it)."""
    return 1e3 * max(world.allgather_object(C.median(seconds)))


def worker(args: argparse.Namespace) -> dict[str, Any] | None:
    from glassllm import distributed
    from glassllm.data import get_batch, tokenize_corpus
    from glassllm.models import GPT, GPTConfig
    from glassllm.nn.utils import clip_grad_norm_

    world = distributed.init(timeout_s=600, blas_threads=args.threads)
    block_size = C.SIZES[args.size]["block_size"]
    corpus = tokenize_corpus("builtin", "char", block_size, None)
    config = C.model_config(args.size, vocab_size=corpus.tokenizer.vocab_size)
    model = GPT(GPTConfig(**config), rng=np.random.default_rng([0, 0]))
    optimizer = model.configure_optimizer(1e-3, 0.1, (0.9, 0.99))
    ddp = distributed.DataParallel(model, world)
    batch_rng = np.random.default_rng([0, 1])
    rows = distributed.micro_batch(args.batch_size, world, 1, 0)
    real_arrive, arrive_s = world.arrive, [0.0]

    def timed_arrive(op: str, check: int) -> None:  # splits the sync into waiting and reducing
        started = time.perf_counter()
        real_arrive(op, check)
        arrive_s[0] += time.perf_counter() - started

    world.arrive = timed_arrive
    times: dict[str, list[float]] = {"step": [], "compute": [], "wait": [], "allreduce": []}
    for step in range(args.warmup + args.steps):
        world.barrier()
        started = time.perf_counter()
        x, y = get_batch(corpus.train, block_size, args.batch_size, batch_rng)
        _, loss = model(x[rows], y[rows])
        loss.backward()
        computed, arrive_s[0] = time.perf_counter(), 0.0
        ddp.sync_gradients()
        synced = time.perf_counter()
        clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if step >= args.warmup:
            times["step"].append(time.perf_counter() - started)
            times["compute"].append(computed - started)
            times["wait"].append(arrive_s[0])
            times["allreduce"].append(synced - computed - arrive_s[0])
    ms = {name: slowest_ms(world, seconds) for name, seconds in times.items()}
    many, params = world.size > 1, model.num_parameters()
    report = {"ms / step": ms["step"], "tokens/s": args.batch_size * block_size / ms["step"] * 1e3}
    report |= {"Allreduce ms": ms["allreduce"] * many, "wait ms": ms["wait"]}
    report |= {"share of step": ms["allreduce"] / ms["step"] * many, "compute ms": ms["compute"]}
    report |= {"parameters": params, "gradient MB": params * 4 / 1e6}
    return report if world.is_main else None


def parent(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    beside = Path(sys.executable).parent / "mpiexec"  # a venv's MPI wheel puts its launcher here
    mpiexec = str(beside) if beside.exists() else shutil.which("mpiexec") or "mpiexec"
    rounds: dict[str, list[dict[str, Any]]] = {str(ranks): [] for ranks in args.ranks}
    for _ in range(args.rounds):
        for ranks in args.ranks:
            launcher = [mpiexec, "-n", str(ranks)] if ranks > 1 else []
            run = C.run_side(args, "steps", args.threads[0], launcher=launcher)
            print(f"  {ranks} ranks: {C.fmt_dict(run)}", flush=True)
            rounds[str(ranks)].append(run)
    config = dict(size=args.size, blas_threads=args.threads[0], global_batch=args.batch_size)
    groups = {ranks: C.summarise({"steps": runs}) for ranks, runs in rounds.items()}
    return {args.size: dict(config=config, group="ranks", groups=groups)}


if __name__ == "__main__":
    sys.exit(C.main(sys.modules[__name__]))

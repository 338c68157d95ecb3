"""Data-parallel steps on 1 and N ranks (glassllm.distributed over MPI), 1 BLAS thread per rank.

    python bench/distributed.py                          # tiny GPT, N = 1 and 2, 20 steps
    python bench/distributed.py --model 6x384 --steps 4 --batch-size 8 --block-size 256
    python bench/distributed.py --allreduce-only         # Allreduce of both gradient sizes

Per N, ``mpiexec -n N`` of this file (N = 1: plain python); not on common.py's harness, since the
ranks of one run are one measurement. A step: the global batch, forward+backward on this rank's
rows, ``DataParallel.sync_gradients`` (timed as the arrival check, where a rank waits for the
slower one, and the Allreduce), clip, AdamW. Reported per N, on the slowest rank: ms per step,
tokens/s, Allreduce ms and share, arrival wait. ``--allreduce-only``: the tiny and 6x384 models'
gradients (float32) alone on the largest N, for the cost model in bench/LOG.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

import common as C

MODELS = {
    "tiny": dict(n_layer=4, n_head=4, n_embd=128),
    "6x384": dict(n_layer=6, n_head=6, n_embd=384),
}


def worker(args: argparse.Namespace) -> None:
    import numpy as np

    from glassllm import distributed
    from glassllm.data import get_batch, tokenize_corpus
    from glassllm.models import GPT, GPTConfig
    from glassllm.nn.utils import clip_grad_norm_

    world = distributed.init(timeout_s=600, blas_threads=args.blas_threads)
    corpus = tokenize_corpus("builtin", "char", args.block_size, None)
    config = GPTConfig(
        vocab_size=corpus.tokenizer.vocab_size, block_size=args.block_size, **MODELS[args.model]
    )
    model = GPT(config, rng=np.random.default_rng([0, 0]))
    optimizer = model.configure_optimizer(1e-3, 0.1, (0.9, 0.99))
    ddp = distributed.DataParallel(model, world)
    params = model.num_parameters()
    if args.allreduce_only:
        sizes = {
            name: GPT(
                GPTConfig(vocab_size=65, block_size=block, **MODELS[name]),
                rng=np.random.default_rng(0),
            ).num_parameters()
            for name, block in (("tiny", 64), ("6x384", 256))
        }  # shakespeare_char shapes
        report = {}
        for label, count in sizes.items():
            buffer = np.ones(count, dtype=np.float32)
            times = []
            for _ in range(args.steps):
                world.barrier()
                started = time.perf_counter()
                world._comm.Allreduce(distributed_in_place(), buffer)
                times.append(time.perf_counter() - started)
            slowest = world.allgather_object(median(times))
            report[label] = {"floats": count, "ms": 1e3 * max(slowest)}
        barrier = []
        for _ in range(args.steps):
            started = time.perf_counter()
            world.barrier()
            barrier.append(time.perf_counter() - started)
        report["arrival check alone"] = {"ms": 1e3 * max(world.allgather_object(median(barrier)))}
        if world.is_main:
            print(json.dumps({"ranks": world.size, "allreduce": report}), flush=True)
        return

    batch_rng = np.random.default_rng([0, 1])
    rows = distributed.micro_batch(args.batch_size, world, 1, 0)
    real_arrive = world.arrive
    arrive_s = [0.0]

    def timed_arrive(op: str, check: int) -> None:
        started = time.perf_counter()
        real_arrive(op, check)
        arrive_s[0] += time.perf_counter() - started

    world.arrive = timed_arrive  # split the sync into waiting and reducing
    records = []
    for step in range(args.warmup + args.steps):
        world.barrier()
        started = time.perf_counter()
        x, y = get_batch(corpus.train, args.block_size, args.batch_size, batch_rng)
        _, loss = model(x[rows], y[rows])
        loss.backward()
        compute_done = time.perf_counter()
        arrive_s[0] = 0.0
        ddp.sync_gradients()
        synced = time.perf_counter()
        clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        ended = time.perf_counter()
        if step >= args.warmup:
            wait = arrive_s[0]
            step_s, compute = ended - started, compute_done - started
            records.append(
                dict(
                    step=step_s, compute=compute, wait=wait, allreduce=synced - compute_done - wait
                )
            )
    per_rank = world.allgather_object({k: median([r[k] for r in records]) for k in records[0]})
    slowest = {k: 1e3 * max(r[k] for r in per_rank) for k in per_rank[0]}
    many = world.size > 1
    report = dict(ranks=world.size, blas_threads=args.blas_threads, model=args.model)
    report |= dict(parameters=params, gradient_MB=params * 4 / 1e6, global_batch=args.batch_size)
    report |= dict(ms_per_step=slowest["step"], compute_ms=slowest["compute"])
    report |= dict(tokens_per_s=args.batch_size * args.block_size / slowest["step"] * 1e3)
    report |= dict(wait_ms=slowest["wait"], allreduce_ms=slowest["allreduce"] * many)
    report["allreduce_share"] = slowest["allreduce"] / slowest["step"] * many
    if world.is_main:
        print(json.dumps(report), flush=True)


def distributed_in_place():
    from mpi4py import MPI

    return MPI.IN_PLACE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=12)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--blas-threads", type=int, default=1, help="per rank")
    parser.add_argument("--allreduce-only", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    env = dict(os.environ, **dict.fromkeys(C.THREAD_VARIABLES, str(args.blas_threads)))
    env["PYTHONPATH"] = str(C.REPO_DIR) + os.pathsep + env.get("PYTHONPATH", "")
    beside = Path(sys.executable).parent / "mpiexec"
    mpiexec = str(beside) if beside.exists() else shutil.which("mpiexec")
    for ranks in [max(args.ranks)] if args.allreduce_only else args.ranks:
        command = [sys.executable, __file__, *sys.argv[1:], "--worker"]
        if ranks > 1:
            command = [mpiexec, "-n", str(ranks), *command]
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            sys.exit(f"{ranks} ranks failed:\n{out.stderr}")
        print(out.stdout.strip(), flush=True)


if __name__ == "__main__":
    main()

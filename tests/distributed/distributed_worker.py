"""Train a tiny GPT with glassllm.distributed for a few steps; run by test_distributed.py.

Run alone (size 1) or under ``mpiexec -n N``. Rank 0 writes the parameters and step losses to
``--out`` (.npz). ``--fault`` makes rank ``--fault-rank`` misbehave at step ``--fault-step``:
``raise`` an exception, ``kill`` itself with SIGKILL, ``hang`` (sleep for ever), or ``desync``
(change one weight so that the replica check must catch it) or ``extra-collective`` (call a
barrier the other ranks do not), ``no-grads`` (drop its gradients, then go quiet for longer than
the timeout, as a rank whose next collective is far off) or ``grad-dtype`` (one gradient in
float64); ``other-model`` builds a wider model on that rank, ``other-config`` asks it for one more
step. With ``--fault-file``, the faulty rank writes there the time (``time.time()``) at which it
misbehaves, so a test can measure from the fault to the end of the job.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import numpy as np

import glassllm
from glassllm import distributed, no_grad
from glassllm.data import get_batch, tokenize_corpus
from glassllm.models import GPT, GPTConfig
from glassllm.nn.utils import clip_grad_norm_


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument(
        "--fault",
        default="none",
        choices=[
            "none",
            "raise",
            "kill",
            "hang",
            "desync",
            "extra-collective",
            "other-model",
            "other-config",
            "no-grads",
            "grad-dtype",
        ],
    )
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--fault-step", type=int, default=1)
    parser.add_argument("--fault-file", default=None, help="the fault's time.time() goes here")
    parser.add_argument("--out", default=None)
    parser.add_argument("--save", default=None, help="checkpoint written by rank 0 at the end")
    parser.add_argument("--load", default=None, help="checkpoint read by rank 0 alone at the start")
    parser.add_argument(
        "--stop-on-sigint",
        action="store_true",
        help="Ctrl-C stops every rank after the same step (exit status 130)",
    )
    args = parser.parse_args()

    world = distributed.init(timeout_s=args.timeout)
    distributed.check_batch_split(args.batch_size, world.size, args.grad_accum)
    settings = {"steps": args.steps, "batch_size": args.batch_size, "grad_accum": args.grad_accum}
    if args.fault == "other-config" and world.rank == args.fault_rank:
        settings["steps"] += 1
        record_fault(args.fault_file)
    world.check_same(settings)
    corpus = tokenize_corpus("builtin", "char", 16, None)
    width = 32
    if args.fault == "other-model" and world.rank == args.fault_rank:
        width = 48
        record_fault(args.fault_file)
    config = GPTConfig(
        vocab_size=corpus.tokenizer.vocab_size, block_size=16, n_layer=2, n_head=2, n_embd=width
    )
    # A different seed per rank: DataParallel must make the replicas equal anyway.
    model = GPT(config, rng=np.random.default_rng([0, world.rank]))
    optimizer = model.configure_optimizer(1e-3, 0.1, (0.9, 0.99))
    ddp = distributed.DataParallel(model, world, grad_accum=args.grad_accum)
    batch_rng = np.random.default_rng([0, 1])  # the same batches on every rank
    if args.load:  # rank 0 reads, every rank receives: no shared file system needed
        metadata = glassllm.load(args.load, model, optimizer) if world.rank == 0 else None
        metadata = world.broadcast_object(metadata)
        ddp.broadcast_model()
        ddp.broadcast_optimizer(optimizer)
        batch_rng.bit_generator.state = metadata["batches"]
    losses = []
    interrupted = []
    if args.stop_on_sigint:
        signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    for step in range(args.steps):
        x, y = get_batch(corpus.train, 16, args.batch_size, batch_rng)
        loss_sum = 0.0
        for k in range(args.grad_accum):
            rows = distributed.micro_batch(args.batch_size, world, args.grad_accum, k)
            _, loss = model(x[rows], y[rows])
            loss.backward()
            loss_sum += float(loss.data)
        faulty = world.rank == args.fault_rank and step == args.fault_step
        if faulty:
            record_fault(args.fault_file)
            fault(args.fault, model, world)
        ddp.sync_gradients()
        if faulty and args.fault == "no-grads":
            time.sleep(2 * args.timeout)  # the next collective is far off
        clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        # One small Allreduce a step: the mean loss, and whether any rank saw Ctrl-C.
        loss_total, stops = world.sum([loss_sum, float(bool(interrupted))])
        losses.append(loss_total / (world.size * args.grad_accum))
        if args.stop_on_sigint:
            print(f"rank {world.rank} step {step}", flush=True)
        if stops:
            print(f"rank {world.rank} stopped after step {step}", flush=True)
            sys.exit(130)
    with no_grad():
        ddp.check_replicas()
    if world.rank == 0:
        print(
            f"trained {args.steps} steps on {world.size} ranks; losses {losses}; "
            f"BLAS threads {world.blas_threads} ({blas_pools()})",
            flush=True,
        )
        if args.save:
            glassllm.save(args.save, model, optimizer, {"batches": batch_rng.bit_generator.state})
        if args.out:
            np.savez(
                args.out,
                losses=np.array(losses),
                **{name: p.data for name, p in model.named_parameters()},
            )


def blas_pools() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    return "pools " + ",".join(
        str(p["num_threads"]) for p in threadpool_info() if p["user_api"] == "blas"
    )


def record_fault(path: str | None) -> None:
    if path:
        with open(path, "w") as file:
            file.write(repr(time.time()))


def fault(kind: str, model: GPT, world: distributed.World) -> None:
    if kind == "raise":
        raise RuntimeError("deliberate failure for the test")
    if kind == "kill":
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        time.sleep(1e6)
    if kind == "desync":
        model.ln_f.weight.data[0] += 1e-3
    if kind == "extra-collective":  # as a collective inside rank-0-only code would
        world.barrier()
    if kind == "no-grads":
        model.zero_grad()
    if kind == "grad-dtype":
        model.ln_f.weight.grad = model.ln_f.weight.grad.astype(np.float64)


if __name__ == "__main__":
    main()

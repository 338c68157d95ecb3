"""Milliseconds per training step: glassllm's Trainer vs PyTorch at equal threads, paired rounds.

    python bench/train_step.py                          # tiny size, threads 2 and 1, 5 rounds
    python bench/train_step.py --size tiny small mid --threads 2 --sides glassllm,torch,torch-manual

A step is ``Trainer.train_step`` (what ``glassllm train`` takes: batch, scheduled learning rate,
forward, backward, clip to 1.0, AdamW, zero grad); the PyTorch side takes it in nanoGPT's model on
the same data (common.torch_step). Sides: ``glassllm`` (allocator tuned, as the command does),
``glassllm-numpy`` (without the ``fast`` extra's kernels), ``glassllm-untuned`` (glibc's
allocator defaults), ``torch`` (fused attention), ``torch-manual`` (attention written out). Also
reported: the step's matmul GFLOP/s against one large np.matmul, and the "BLAS floor" (the step's
matrix products alone, preallocated). First, one process checks that both models compute the
same loss and gradients from the same weights and batch.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import common as C
import numpy as np

SIDES = ("glassllm", "glassllm-numpy", "glassllm-untuned", "torch", "torch-manual", "matmul")
SIDES += ("check",)  # run_side's helpers: the GFLOP/s probe and the equivalence check
DEFAULT_SIDES = ("glassllm", "torch")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(threads=[2, 1], rounds=5)
    parser.add_argument("--size", nargs="+", default=["tiny"], choices=list(C.SIZES))
    parser.add_argument("--steps", type=int, default=20, help="timed steps per process")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--matmul-n", type=int, default=2048, help="n of the n³ GFLOP/s probe")
    parser.add_argument("--no-check", action="store_true", help="skip the loss/gradient check")


def worker(args: argparse.Namespace) -> dict[str, Any]:
    size = args.size[0]
    if args.worker == "matmul":
        return matmul_rates(C.model_config(size), args.matmul_n)
    with tempfile.TemporaryDirectory() as tmp:
        if args.worker == "glassllm-numpy":  # without the compiled kernels of the fast extra
            from glassllm.functional import compiled

            compiled.set_enabled(False)
        tuned = args.worker in ("glassllm", "glassllm-numpy")
        trainer = C.glassllm_trainer(Path(tmp), size, tuned=tuned)
        if args.worker == "check":
            return equivalence(trainer)
        if args.worker.startswith("torch"):
            C.set_torch_threads(args.threads)
            attention = "manual" if args.worker == "torch-manual" else "sdpa"
            step = C.torch_step(trainer, attention=attention)[1]
        else:
            step = trainer.train_step
        C.time_calls(step, repeats=0, warmup=args.warmup)
        faults = C.minor_faults()
        times = C.time_calls(step, repeats=args.steps)
        faults = (C.minor_faults() - faults) / args.steps
        return {"median_ms": C.median(times) * 1e3, "minor_faults_per_step": faults}


def equivalence(trainer: Any) -> dict[str, Any]:
    """Same weights, same batch: the loss and every gradient must agree (float32 tolerance)."""
    import torch
    from torch_gpt import to_torch_layout, torch_name, twin

    from glassllm.data import get_batch

    cfg, model = trainer.config, trainer.model
    reference = twin(model)
    x, y = get_batch(trainer.corpus.train, cfg.block_size, cfg.batch_size, trainer.batch_rng)
    _, loss = model(x, y)
    loss.backward()
    _, ref_loss = reference(torch.from_numpy(x.copy()), torch.from_numpy(y.copy()))
    ref_loss.backward()
    reference_params = dict(reference.named_parameters())
    worst = 0.0
    for name, p in model.named_parameters():
        g = to_torch_layout(torch_name(name), reference_params[torch_name(name)].grad.numpy())
        worst = max(worst, float(np.abs(p.grad - g).max() / (np.abs(g).max() or 1.0)))
    ours, theirs = float(loss.data), float(ref_loss.detach())
    if abs(ours - theirs) > 1e-4 or worst > 1e-3:
        raise AssertionError(f"loss {ours} vs {theirs}, worst gradient difference {worst:.1e}")
    return {"loss_glassllm": ours, "loss_torch": theirs, "grad_max_rel_diff": worst}


def matmul_rates(config: dict[str, int], n: int) -> dict[str, float]:
    """GFLOP/s of one n³ float32 np.matmul, and the milliseconds of the step's matrix products
    alone (forward and backward, transposes folded into the shapes, operands preallocated)."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    rate = 2.0 * n**3 / min(C.time_calls(lambda: np.matmul(a, b), repeats=7, warmup=2)) / 1e9
    N, T, E, V = C.BATCH_SIZE * config["block_size"], config["block_size"], config["n_embd"], 65
    BH, hs = C.BATCH_SIZE * config["n_head"], config["n_embd"] // config["n_head"]

    def linear(i: int, o: int) -> list:  # y = x W, dx = g Wᵀ, dW = xᵀ g
        return [((N, i), (i, o)), ((N, o), (o, i)), ((i, N), (N, o))]

    # attention: q kᵀ, P v; backward dP = dy vᵀ, dv = Pᵀ dy, dq = dS k, dk = dSᵀ q
    attention = [((BH, T, hs), (BH, hs, T)), ((BH, T, T), (BH, T, hs))] * 3
    layer = linear(E, 3 * E) + attention + linear(E, E) + linear(E, 4 * E) + linear(4 * E, E)
    shapes = layer * config["n_layer"] + linear(E, V)
    operands = [
        (rng.standard_normal(s, dtype=np.float32), rng.standard_normal(t, dtype=np.float32))
        for s, t in shapes
    ]
    floor = C.median(C.time_calls(lambda: [a @ b for a, b in operands], repeats=30, warmup=3))
    return {"matmul_gflops": rate, "floor_ms": floor * 1e3}


def parent(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    runs = {}
    for size in args.size:
        config = C.model_config(size)
        flops = C.gpt_matmul_flops_per_step(C.BATCH_SIZE, **config)
        payload: dict[str, Any] = {"config": {**config, "batch_size": C.BATCH_SIZE}}
        payload |= dict(flops_per_step=flops, rounds=args.rounds, steps=args.steps, by_threads={})
        if not args.no_check and any(s.startswith("torch") for s in args.sides):
            payload["equivalence"] = C.run_side(args, "check", 1, "--size", size)
            print(f"{size}: same weights and batch: {C.fmt_dict(payload['equivalence'])}")
        for threads in args.threads:
            print(f"{size}, {threads} threads", flush=True)
            rates = [C.run_side(args, "matmul", threads, "--size", size)]
            results = C.alternate(args, threads, "--size", size)
            rates.append(C.run_side(args, "matmul", threads, "--size", size))
            entry: dict[str, Any] = {"matmul_gflops": max(r["matmul_gflops"] for r in rates)}
            entry |= {"floor_ms": min(r["floor_ms"] for r in rates), "sides": {}, "ratios": {}}
            for side, rounds in results.items():
                ms = [r["median_ms"] for r in rounds]
                faults = C.median([r["minor_faults_per_step"] for r in rounds])
                entry["sides"][side] = dict(median_ms=C.median(ms), per_round_ms=ms)
                entry["sides"][side] |= dict(gflops=flops / (C.median(ms) / 1e3) / 1e9)
                entry["sides"][side]["minor_faults_per_step"] = faults
            for side in (s for s in results if s.startswith("torch") and "glassllm" in results):
                ms = [entry["sides"][s]["per_round_ms"] for s in ("glassllm", side)]
                entry["ratios"][side] = C.paired_ratio(*ms)
            payload["by_threads"][str(threads)] = entry
        runs[size] = payload
    return runs


def render(runs: dict[str, Any]) -> str:
    """RESULTS.md's block: per size, the check and one row per threads and side."""
    headers = ["threads", "side", "ms/step", "glassllm / side (paired)", "GFLOP/s"]
    headers += ["np.matmul n³ GFLOP/s", "BLAS floor ms", "minor faults/step"]
    lines = []
    for size, run in runs.items():
        lines += [
            C.machine_line(run["machine"]),
            "",
            f"Size {size} ({C.fmt_dict(run['config'])}): {run['rounds']} alternating rounds x "
            f"{run['steps']} timed steps per process; matmul FLOPs per step "
            f"{run['flops_per_step'] / 1e9:.3f} GFLOP.",
            "",
        ]
        if "equivalence" in run:
            eq = run["equivalence"]
            lines += [
                f"Same weights, same batch: loss {eq['loss_glassllm']:.6f} (glassllm) vs "
                f"{eq['loss_torch']:.6f} (torch), worst gradient difference "
                f"{eq['grad_max_rel_diff']:.1e} of the largest entry.",
                "",
            ]
        rows, per_round = [], []
        for threads, e in run["by_threads"].items():
            for side, v in e["sides"].items():
                row = [threads, side, v["median_ms"], e["ratios"].get(side, "-"), v["gflops"]]
                rows.append(row + [e["matmul_gflops"], e["floor_ms"], v["minor_faults_per_step"]])
                ms = ", ".join(f"{x:.1f}" for x in v["per_round_ms"])
                per_round.append(f"{threads} threads {side} {ms}")
        lines += [C.table(headers, rows), "", "Per round, ms: " + "; ".join(per_round) + ".", ""]
    return "\n".join(lines).rstrip()


def main(argv: list[str] | None = None) -> int:
    return C.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())

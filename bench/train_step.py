"""Milliseconds per nanoGPT training step: glassllm vs PyTorch at equal threads, paired rounds.

    python bench/train_step.py                     # threads 2 and 1, 5 rounds each
    python bench/train_step.py --threads 2 --rounds 7 --steps 30
    python bench/train_step.py --glassllm-env MALLOC_MMAP_THRESHOLD_=1000000000   # try a lever

Configuration: nanoGPT's shakespeare_char on a CPU (n_layer=4, n_head=4, n_embd=128,
block_size=64, batch_size=12, vocab 65, float32, AdamW, grad clip 1.0, no dropout, no bias).
A step = forward with loss, backward, clip, AdamW step, zero grad (data loading not timed).

Each round starts one fresh process per side (glassllm, then torch), each warms up and times
``--steps`` steps and reports the median; the headline ratio is the median over rounds of the
per-round ratio glassllm/torch (see _harness for why). Also printed: achieved matmul GFLOP/s of a
step against a large np.matmul measured in the same run, and the "BLAS floor": the same step's
matrix products alone in NumPy, preallocated. Before timing, one process checks that both
models, given the same weights, compute the same loss and gradients.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import _harness as H

SCRIPT = Path(__file__).resolve()


def worker(args: argparse.Namespace) -> None:
    import numpy as np  # noqa: F401  (thread count already fixed by the environment)

    config = dict(H.NANOGPT_CPU)
    if args.worker == "matmul":
        import _steps

        rate = H.matmul_rate_gflops(args.matmul_n)
        floor = _steps.matmul_floor(config, H.BATCH_SIZE)
        floor_s = H.median(H.time_calls(floor, repeats=50, warmup=5))
        H.emit({"matmul_gflops": rate, "matmul_n": args.matmul_n, "floor_ms": floor_s * 1e3})
        return
    if args.worker == "check":
        H.emit(equivalence_check(config))
        return

    import _steps

    tuned = False
    if args.worker == "torch":
        H.set_torch_threads(args.threads)
        _, _, step = _steps.torch_step(config)
    else:
        tuned = _steps.tune_allocator(args.worker == "glassllm")
        _, _, step = _steps.glassllm_step(config)
    batches = _steps.random_batches(
        args.warmup + args.steps, H.BATCH_SIZE, config["block_size"], config["vocab_size"]
    )
    for x, y in batches[: args.warmup]:
        step(x, y)
    phases: dict[str, list[float]] = {p: [] for p in _steps.PHASES}
    totals, losses = [], []
    faults_before = H.page_faults()[0]
    for x, y in batches[args.warmup :]:
        t = step(x, y)
        for p in _steps.PHASES:
            phases[p].append(t[p])
        totals.append(sum(t[p] for p in _steps.PHASES))
        losses.append(t["loss"])
    faults = (H.page_faults()[0] - faults_before) / args.steps
    H.emit(
        {
            "median_ms": H.median(totals) * 1e3,
            "min_ms": min(totals) * 1e3,
            "phases_ms": {p: H.median(v) * 1e3 for p, v in phases.items()},
            "minor_faults_per_step": faults,
            "last_loss": losses[-1],
            "allocator_tuned": tuned,
        }
    )


def equivalence_check(config: dict[str, int]) -> dict[str, float]:
    """Same weights, same batch: loss and every gradient must agree (float32 tolerance)."""
    import _steps
    import numpy as np
    import torch
    from torch_gpt import TorchGPT, TorchGPTConfig, copy_from_glassllm, glassllm_names

    model = _steps.glassllm_model(config, seed=1)
    reference = TorchGPT(TorchGPTConfig(**config))
    copy_from_glassllm(reference, {n: p.data for n, p in model.named_parameters()})
    ((x, y),) = _steps.random_batches(
        1, H.BATCH_SIZE, config["block_size"], config["vocab_size"], 1
    )
    _, loss = model(x, y)
    loss.backward()
    _, ref_loss = reference(torch.from_numpy(x), torch.from_numpy(y))
    ref_loss.backward()
    ours = dict(model.named_parameters())
    worst = 0.0
    for torch_name, p in reference.named_parameters():
        g = p.grad.numpy()
        glass_grad = ours[glassllm_names(config["n_layer"])[torch_name]].grad
        if torch_name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            glass_grad = glass_grad.T
        scale = float(np.abs(g).max()) or 1.0
        worst = max(worst, float(np.abs(glass_grad - g).max()) / scale)
    loss_diff = abs(float(loss.data) - float(ref_loss.detach()))
    if loss_diff > 1e-4 or worst > 1e-3:
        raise AssertionError(
            f"glassllm and torch disagree: loss {float(loss.data)} vs {float(ref_loss)}, "
            f"worst relative gradient difference {worst:.2e}"
        )
    return {
        "loss_glassllm": float(loss.data),
        "loss_torch": float(ref_loss.detach()),
        "loss_abs_diff": loss_diff,
        "grad_max_rel_diff": worst,
        "grad_dtypes": sorted({str(p.grad.dtype) for p in ours.values()}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per process")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--matmul-n", type=int, default=2048)
    parser.add_argument(
        "--sides",
        default="glassllm,torch",
        help="comma list of glassllm (allocator tuned as the glassllm command does), "
        "glassllm-untuned (glibc defaults), torch",
    )
    parser.add_argument(
        "--glassllm-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the glassllm processes (e.g. malloc tuning)",
    )
    parser.add_argument("--no-check", action="store_true", help="skip the loss/gradient check")
    parser.add_argument("--out", default="train_step", help="JSON name under bench/results/")
    parser.add_argument(
        "--write-results", action="store_true", help="also refresh bench/RESULTS.md"
    )
    parser.add_argument(
        "--worker",
        choices=["glassllm", "glassllm-untuned", "torch", "matmul", "check"],
        help=argparse.SUPPRESS,
    )
    args = parser.parse_args(argv)
    if args.worker:
        args.threads = args.threads[0]
        worker(args)
        return 0

    sides = args.sides.split(",")
    glass_env = dict(item.split("=", 1) for item in args.glassllm_env)
    common = ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    payload: dict = {
        "config": {**H.NANOGPT_CPU, "batch_size": H.BATCH_SIZE},
        "flops_per_step": H.gpt_matmul_flops_per_step(H.BATCH_SIZE, **H.NANOGPT_CPU),
        "rounds": args.rounds,
        "steps": args.steps,
        "glassllm_env": glass_env,
        "by_threads": {},
    }
    if not args.no_check and "glassllm" in sides and "torch" in sides:
        check = H.run_worker(SCRIPT, ["--worker", "check"], threads=1)
        payload["equivalence"] = check
        print(
            f"equivalence: loss {check['loss_glassllm']:.6f} (glassllm) vs "
            f"{check['loss_torch']:.6f} (torch); worst gradient difference "
            f"{check['grad_max_rel_diff']:.1e} of the largest entry; "
            f"grad dtypes {check['grad_dtypes']}"
        )

    flops = payload["flops_per_step"]["step"]
    rows = []
    for threads in args.threads:
        print(f"threads={threads}")
        matmul = H.run_worker(
            SCRIPT,
            ["--worker", "matmul", "--threads", str(threads), "--matmul-n", str(args.matmul_n)],
            threads,
        )
        runners = {
            side: (
                lambda side=side, threads=threads: H.run_worker(
                    SCRIPT,
                    ["--worker", side, "--threads", str(threads), *common],
                    threads,
                    glass_env if side.startswith("glassllm") else None,
                )
            )
            for side in sides
        }
        results = H.alternate(runners, args.rounds)
        matmul_end = H.run_worker(
            SCRIPT,
            ["--worker", "matmul", "--threads", str(threads), "--matmul-n", str(args.matmul_n)],
            threads,
        )
        peak = max(matmul["matmul_gflops"], matmul_end["matmul_gflops"])
        entry = {
            "matmul_gflops": peak,
            "floor_ms": min(matmul["floor_ms"], matmul_end["floor_ms"]),
            "sides": {},
        }
        for side, runs in results.items():
            ms = [r["median_ms"] for r in runs]
            entry["sides"][side] = {
                "median_ms": H.median(ms),
                "per_round_ms": ms,
                "gflops": flops / (H.median(ms) / 1e3) / 1e9,
                "phases_ms": {
                    p: H.median([r["phases_ms"][p] for r in runs]) for p in runs[0]["phases_ms"]
                },
                "minor_faults_per_step": H.median([r["minor_faults_per_step"] for r in runs]),
            }
        if "glassllm" in results and "torch" in results:
            g = [r["median_ms"] for r in results["glassllm"]]
            t = [r["median_ms"] for r in results["torch"]]
            entry["ratio_paired"] = H.paired_ratio(g, t)
            entry["ratio_per_round"] = [a / b for a, b in zip(g, t, strict=False)]
        payload["by_threads"][str(threads)] = entry
        rows.append(entry)

    print()
    print(f"step matmul FLOPs: {flops / 1e9:.3f} GFLOP")
    H.print_table(
        [
            "threads",
            "glassllm ms",
            "torch ms",
            "ratio (paired)",
            "glassllm GFLOP/s",
            "torch GFLOP/s",
            "np.matmul GFLOP/s",
            "BLAS floor ms",
        ],
        [
            [
                t,
                e["sides"].get("glassllm", {}).get("median_ms", "-"),
                e["sides"].get("torch", {}).get("median_ms", "-"),
                e.get("ratio_paired", "-"),
                e["sides"].get("glassllm", {}).get("gflops", "-"),
                e["sides"].get("torch", {}).get("gflops", "-"),
                e["matmul_gflops"],
                e["floor_ms"],
            ]
            for t, e in payload["by_threads"].items()
        ],
    )
    print()
    H.print_table(
        [
            "threads",
            "side",
            "step ms",
            "forward ms",
            "backward ms",
            "clip ms",
            "optimizer ms",
            "minor faults/step",
        ],
        [
            [
                t,
                s,
                v["median_ms"],
                *(v["phases_ms"][p] for p in ("forward", "backward", "clip", "optimizer")),
                v["minor_faults_per_step"],
            ]
            for t, e in payload["by_threads"].items()
            for s, v in e["sides"].items()
        ],
    )
    path = H.write_json(args.out, payload)
    print(f"\nwrote {path}")
    if args.write_results:
        import report

        report.main([])
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Resident memory of training and inference: glassllm vs PyTorch, each side in its own process.

    python bench/memory.py                 # both sides, 300 steps, 1000 no_grad forwards
    python bench/memory.py --steps 50 --forwards 100     # quicker

Per side, in a fresh process (nanoGPT CPU config, batch 12):
- step peak: the peak resident set size during one training step after 3 warm-up steps, measured
  by resetting the kernel's high-water mark (``/proc/self/clear_refs`` "5", then ``VmHWM``). The
  headline is that peak minus the resident size once the model was built ("peak over model":
  activations, graph, gradients, optimizer state), which does not depend on how much freed memory
  the allocator kept from the warm-up steps; the peak minus the size just before the step is shown
  too (small when malloc keeps the previous step's memory). ``ru_maxrss`` (the lifetime peak,
  imports included: PyTorch alone is ~300 MiB) is reported as well.
- growth over ``--steps`` training steps and over ``--forwards`` forward passes under no_grad:
  resident size (``/proc/self/statm``) after the first 10 and after the last. A graph that outlives
  its step (a reference cycle, a cache) shows here as growth.
- glassllm only: live Tensor objects after the loop and what ``gc.collect()`` frees (anything it
  frees was a reference cycle that plain reference counting could not release).
"""

from __future__ import annotations

import argparse
import gc
import re
import sys
from pathlib import Path

import _harness as H

SCRIPT = Path(__file__).resolve()
MIB = 1024 * 1024


def high_water_bytes() -> int:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) * 1024


def reset_high_water() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def worker(args: argparse.Namespace) -> None:
    import _steps
    import numpy as np

    config = dict(H.NANOGPT_CPU)
    rss_imports = H.rss_bytes()
    if args.worker == "torch":
        import torch

        H.set_torch_threads(args.threads)
        model, _, step = _steps.torch_step(config)
        no_grad = torch.no_grad

        def forward(x, y):
            return model(torch.from_numpy(x), torch.from_numpy(y))
    else:
        import glassllm

        extra_tuned = _steps.tune_allocator(args.worker == "glassllm")
        model, _, step = _steps.glassllm_step(config)
        no_grad = glassllm.no_grad
        forward = model
    batches = _steps.random_batches(16, H.BATCH_SIZE, config["block_size"], config["vocab_size"])
    rss_model = H.rss_bytes()
    for x, y in batches[:3]:
        step(x, y)
    gc.collect()
    before_step = H.rss_bytes()
    exact = reset_high_water()
    step(*batches[3])
    step_peak = high_water_bytes() if exact else H.peak_rss_bytes()

    trace = {}
    for i in range(1, args.steps + 1):
        step(*batches[i % len(batches)])
        if i in (10, 50, 100, 200) or i == args.steps:
            trace[i] = H.rss_bytes()
    steps_growth = trace[args.steps] - trace[10]

    forward_trace = {}
    with no_grad():
        for i in range(1, args.forwards + 1):
            forward(*batches[i % len(batches)])
            if i in (10, 100, 500) or i == args.forwards:
                forward_trace[i] = H.rss_bytes()
    forwards_growth = forward_trace[args.forwards] - forward_trace[10]

    extra = {}
    if args.worker.startswith("glassllm"):
        extra["allocator_tuned"] = extra_tuned
        from glassllm import Tensor

        extra["live_tensors"] = sum(isinstance(o, Tensor) for o in gc.get_objects())
        extra["num_parameters"] = len(list(model.parameters()))
    extra["gc_collected"] = gc.collect()
    H.emit(
        {
            "rss_after_imports_mib": rss_imports / MIB,
            "rss_model_built_mib": rss_model / MIB,
            "rss_before_step_mib": before_step / MIB,
            "step_peak_mib": step_peak / MIB,
            "step_working_mib": (step_peak - before_step) / MIB,
            "step_over_model_mib": (step_peak - rss_model) / MIB,
            "step_peak_exact": exact,
            "ru_maxrss_mib": H.peak_rss_bytes() / MIB,
            "steps": args.steps,
            "rss_steps_mib": {str(k): v / MIB for k, v in trace.items()},
            "steps_growth_mib": steps_growth / MIB,
            "forwards": args.forwards,
            "rss_forwards_mib": {str(k): v / MIB for k, v in forward_trace.items()},
            "forwards_growth_mib": forwards_growth / MIB,
            "numpy": np.__version__,
            **extra,
        }
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--forwards", type=int, default=1000)
    parser.add_argument(
        "--sides",
        default="glassllm,torch",
        help="comma list of glassllm (allocator tuned as the glassllm command does), "
        "glassllm-untuned, torch",
    )
    parser.add_argument(
        "--write-results", action="store_true", help="also refresh bench/RESULTS.md"
    )
    parser.add_argument(
        "--worker", choices=["glassllm", "glassllm-untuned", "torch"], help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.steps < 10 or args.forwards < 10:
        parser.error(
            "--steps and --forwards must be at least 10 (growth is measured from the 10th)"
        )
    if args.worker:
        worker(args)
        return 0

    results = {}
    for side in args.sides.split(","):
        print(f"{side} ...", flush=True)
        results[side] = H.run_worker(
            SCRIPT,
            [
                "--worker",
                side,
                "--threads",
                str(args.threads),
                "--steps",
                str(args.steps),
                "--forwards",
                str(args.forwards),
            ],
            args.threads,
        )
    rows = [
        [
            side,
            r["rss_model_built_mib"],
            r["step_peak_mib"],
            r["step_over_model_mib"],
            r["step_working_mib"],
            r["ru_maxrss_mib"],
            r["steps_growth_mib"],
            r["forwards_growth_mib"],
            r["gc_collected"],
        ]
        for side, r in results.items()
    ]
    H.print_table(
        [
            "side",
            "RSS model built MiB",
            "step peak MiB",
            "peak over model MiB",
            "peak over pre-step MiB",
            "ru_maxrss MiB",
            f"growth {args.steps} steps MiB",
            f"growth {args.forwards} no_grad fwd MiB",
            "gc.collect() freed",
        ],
        rows,
    )
    payload = {
        "config": {**H.NANOGPT_CPU, "batch_size": H.BATCH_SIZE},
        "threads": args.threads,
        "sides": results,
    }
    if "glassllm" in results and "torch" in results:
        payload["step_over_model_ratio"] = (
            results["glassllm"]["step_over_model_mib"] / results["torch"]["step_over_model_mib"]
        )
        print(
            "training-step peak over the built model, glassllm/torch: "
            f"{payload['step_over_model_ratio']:.2f}"
        )
    if "glassllm" in results:
        g = results["glassllm"]
        print(
            f"glassllm: {g['live_tensors']} live Tensors after the loops "
            f"({g['num_parameters']} parameters)"
        )
    path = H.write_json("memory", payload)
    print(f"wrote {path}")
    if args.write_results:
        import report

        report.main([])
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Resident memory of training and inference: glassllm vs PyTorch, each side in its own process.

    python bench/memory.py                               # tiny size, 300 steps, 1000 forwards
    python bench/memory.py --steps 50 --forwards 100     # quicker

- step peak: the high-water mark during one training step after 3 warm-up steps (reset through
  ``/proc/self/clear_refs``); the headline is that peak minus the resident size once the model was
  built ("peak over model"), independent of what the allocator kept from the warm-up. ``ru_maxrss``
  (imports included: PyTorch alone is ~300 MiB) as well.
- growth over ``--steps`` steps and ``--forwards`` no_grad forwards, from the 10th on: a graph
  that outlives its step shows here; glassllm: live Tensor objects after the loops.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
from pathlib import Path
from typing import Any

import common as C
import numpy as np

import glassllm
from glassllm.data import get_batch

SIDES = ("glassllm", "glassllm-untuned", "torch")
DEFAULT_SIDES = ("glassllm", "torch")

MIB = 2**20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(rounds=1)
    parser.add_argument("--size", default="tiny", choices=list(C.SIZES))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--forwards", type=int, default=1000)


def high_water_after(fn: Any) -> int:
    """Peak resident bytes while ``fn()`` runs (the lifetime peak where the kernel refuses)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        fn()
        return C.peak_rss_bytes()
    fn()
    return C.high_water_bytes()


def worker(args: argparse.Namespace) -> dict[str, Any]:
    if args.steps < 10 or args.forwards < 10:
        raise SystemExit("--steps and --forwards must be at least 10 (growth from the 10th on)")
    rss_imports = C.rss_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = C.glassllm_trainer(Path(tmp), args.size, tuned=args.worker == "glassllm")
        cfg = trainer.config
        batch = get_batch(trainer.corpus.val, cfg.block_size, cfg.batch_size, trainer.batch_rng)
        if args.worker == "torch":
            import torch

            C.set_torch_threads(args.threads)
            model, step = C.torch_step(trainer)
            del trainer.model, trainer.optimizer  # only the PyTorch model stays resident
            no_grad = torch.no_grad
            batch = tuple(torch.from_numpy(a.copy()) for a in batch)
        else:
            from glassllm.functional import compiled

            compiled.load()  # numba's runtime, when installed, is counted with the imports
            model, step, no_grad = trainer.model, trainer.train_step, glassllm.no_grad
        gc.collect()
        rss_model = C.rss_bytes()
        C.time_calls(step, repeats=0, warmup=3)
        step_peak = high_water_after(step)
        steps, forwards = [], []
        for _ in range(args.steps):
            step()
            steps.append(C.rss_bytes())
        with no_grad():
            for _ in range(args.forwards):
                model(*batch)
                forwards.append(C.rss_bytes())
        live = (
            0
            if args.worker == "torch"
            else sum(issubclass(type(o), glassllm.Tensor) for o in gc.get_objects())
        )
    out = dict(rss_after_imports_mib=rss_imports / MIB, rss_model_built_mib=rss_model / MIB)
    out |= dict(step_peak_mib=step_peak / MIB, step_over_model_mib=(step_peak - rss_model) / MIB)
    out |= dict(ru_maxrss_mib=C.peak_rss_bytes() / MIB, steps=args.steps, forwards=args.forwards)
    out |= dict(steps_growth_mib=(steps[-1] - steps[9]) / MIB)
    out |= dict(forwards_growth_mib=(forwards[-1] - forwards[9]) / MIB)
    out |= dict(gc_collected=gc.collect(), numpy=np.__version__)
    if args.worker != "torch":
        out["live_tensors"] = live
    return out


def parent(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    results = {side: C.run_side(args, side, args.threads[0]) for side in args.sides}
    payload: dict[str, Any] = {
        "config": {**C.model_config(args.size), "batch_size": C.BATCH_SIZE},
        "threads": args.threads[0],
        "sides": results,
    }
    if "glassllm" in results and results.get("torch", {}).get("step_over_model_mib", 0) > 0:
        mine, theirs = results["glassllm"], results["torch"]
        payload["step_over_model_ratio"] = (
            mine["step_over_model_mib"] / theirs["step_over_model_mib"]
        )
    return {args.size: payload}


def render(runs: dict[str, Any]) -> str:
    """RESULTS.md's block: resident memory per side."""
    run = next(iter(runs.values()))
    headers = ["side", "RSS, model built (MiB)", "step peak (MiB)", "step peak over model (MiB)"]
    headers += ["ru_maxrss (MiB)", "growth over steps (MiB)", "growth over no_grad forwards (MiB)"]
    headers += ["gc.collect() freed"]
    keys = ["rss_model_built_mib", "step_peak_mib", "step_over_model_mib", "ru_maxrss_mib"]
    keys += ["steps_growth_mib", "forwards_growth_mib", "gc_collected"]
    first = next(iter(run["sides"].values()))
    lines = [
        C.machine_line(run["machine"]),
        "",
        f"Growth over {first['steps']} training steps and {first['forwards']} no_grad forwards, "
        "from the 10th on.",
        "",
        C.table(headers, [[side, *(r[k] for k in keys)] for side, r in run["sides"].items()]),
    ]
    if "step_over_model_ratio" in run:
        ratio = run["step_over_model_ratio"]
        lines += ["", f"Training-step peak over the built model, glassllm/torch: **{ratio:.2f}x**."]
    if "live_tensors" in run["sides"].get("glassllm", {}):
        lines.append(f"glassllm: {run['sides']['glassllm']['live_tensors']} live Tensor objects.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return C.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())

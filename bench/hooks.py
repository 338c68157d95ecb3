"""What the hook points cost, on ``glassllm train``'s default model (``--size tiny``).

    python bench/hooks.py          # 5 rounds; --size small --rounds 3

Sides: ``glassllm`` (hook points as shipped, none active) and ``glassllm-nohooks`` (each one
replaced by an identity function on its parent; the layers' check "any hook active?" stays).
Each process times bench/train_step.py's step (``Trainer.train_step``) and a no_grad forward of
one sequence of ``block_size`` tokens; ``glassllm`` also ``run_with_cache`` of every hook point
(alternating with the forward) and one activation-patching sweep, ``blocks.{i}.hook_resid_pre``
x every position (``glassllm.interp.activation_patch``). Targets (issue 22): step <= 1.01x,
cache <= 2x the forward, sweep < 5 s.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import common as C
import numpy as np

SIDES = DEFAULT_SIDES = ("glassllm", "glassllm-nohooks")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(rounds=5)
    parser.add_argument("--size", default="tiny", choices=list(C.SIZES))
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per process")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--repeats", type=int, default=20, help="timed forwards, caches per process"
    )


def passthrough(x: Any) -> Any:
    return x


passthrough.active = False  # what a layer may ask of a point


def bypass_hook_points(model: Any) -> None:
    """Each HookPoint child, as its parent reads it in forward, becomes `passthrough`."""
    for module in list(model.modules()):
        for name, child in module._modules.items():
            if child._is_hook_point:
                object.__setattr__(module, name, passthrough)  # the instance attribute wins


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import glassllm
    from glassllm.interp import activation_patch

    C.prepare_worker(args)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = C.glassllm_trainer(Path(tmp), args.size)
        trainer.stats.start(None)
        model, hooked = trainer.model, args.worker == "glassllm"
        if not hooked:
            bypass_hook_points(model)
        C.time_calls(trainer.train_step, repeats=0, warmup=args.warmup)
        step = C.median(C.time_calls(trainer.train_step, repeats=args.steps))
    out: dict[str, dict[str, Any]] = {"train step": {"ms/step": step * 1e3}}
    model.eval()
    T = model.config.block_size
    ids = np.random.default_rng(0).integers(0, C.VOCAB_SIZE, size=(1, T))
    calls = [lambda: model(ids)] + [lambda: model.run_with_cache(ids)] * hooked
    with glassllm.no_grad():  # the forward and the cache alternately, after 3 warm-ups each
        times = [C.time_calls(f, 1, 3 * (r == 0))[0] for r in range(args.repeats) for f in calls]
    ms = [C.median(times[i :: len(calls)]) * 1e3 for i in range(len(calls))]
    out["forward"] = {"forward ms": ms[0]}
    if not hooked:
        return out
    out["forward"] |= {"run_with_cache ms": ms[1], "cache / forward": ms[1] / ms[0]}
    corrupted = np.where(np.arange(T) < 2, (ids + 1) % C.VOCAB_SIZE, ids)[0]
    patch = dict(point="resid_pre", index="pos", answer=1, wrong=2)
    sweep = lambda: activation_patch(model, ids[0], corrupted, **patch)
    seconds = C.time_calls(sweep, repeats=1, warmup=1)[0]
    return out | {"patching sweep": {"cells": model.config.n_layer * T, "sweep s": seconds}}


def parent(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    ratios = dict(ratios=["ms/step", "forward ms"])
    groups = C.summarise_groups(C.alternate(args, args.threads[0], flip=True), **ratios)
    config = C.model_config(args.size) | dict(batch_size=C.BATCH_SIZE, rounds=args.rounds)
    config |= dict(steps=args.steps, threads=args.threads[0])
    return {args.size: dict(config=config, group="measurement", groups=groups)}


C.run_as_script(__name__)

"""Milliseconds per training step: glassllm's Trainer vs PyTorch at equal threads, paired rounds.

    python bench/train_step.py                          # tiny size, threads 2 and 1, 5 rounds
    python bench/train_step.py --size tiny small mid --threads 2 --sides glassllm,torch,torch-manual
    python bench/train_step.py --arch llama --size tiny small mid --threads 2   # Llama-style

A step is ``Trainer.train_step`` (batch, scheduled learning rate, forward, backward, clip, AdamW);
PyTorch takes it in nanoGPT's model on the same data (common.torch_step); with ``--arch llama``
(train_step_llama.json) the model ``glassllm train --arch llama`` builds, against transformers'
``LlamaModel`` with its weights (bench/torch_gpt.py: TorchLlama). Sides: ``glassllm`` (the
Trainer's defaults: threads adapt to the load where its check allows, glassllm.app.thread_check),
``glassllm-numpy`` (without the ``fast`` extra's kernels), ``glassllm-plain`` (the loop README and
examples/ write: a plain ``loss.backward()``, no tuning call, so the engine's own allocator tuning),
``glassllm-fixed`` (set_adaptive(False): all threads throughout), ``glassllm-adapt`` /
``glassllm-adapt-blas`` (threads.set_adaptive(True): glassllm's workers; OpenBLAS's too, without
the check), ``glassllm-stats`` (writing stats.jsonl every ``--stats-interval`` steps; its cost: the
paired ratio column), ``torch`` (fused attention), ``torch-manual`` (attention written out).
Also: the step's matmul GFLOP/s against one large np.matmul, the "BLAS floor" (the step's matrix
products alone), and first a check that both models give the same loss and gradients.

``--neighbour``: each thread count also "busy", a spin loop running beside each side's process.

``--memory`` (memory.json): resident memory instead, one process per side: the peak of one step
after 3 warm-up ones over the RSS once the model was built, ``ru_maxrss``, and the growth over
``--steps`` steps and ``--forwards`` no_grad forwards from the 10th on.
"""

from __future__ import annotations

import argparse
import gc
import resource
import tempfile
from pathlib import Path
from typing import Any

import common as C
import numpy as np

import glassllm
from glassllm.data import get_batch
from glassllm.kernels import compiled
from glassllm.models.config import parameter_shapes
from glassllm.nn.utils import clip_grad_norm_

# "matmul" and "check": the parent's helpers, the GFLOP/s probe and the equivalence check.
SIDES = (
    "glassllm",
    "glassllm-numpy",
    "glassllm-plain",
    "glassllm-fixed",
    "glassllm-adapt",
    "glassllm-adapt-blas",
    "glassllm-stats",
    "torch",
    "torch-manual",
    "matmul",
    "check",
)
DEFAULT_SIDES = ("glassllm", "torch")
MIB = 2**20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(threads=[2, 1], rounds=5)
    parser.add_argument("--size", nargs="+", default=["tiny"], choices=list(C.SIZES))
    parser.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2", help="as in train")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per process")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--matmul-n", type=int, default=2048, help="n of the n³ GFLOP/s probe")
    parser.add_argument("--no-check", action="store_true", help="skip the loss/gradient check")
    parser.add_argument("--stats-interval", type=int, default=10, help="of glassllm-stats")
    parser.add_argument("--neighbour", action="store_true", help="also beside a busy core")
    parser.add_argument("--memory", action="store_true", help="resident memory, not time")
    parser.add_argument("--forwards", type=int, default=1000, help="no_grad forwards (--memory)")


def worker(args: argparse.Namespace) -> dict[str, Any]:
    size = args.size[0]
    if args.worker == "matmul":
        return matmul_rates(C.gpt_config(size, args.arch), args.matmul_n)
    if args.worker != "glassllm-plain":  # it leaves the allocator to the engine, as a script does
        C.prepare_worker(args)  # also the check side's allocator: its figures are not times
    with tempfile.TemporaryDirectory() as tmp:
        if args.worker == "glassllm-numpy":  # without the compiled kernels of the fast extra
            compiled.set_enabled(False)
        if "adapt" in args.worker or args.worker == "glassllm-fixed":  # else the Trainer's default
            glassllm.threads.set_adaptive("adapt" in args.worker, blas="blas" in args.worker)
        interval = args.stats_interval if args.worker == "glassllm-stats" else 0
        trainer = C.glassllm_trainer(Path(tmp), size, stats_interval=interval, arch=args.arch)
        trainer.stats.start(None)  # its file in the out_dir the Trainer made
        if args.worker == "check":
            return equivalence(trainer)
        if args.worker.startswith("torch"):
            attention = "manual" if args.worker == "torch-manual" else "sdpa"
            model, step = C.torch_step(trainer, attention=attention)
        else:
            compiled.load()  # numba's runtime, when installed, is counted with the model
            model, step = trainer.model, trainer.train_step
            if args.worker == "glassllm-plain":
                step = plain_step(trainer)
        if args.memory:
            return memory_use(args, trainer, model, step)
        C.time_calls(step, repeats=0, warmup=args.warmup)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        times = C.time_calls(step, repeats=args.steps)
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / args.steps
        return {"ms/step": C.median(times) * 1e3, "minor faults/step": faults}


def plain_step(trainer: Any) -> Any:
    """The Trainer's batches, schedule and clip in a user's loop: ``loss.backward()`` with its
    defaults (graph and intermediate gradients kept, until the next step rebinds the names)."""
    cfg, model, optimizer, kept = trainer.config, trainer.model, trainer.optimizer, []

    def step() -> float:
        for group in optimizer.param_groups:
            group["lr"] = trainer.learning_rate(trainer.iteration)
        x, y = get_batch(trainer.corpus.train, cfg.block_size, cfg.batch_size, trainer.batch_rng)
        logits, loss = model(x, y)
        kept[:] = logits, loss  # a loop's names hold the last graph while the next forward runs
        loss.backward()
        clip_grad_norm_(trainer.parameters, cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad()
        trainer.iteration += 1
        return float(loss.data)

    return step


def memory_use(args: argparse.Namespace, trainer: Any, model: Any, step: Any) -> dict[str, Any]:
    """``--memory``'s worker: resident MiB once the model is built, step peak, growth."""
    if args.steps < 10 or args.forwards < 10:
        raise SystemExit("--memory: --steps and --forwards must be at least 10 (growth from 10th)")
    cfg = trainer.config
    batch = get_batch(trainer.corpus.val, cfg.block_size, cfg.batch_size, trainer.batch_rng)
    no_grad = glassllm.no_grad
    if args.worker.startswith("torch"):
        import torch

        del trainer.model, trainer.optimizer  # only the PyTorch model stays resident
        no_grad, batch = torch.no_grad, tuple(torch.from_numpy(a.copy()) for a in batch)
    gc.collect()
    rss_model = C.rss_bytes()
    C.time_calls(step, repeats=0, warmup=3)
    step_peak = C.high_water_bytes(during=step)
    steps, forwards = [], []
    for _ in range(args.steps):
        step()
        steps.append(C.rss_bytes())
    with no_grad():
        for _ in range(args.forwards):
            model(*batch)
            forwards.append(C.rss_bytes())
    live = sum(issubclass(type(o), glassllm.Tensor) for o in gc.get_objects())
    out = {
        "RSS, model built (MiB)": rss_model / MIB,
        "step peak (MiB)": step_peak / MIB,
        "step peak over model (MiB)": (step_peak - rss_model) / MIB,
        "ru_maxrss (MiB)": C.peak_rss_bytes() / MIB,
        "growth over steps from the 10th (MiB)": (steps[-1] - steps[9]) / MIB,
        "growth over no_grad forwards from the 10th (MiB)": (forwards[-1] - forwards[9]) / MIB,
        "gc.collect() freed": gc.collect(),
    }
    return out if args.worker.startswith("torch") else out | {"live Tensor objects": live}


def equivalence(trainer: Any) -> dict[str, Any]:
    """Same weights, same batch: the loss and every gradient must agree (float32 tolerance)."""
    import torch
    from torch_gpt import torch_state, twin

    cfg, model = trainer.config, trainer.model
    reference = twin(model)
    x, y = get_batch(trainer.corpus.train, cfg.block_size, cfg.batch_size, trainer.batch_rng)
    _, loss = model(x, y)
    loss.backward()
    _, ref_loss = reference(torch.from_numpy(x.copy()), torch.from_numpy(y.copy()))
    ref_loss.backward()
    theirs = {name: p.grad.numpy() for name, p in reference.named_parameters()}
    ours = torch_state(model, {name: p.grad for name, p in model.named_parameters()})
    worst = max(float(np.abs(g - theirs[n]).max() / (np.abs(theirs[n]).max() or 1.0))
                for n, g in ours.items())  # fmt: skip
    mine, other = float(loss.data), float(ref_loss.detach())
    if abs(mine - other) > 1e-4 or worst > 1e-3:
        raise AssertionError(f"loss {mine} vs {other}, worst gradient difference {worst:.1e}")
    return {"loss_glassllm": mine, "loss_torch": other, "grad_max_rel_diff": worst}


def matmul_rates(config: Any, n: int) -> dict[str, float]:
    """GFLOP/s of one n³ float32 np.matmul, and the milliseconds of the step's matrix products
    alone (forward and backward, transposes folded into the shapes, operands preallocated)."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    rate = 2.0 * n**3 / min(C.time_calls(lambda: np.matmul(a, b), repeats=7, warmup=2)) / 1e9
    N, T, E, V = C.BATCH_SIZE * config.block_size, config.block_size, config.n_embd, 65
    BH, hs = C.BATCH_SIZE * config.n_head, config.head_size

    def linear(i: int, o: int) -> list:  # y = x W, dx = g Wᵀ, dW = xᵀ g
        return [((N, i), (i, o)), ((N, o), (o, i)), ((i, N), (N, o))]

    # attention: q kᵀ, P v; backward dP = dy vᵀ, dv = Pᵀ dy, dq = dS k, dk = dSᵀ q
    attention = [((BH, T, hs), (BH, hs, T)), ((BH, T, T), (BH, T, hs))] * 3
    layer = [p for shape in block_matrices(config) for p in linear(*shape)] + attention
    shapes = layer * config.n_layer + linear(E, V)
    operands = [tuple(rng.standard_normal(s, dtype=np.float32) for s in pair) for pair in shapes]
    floor = C.median(C.time_calls(lambda: [a @ b for a, b in operands], repeats=30, warmup=3))
    return {"np.matmul n³ GFLOP/s": rate, "BLAS floor ms": floor * 1e3}


def block_matrices(config: Any) -> list[tuple[int, int]]:
    """(in, out) of each Linear weight of a block (GPT-2: qkv, projection, MLP up and down)."""
    shapes = parameter_shapes(config).items()
    return [shape for name, shape in shapes if name.startswith("blocks.0.") and len(shape) == 2]


def matmul_flops_per_step(config: Any, batch_size: int) -> float:
    """Matrix-multiply FLOPs of one training step: per token and layer 2 per weight of the
    block's Linear layers (GPT-2: 24·E²) + 4·T·E (scores and weighted sum over the full T x T
    square); head 2·E·V; backward 2x."""
    T, E, L, V = config.block_size, config.n_embd, config.n_layer, C.VOCAB_SIZE
    weights = sum(i * o for i, o in block_matrices(config))
    return 3.0 * batch_size * T * (L * (2 * weights + 4 * T * E) + 2 * E * V)


def parent(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    if args.memory:  # one process per side, stored in memory.json
        size, args.result_name = args.size[0], "memory"
        rounds = {side: [C.run_side(args, side, args.threads[0])] for side in args.sides}
        config = C.model_config(size) | dict(batch_size=C.BATCH_SIZE, steps=args.steps)
        run = dict(config=config | {"forwards": args.forwards})
        sides = C.summarise(rounds, ratios=["step peak over model (MiB)"])
        return {size: run | {"group": "threads", "groups": {str(args.threads[0]): sides}}}
    runs, llama = {}, args.arch == "llama"
    args.result_name = "train_step_llama" if llama else "train_step"
    for size in args.size:
        config = {**C.model_config(size), "batch_size": C.BATCH_SIZE}
        gpt_config = C.gpt_config(size, args.arch)
        if llama:
            config |= dict(arch="llama", n_kv_head=gpt_config.n_kv_head, mlp=gpt_config.mlp_hidden)
        flops = matmul_flops_per_step(gpt_config, C.BATCH_SIZE)
        config |= dict(rounds=args.rounds, steps=args.steps, matmul_gflop_per_step=flops / 1e9)
        run = runs[size] = dict(config=config, group="threads", groups={}, notes=[])
        if not args.no_check and any(s.startswith("torch") for s in args.sides):
            eq = C.run_side(args, "check", 1, "--size", size)
            run["notes"].append(
                f"{size}, same weights and batch: loss {eq['loss_glassllm']:.6f} (glassllm) vs "
                f"{eq['loss_torch']:.6f} (torch), worst gradient difference "
                f"{eq['grad_max_rel_diff']:.1e} of the largest entry."
            )
        for threads, busy in [(t, b) for t in args.threads for b in (0, 1)[: 1 + args.neighbour]]:
            args.busy = busy
            print(f"{size}, {threads} threads{', busy' * args.busy}", flush=True)
            probe = [C.run_side(args, "matmul", threads, "--size", size)]
            results = C.alternate(args, threads, "--size", size)
            probe.append(C.run_side(args, "matmul", threads, "--size", size))
            sides = C.summarise(results, ratios=["ms/step"])
            for side, figures in sides.items():
                figures["GFLOP/s"] = flops / (figures["ms/step"] / 1e3) / 1e9
                figures["ms/step, per round"] = [r["ms/step"] for r in results[side]]
            rate, floor = "np.matmul n³ GFLOP/s", "BLAS floor ms"  # the best of the probes
            sides["matmul"] = {
                rate: max(r[rate] for r in probe),
                floor: min(r[floor] for r in probe),
            }
            run["groups"][f"{threads}{', busy' * args.busy}"] = sides
    return runs


C.run_as_script(__name__)

"""Where a glassllm training step spends its time: per op, forward and backward, plus the engine.

    OPENBLAS_NUM_THREADS=1 python bench/profile_step.py                 # per-op table
    OPENBLAS_NUM_THREADS=1 python bench/profile_step.py --cprofile 25   # + cProfile top 25
    OPENBLAS_NUM_THREADS=1 python bench/profile_step.py --pyinstrument  # if installed

Set the thread count in the environment (the profile is of one process; no PyTorch here).

Per-op accounting, without editing the library: every ``Tensor.from_op`` call is intercepted to
name the op (the function that called it) and to wrap its VJP in a timer, so the backward time of
each op is exact; forward time is taken by wrapping every public function of
``glassllm.functional`` and the Tensor operator methods (an op's forward time includes what it
calls, e.g. its own ``from_op``). "engine" is ``run_backward`` minus the VJPs it called:
topological sort, gradient bookkeeping, the additions of contributions from shared paths and the
copies into leaves. The wrappers add a few microseconds per op, so the table's total is a little
above an unprofiled step's.
"""

from __future__ import annotations

import argparse
import collections
import functools
import sys
import time

import _harness as H


def instrument() -> tuple[dict, dict, dict]:
    """Patch glassllm for per-op timing; returns (forward_s, backward_s, calls) dicts by op name."""
    import glassllm.autograd as autograd
    import glassllm.functional as F
    from glassllm.tensor import Tensor

    forward_s: dict[str, float] = collections.defaultdict(float)
    backward_s: dict[str, float] = collections.defaultdict(float)
    calls: dict[str, int] = collections.defaultdict(int)
    depth = [0]

    def timed(name, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if depth[0]:  # count only the outermost op (F.layer_norm's own Tensor ops are its cost)
                return fn(*args, **kwargs)
            depth[0] += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
                forward_s[name] += time.perf_counter() - start
                calls[name] += 1

        return wrapper

    for name in F.__all__:
        setattr(F, name, timed(f"F.{name}", getattr(F, name)))
    for name in (
        "__add__",
        "__radd__",
        "__sub__",
        "__rsub__",
        "__mul__",
        "__rmul__",
        "__truediv__",
        "__neg__",
        "__matmul__",
        "__pow__",
        "sum",
        "mean",
        "max",
        "var",
        "reshape",
        "transpose",
        "__getitem__",
        "exp",
        "log",
        "sqrt",
        "tanh",
    ):
        if hasattr(Tensor, name):
            setattr(Tensor, name, timed(f"Tensor.{name}", getattr(Tensor, name)))

    original_from_op = Tensor.from_op.__func__

    def from_op(cls, data, parents, vjp):
        frame = sys._getframe(1)
        while frame.f_code.co_name in ("wrapper",):  # skip our own wrappers
            frame = frame.f_back
        name = frame.f_code.co_name
        module = frame.f_globals.get("__name__", "")
        label = f"F.{name}" if module.startswith("glassllm.functional") else f"Tensor.{name}"

        def timed_vjp(grad):
            start = time.perf_counter()
            try:
                return vjp(grad)
            finally:
                backward_s[label] += time.perf_counter() - start

        return original_from_op(cls, data, parents, timed_vjp)

    Tensor.from_op = classmethod(from_op)

    original_run_backward = autograd.run_backward
    original_topo = autograd.topological_order

    def topological_order(root):
        start = time.perf_counter()
        try:
            return original_topo(root)
        finally:
            backward_s["engine: topological_order"] += time.perf_counter() - start

    def run_backward(root, seed):
        vjp_before = sum(v for k, v in backward_s.items() if not k.startswith("engine"))
        topo_before = backward_s["engine: topological_order"]
        start = time.perf_counter()
        original_run_backward(root, seed)
        total = time.perf_counter() - start
        vjp = sum(v for k, v in backward_s.items() if not k.startswith("engine")) - vjp_before
        topo = backward_s["engine: topological_order"] - topo_before
        backward_s["engine: bookkeeping (accumulate, copies, checks)"] += total - vjp - topo

    autograd.run_backward = run_backward
    autograd.topological_order = topological_order
    return forward_s, backward_s, calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--cprofile", type=int, default=0, metavar="N", help="print cProfile's top N"
    )
    parser.add_argument("--pyinstrument", action="store_true")
    parser.add_argument(
        "--untuned",
        action="store_true",
        help="keep glibc's allocator defaults (the glassllm command tunes them)",
    )
    args = parser.parse_args(argv)

    import _steps

    config = dict(H.NANOGPT_CPU)
    batches = _steps.random_batches(
        args.warmup + args.steps, H.BATCH_SIZE, config["block_size"], config["vocab_size"]
    )
    tuned = _steps.tune_allocator(not args.untuned)
    print(f"allocator tuned: {tuned}")
    forward_s, backward_s, calls = instrument()
    _, _, step = _steps.glassllm_step(config)
    for x, y in batches[: args.warmup]:
        step(x, y)
    for d in (forward_s, backward_s, calls):
        d.clear()
    phases = collections.defaultdict(float)
    for x, y in batches[args.warmup :]:
        for k, v in step(x, y).items():
            if k != "loss":
                phases[k] += v
    n = args.steps
    print(
        "phases, ms per step (instrumented): "
        + ", ".join(f"{k} {v / n * 1e3:.1f}" for k, v in phases.items())
        + f"; total {sum(phases.values()) / n * 1e3:.1f}"
    )
    names = sorted(set(forward_s) | set(backward_s), key=lambda k: -(forward_s[k] + backward_s[k]))
    rows = [
        [
            k,
            calls.get(k, 0) / n,
            forward_s[k] / n * 1e3,
            backward_s[k] / n * 1e3,
            (forward_s[k] + backward_s[k]) / n * 1e3,
        ]
        for k in names
    ]
    H.print_table(["op", "calls/step", "forward ms", "backward ms", "total ms"], rows)
    outside = phases["forward"] - sum(forward_s.values())
    print(
        f"forward time outside the ops above (module __call__, checks, Python glue): "
        f"{outside / n * 1e3:.1f} ms per step"
    )

    if args.cprofile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        for x, y in batches[args.warmup :]:
            step(x, y)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.cprofile)
    if args.pyinstrument:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)
        profiler.start()
        for x, y in batches[args.warmup :]:
            step(x, y)
        profiler.stop()
        print(profiler.output_text(unicode=False, color=False, show_all=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

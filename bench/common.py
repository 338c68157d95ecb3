"""What the benchmarks in bench/ share: the entry point, model sizes, both sides' training step,
the measuring tools and the result files.

Every measurement is a fresh process (``<script> <options> --worker SIDE --threads N``, thread
count set in the environment first): OpenBLAS's spinning threads slow a PyTorch step that follows
in the same process 2-3x, and NumPy fixes its BLAS thread count at import. Machine speed drifts
over minutes, so the headline is the *paired* ratio: the median over alternating rounds of the
per-round ratio. A worker prints one line ``BENCH_JSON {...}``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib.metadata
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from importlib.util import find_spec
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
JSON_MARKER = "BENCH_JSON "
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
BLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")  # shown in the machine line when set
sys.path.insert(1, str(REPO_DIR))  # this checkout's glassllm, installed or not

# Model sizes, all with nanoGPT's character vocabulary of tiny Shakespeare and batch 12. "tiny" is
# nanoGPT's shakespeare_char CPU configuration, "mid" its GPU one; "micro" is for smoke tests.
VOCAB_SIZE = 65
BATCH_SIZE = 12
SIZES: dict[str, dict[str, int]] = {
    "micro": dict(n_layer=1, n_head=2, n_embd=16, block_size=16),
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, block_size=64),
    "small": dict(n_layer=4, n_head=4, n_embd=256, block_size=128),
    "mid": dict(n_layer=6, n_head=6, n_embd=384, block_size=256),
}


def model_config(size: str, **overrides: int) -> dict[str, int]:
    """GPT configuration fields of a size: ``{vocab_size, block_size, n_layer, n_head, n_embd}``."""
    return {"vocab_size": VOCAB_SIZE, **SIZES[size], **overrides}


def gpt_config(size: str, arch: str = "gpt2") -> Any:
    """The ``GPTConfig`` that ``glassllm train --arch ARCH`` builds at ``size``."""
    from glassllm.models import GPTConfig, llama_config

    return (llama_config if arch == "llama" else GPTConfig)(**model_config(size), bias=False)


# ----------------------------------------------------------------------------- the entry point


def main(bench: ModuleType, argv: Sequence[str] | None = None) -> int:
    """The command line of module ``bench``: its ``SIDES``, ``DEFAULT_SIDES``, ``add_arguments``,
    ``worker(args)`` (a payload) and ``parent(args)``
    (``{run key: run}``, each run in the one shape that :func:`render` reads)."""
    name = Path(bench.__file__).stem
    parser = argparse.ArgumentParser(
        prog=f"bench/{name}.py",
        description=bench.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--threads", type=int, nargs="+", default=[2], help="BLAS/torch threads")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the sides")
    sides = ",".join(bench.DEFAULT_SIDES)
    parser.add_argument("--sides", default=sides, help=", ".join(bench.SIDES))
    parser.add_argument("--out", type=Path, metavar="JSON", help="store the runs here")
    stored = f"store the runs in bench/results/{name}.json, then regenerate bench/RESULTS.md"
    parser.add_argument("--write-results", action="store_true", help=stored)
    parser.add_argument("--worker", choices=bench.SIDES, help=argparse.SUPPRESS)
    # Smoke tests: the workers run in this process, so without their own thread counts.
    parser.add_argument("--inline", action="store_true", help=argparse.SUPPRESS)
    bench.add_arguments(parser)

    def parse(argv: Sequence[str] | None) -> argparse.Namespace:
        args = parser.parse_args(argv)
        args.sides = args.sides.split(",")
        if not set(args.sides) <= set(bench.SIDES) or args.rounds < 1:
            parser.error(f"--sides takes a comma list of {', '.join(bench.SIDES)}; --rounds >= 1")
        args.argv = list(sys.argv[1:] if argv is None else argv)
        if args.worker:
            args.threads = args.threads[0]
        return args

    args = parse(argv)
    if args.worker:
        print(JSON_MARKER + json.dumps(bench.worker(args)), flush=True)
        return 0
    args.script = Path(bench.__file__).resolve()
    args.run_inline = lambda argv: json.loads(json.dumps(bench.worker(parse(argv))))
    machine = machine_info()
    runs = {key: {"machine": machine, **payload} for key, payload in bench.parent(args).items()}
    runs = json.loads(json.dumps(runs))  # as a result file gives them back
    # why: a quick one-side check must not replace a full run's entries in the result file.
    stored = getattr(args, "result_name", name)  # a mode may store in another file
    out = args.out or (RESULTS_DIR / f"{stored}.json" if args.write_results else None)
    if out is not None:  # merged into the file's other runs
        before = json.loads(out.read_text())["runs"] if out.is_file() else {}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"runs": before | runs}, indent=2) + "\n")
    stored = f"wrote {out} {list(runs)}" if out else "(not stored: --write-results)"
    print(render(runs), stored, sep="\n\n")
    if args.write_results:
        report()
    return 0


def run_as_script(module_name: str) -> None:
    """A script's last line: its command line, when it runs as ``python bench/<script>.py``."""
    if module_name == "__main__":
        sys.exit(main(sys.modules[module_name]))


def run_side(args: argparse.Namespace, side: str, threads: int, *extra: str) -> dict[str, Any]:
    """One worker process for ``side``: the parent's own options plus ``--worker side``."""
    options = [*args.argv, *extra, "--worker", side, "--threads", str(threads)]
    if args.inline:
        return args.run_inline(options)
    command = [sys.executable, str(args.script), *options]
    env = dict(os.environ, PYTHONHASHSEED="0", **dict.fromkeys(THREAD_VARIABLES, str(threads)))
    env.setdefault("OPENBLAS_THREAD_TIMEOUT", "16")  # what `import glassllm` sets before NumPy
    # a busy neighbour (args.busy): a Python spin loop in its own process, not pinned to a core
    spin = [sys.executable, "-c", "while True: pass"]
    neighbour = subprocess.Popen(spin) if getattr(args, "busy", False) else None
    try:
        done = subprocess.run(command, env=env, cwd=REPO_DIR, capture_output=True, text=True)
    finally:
        neighbour and (neighbour.kill(), neighbour.wait())
    reports = [line for line in done.stdout.splitlines() if line.startswith(JSON_MARKER)]
    if done.returncode != 0 or not reports:
        raise RuntimeError(
            f"worker failed (exit {done.returncode}): {' '.join(command)}\n"
            f"--- stdout ---\n{done.stdout[-3000:]}\n--- stderr ---\n{done.stderr[-5000:]}"
        )
    return json.loads(reports[-1][len(JSON_MARKER) :])


def alternate(
    args: argparse.Namespace, threads: int, *extra: str, flip: bool = False
) -> dict[str, list[dict]]:
    """``{side: [payload per round]}``: each side once per round (order reversed every other round
    with ``flip``); ``extra``: more worker options."""
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in args.sides}
    for r in range(args.rounds):
        for side in args.sides[::-1] if flip and r % 2 else args.sides:
            results[side].append(run_side(args, side, threads, *extra))
            shown = {k: v for k, v in results[side][-1].items() if isinstance(v, float)}
            print(f"  round {r + 1}/{args.rounds} {side}: {fmt_dict(shown)}", flush=True)
    return results


def prepare_worker(args: argparse.Namespace) -> None:
    """A torch side's thread count (torch*, transformers, nanogpt), or for any other side the
    allocator tuned as ``glassllm train`` tunes it."""
    if args.worker.startswith(("torch", "transformers", "nanogpt")):
        set_torch_threads(args.threads)
    else:
        from glassllm.app.allocator import tune_allocator

        tune_allocator()


def set_torch_threads(threads: int) -> None:
    """Worker side: PyTorch's intra-op pool to ``threads``, inter-op to 1 (one stream of ops)."""
    import torch

    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # already set (workers run inline by a smoke test)
        torch.set_num_interop_threads(1)


# ----------------------------------------------------------------------------- training steps


def glassllm_trainer(workdir: Path, size: str, seed: int = 0, **overrides: Any) -> Any:
    """The shipped Trainer on ``size`` over uniform random text (a step's time does not depend on
    it) under ``workdir``."""
    from glassllm.app.train import TrainConfig, Trainer

    workdir.mkdir(parents=True, exist_ok=True)
    if "data" not in overrides:
        alphabet = np.array([chr(48 + i) for i in range(VOCAB_SIZE)])
        corpus = workdir / "random.txt"
        corpus.write_text("".join(np.random.default_rng(seed).choice(alphabet, 200_000)))
        overrides["data"] = str(corpus)
    config = {**SIZES[size], "batch_size": BATCH_SIZE, "seed": seed, "sample_tokens": 0}
    # a bench always starts afresh, also in a workdir an earlier run left
    return Trainer(TrainConfig(**config, out_dir=str(workdir / "out"), **overrides), overwrite=True)


def torch_step(
    trainer: Any, model: Any = None, next_batch: Callable[[], tuple] | None = None, **choices: Any
) -> tuple[Any, Callable[[], float]]:
    """``(model, step)``: ``Trainer.train_step`` in PyTorch, on the twin of the trainer's model
    (``choices``: ``attention``, ``gelu``), its batches and schedule; step() returns the loss."""
    import torch
    from torch_gpt import twin

    from glassllm.data import get_batch

    cfg = trainer.config
    model = twin(trainer.model, **choices) if model is None else model
    optimizer = model.configure_optimizer(cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2))
    batches = (trainer.corpus.train, cfg.block_size, cfg.batch_size, trainer.batch_rng)
    next_batch = next_batch or (lambda: get_batch(*batches))
    iteration = [trainer.iteration]

    def step() -> float:
        for group in optimizer.param_groups:
            group["lr"] = trainer.learning_rate(iteration[0])
        x, y = (torch.from_numpy(np.ascontiguousarray(a)) for a in next_batch())
        _, loss = model(x, y)
        loss.backward()
        if cfg.grad_clip > 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        iteration[0] += 1
        return float(loss.detach())

    return model, step


# ----------------------------------------------------------------------------- measuring


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def summarise(
    rounds: dict[str, list[dict]], baseline: str = "glassllm", ratios: Sequence[str] = ()
) -> dict[str, dict[str, Any]]:
    """A run's group, ``{side: {figure: value}}``, from ``{side: [payload per round]}``: a number
    that differs between rounds is its median, anything else the first round's; on each side but
    ``baseline``, after each figure in ``ratios``, the paired ratio baseline / side."""
    sides = {}
    for side, payloads in rounds.items():
        sides[side] = {}
        for figure in payloads[0]:
            v = [p[figure] for p in payloads]
            numbers = isinstance(v[0], (int, float)) and len(set(v)) > 1
            sides[side][figure] = median(v) if numbers else v[0]
            ours = [p.get(figure) for p in rounds.get(baseline, [])]
            if figure in ratios and side != baseline and ours and all(v):  # no 0 to divide by
                # the median of per-round ratios: drift between rounds cancels within each pair
                ratio = median([a / b for a, b in zip(ours, v, strict=True)])
                sides[side][f"{baseline} / side, {figure}"] = ratio
    return sides


def summarise_groups(rounds: dict[str, list[dict]], **options: Any) -> dict[str, dict]:
    """:func:`summarise` for workers that report ``{group: payload}``: ``{group: {side: ...}}``,
    each group over the sides that reported it."""
    groups = dict.fromkeys(group for payloads in rounds.values() for group in payloads[0])
    sides_of = lambda g: {s: [p[g] for p in ps] for s, ps in rounds.items() if g in ps[0]}
    return {group: summarise(sides_of(group), **options) for group in groups}


def time_calls(
    fn: Callable[[], Any], repeats: int, warmup: int = 0, before: Callable[[], Any] | None = None
) -> list[float]:
    """Wall-clock seconds of each of ``repeats`` calls of fn, after ``warmup`` untimed calls;
    ``before()``, when given, runs untimed ahead of each timed call."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def rss_bytes() -> int:
    """Resident set size now (/proc/self/statm, second field, in pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """Largest resident set size so far (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def high_water_bytes(during: Callable[[], Any] | None = None) -> int:
    """Peak resident set size of this address space (VmHWM; ``ru_maxrss`` survives exec); with
    ``during``, the peak while it runs (the lifetime peak where the kernel refuses the reset)."""
    if during is not None:
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")
        during()
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) * 1024


# ----------------------------------------------------------------------------- results


def report() -> None:
    """Regenerate bench/RESULTS.md's measured blocks from bench/results/<benchmark>.json: only the
    text between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->`` is replaced."""
    path = BENCH_DIR / "RESULTS.md"
    text = path.read_text()
    for result in sorted(RESULTS_DIR.glob("*.json")):
        body = render(json.loads(result.read_text())["runs"])
        block = rf"(?<=<!-- generated:{result.stem} -->\n).*?(?=<!-- /generated:{result.stem} -->)"
        text = re.sub(block, lambda _, body=body: body + "\n", text, flags=re.S)
    path.write_text(text)
    print(f"updated {path}")


def machine_info() -> dict[str, Any]:
    """CPU, cores, Python/NumPy/BLAS/PyTorch versions and the glassllm commit."""
    cpu, flags = platform.processor() or "unknown", set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
        elif line.startswith("flags") and not flags:
            flags = set(line.split(":", 1)[1].split())
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    blas_text = f"{blas.get('name')} {blas.get('version')}"
    if "openblas configuration" in blas:
        blas_text += f" ({blas['openblas configuration']})"
    core = openblas_core()
    if core:  # the build's string names the build machine's core type, not the one running here
        blas_text += f", running its {core} kernels"
    # why: an environment can force OpenBLAS's kernels (some machine images pin Haswell's, which
    # on an AVX-512 CPU run sgemm at ~0.55x the rate of the kernels OpenBLAS picks itself)
    forced = [f"{name}={os.environ[name]}" for name in BLAS_OVERRIDES if name in os.environ]
    if forced:
        blas_text += f", set in the environment: {' '.join(forced)}"
    torch_version = importlib.metadata.version("torch") if find_spec("torch") else "not installed"
    git = ["git", "rev-parse", "--short", "HEAD"]
    commit = subprocess.run(git, cwd=REPO_DIR, capture_output=True, text=True).stdout.strip()
    simd = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16") if f in flags]
    return dict(
        cpu=cpu, simd=simd, logical_cpus=os.cpu_count(), usable_cpus=len(os.sched_getaffinity(0)),
        load_average=[round(x, 2) for x in os.getloadavg()], python=platform.python_version(),
        numpy=np.__version__, blas=blas_text, torch=torch_version,
        glassllm_commit=os.environ.get("BENCH_COMMIT") or commit or "unknown",
        idle=idle_settings(),
        date=_dt.datetime.now().isoformat(timespec="seconds"),
    )  # fmt: skip


def idle_settings() -> str:
    """The kernel's idle driver, with its guest halt polling when it is ``haltpoll`` (a virtual
    machine's: 0 ns means an idle vCPU halts at once, and waking it is an exit to the host)."""
    cpuidle = Path("/sys/devices/system/cpu/cpuidle/current_driver")
    driver = cpuidle.read_text().strip() if cpuidle.is_file() else "unknown"
    poll = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
    if driver == "haltpoll" and poll.is_file():
        driver += f" (guest_halt_poll_ns={poll.read_text().strip()})"
    return driver


def openblas_core() -> str | None:
    """The kernel set NumPy's OpenBLAS chose when it loaded (``openblas_get_corename``), or None
    where there is no OpenBLAS to ask."""
    import ctypes

    maps = Path("/proc/self/maps")
    if not maps.exists():  # not Linux
        return None
    paths = sorted({ln.split()[-1] for ln in maps.read_text().splitlines() if "openblas" in ln})
    for path in paths:
        lib = ctypes.CDLL(path)
        for name in ("scipy_openblas_get_corename64_", "openblas_get_corename64_",
                     "scipy_openblas_get_corename", "openblas_get_corename"):  # fmt: skip
            function = getattr(lib, name, None)
            if function is not None:
                function.restype = ctypes.c_char_p
                return function().decode()
    return None


def machine_line(m: dict[str, Any]) -> str:
    return (
        f"Machine: {m['cpu']} ({m['usable_cpus']} usable of {m['logical_cpus']} logical CPUs, "
        f"{'/'.join(m.get('simd', []))}), load average {m['load_average']} when written; Python "
        f"{m['python']}, NumPy {m['numpy']} with {m['blas']}, PyTorch {m['torch']}; glassllm "
        f"{m['glassllm_commit']}; {m['date']}."
    ) + (f" Idle: {m['idle']}." if m.get("idle") else "")


def fmt(value: Any, spec: str = "") -> str:
    if isinstance(value, list):
        return ", ".join(fmt(v, spec) for v in value)
    if isinstance(value, float) and spec:
        return format(value, spec)
    if isinstance(value, float):
        if value == 0 or 0.01 <= abs(value) < 1e5:
            return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
        return f"{value:.3e}"
    return str(value)


def fmt_dict(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={fmt(v)}" for k, v in values.items())


def render(runs: dict[str, Any]) -> str:
    """A result file as markdown. Every run has one shape: ``machine``, ``config`` (what it held
    fixed), ``group`` (the heading of its groups' keys: threads, size, op...), ``groups``
    (``{group: {side: {figure name: value}}}``), and may have ``formats`` (``{figure: format
    spec}``) and ``notes`` (sentences). Rendered: each machine and configuration once (naming its
    runs when there are several), one table of every run's rows with a column per figure that is
    a number, a word or a list of numbers (a table per kind of group), the notes."""
    several = len(runs) > 1
    keys = [(g, s) for run in runs.values() for g, sides in run["groups"].items() for s in sides]
    named = len(set(keys)) < len(keys)  # a run column where groups and sides do not tell them
    text = []
    lines_of = (lambda run: machine_line(run["machine"]), lambda run: fmt_dict(run["config"]) + ".")
    for line_of in lines_of:
        seen: dict[str, list[str]] = {}  # each line once, naming the runs it is true of
        for name, run in runs.items():
            seen.setdefault(line_of(run), []).append(name)
        text += [f"{', '.join(names)}: {line}" if several else line for line, names in seen.items()]
    for heading in dict.fromkeys(run["group"] for run in runs.values()):  # a table per kind
        names = [name for name, run in runs.items() if run["group"] == heading]
        columns = figure_names([sides for name in names for sides in runs[name]["groups"].values()])
        rows = []
        for name in names:
            formats = runs[name].get("formats", {})
            for group, sides in runs[name]["groups"].items():
                for side, figures in sides.items():
                    cells = [fmt(figures.get(f, "-"), formats.get(f, "")) for f in columns]
                    rows.append([name] * named + [group, side, *cells])
        header = ["run"] * named + [heading, "side", *columns]  # GitHub markdown, terminal-readable
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        text.append("\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]))
    return "\n\n".join(text + [note for run in runs.values() for note in run.get("notes", [])])


def figure_names(groups: list[dict[str, dict[str, Any]]]) -> list[str]:
    """A table's columns: every side's shown figures, each side's in its order."""
    columns: list[str] = []
    for figures in (figures for sides in groups for figures in sides.values()):
        at = len(columns)  # a side's new figure goes after the one before it, or last
        for name, value in figures.items():
            numbers = isinstance(value, list) and all(isinstance(v, (int, float)) for v in value)
            if isinstance(value, dict) or isinstance(value, list) and not numbers:
                continue  # a record or a list of them (the evaluations): in the file, not shown
            if name not in columns:
                columns.insert(at, name)
            at = columns.index(name) + 1
    return columns

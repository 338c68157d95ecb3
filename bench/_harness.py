"""Shared measuring machinery for the benchmarks in bench/.

Why the sides run in separate processes: OpenBLAS leaves a worker thread spinning for ~0.1 s after
each matrix product, which slows a PyTorch step that follows in the same process by 2-3x; and the
thread count of NumPy's BLAS is fixed when NumPy is imported. So every measurement is a fresh
``python bench/<script>.py --worker ...`` process whose environment sets the thread count before
anything is imported, and the two sides alternate (glassllm, torch, glassllm, torch, ...). Machine
speed drifts 10-25% over minutes on a shared box, so the headline number is the *paired* ratio:
the median over rounds of (glassllm / torch) within one round, taken seconds apart.

A worker prints one line ``BENCH_JSON {...}`` on stdout; the parent parses it.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
JSON_MARKER = "BENCH_JSON "

# The nanoGPT "I only have a macbook" shakespeare_char configuration.
NANOGPT_CPU = dict(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128)
BATCH_SIZE = 12

THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


# ----------------------------------------------------------------------------- statistics


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def paired_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """Median of per-round ratios: drift between rounds cancels within each pair."""
    return median([a / b for a, b in zip(numerators, denominators, strict=True)])


def time_calls(fn: Callable[[], Any], repeats: int, warmup: int = 0) -> list[float]:
    """Wall-clock seconds of each of ``repeats`` calls of fn, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


# ----------------------------------------------------------------------------- processes


def worker_env(threads: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker process: BLAS/OpenMP thread counts fixed before import."""
    env = dict(os.environ)
    for name in THREAD_VARIABLES:
        env[name] = str(threads)
    env["PYTHONHASHSEED"] = "0"
    if extra:
        env.update(extra)
    return env


def run_worker(
    script: Path,
    args: Sequence[str],
    threads: int,
    extra_env: dict[str, str] | None = None,
    timeout: float = 1800.0,
) -> dict[str, Any]:
    """Run ``python script --worker ... args`` in a fresh process; return its BENCH_JSON payload."""
    command = [sys.executable, str(script), *args]
    done = subprocess.run(
        command,
        env=worker_env(threads, extra_env),
        cwd=REPO_DIR,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    payload = None
    for line in done.stdout.splitlines():
        if line.startswith(JSON_MARKER):
            payload = json.loads(line[len(JSON_MARKER) :])
    if done.returncode != 0 or payload is None:
        raise RuntimeError(
            f"worker failed (exit {done.returncode}): {' '.join(command)}\n"
            f"--- stdout ---\n{done.stdout[-3000:]}\n--- stderr ---\n{done.stderr[-5000:]}"
        )
    return payload


def emit(payload: dict[str, Any]) -> None:
    """Worker side: hand the result to the parent."""
    print(JSON_MARKER + json.dumps(payload), flush=True)


def alternate(
    sides: dict[str, Callable[[], dict[str, Any]]],
    rounds: int,
    pause: float = 0.0,
    log: Callable[[str], None] | None = print,
) -> dict[str, list[dict[str, Any]]]:
    """Run each side once per round, in order, ``rounds`` times: {side: [result per round]}."""
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    for r in range(rounds):
        for name, run in sides.items():
            results[name].append(run())
            if log:
                log(f"  round {r + 1}/{rounds} {name}: {summary_line(results[name][-1])}")
            if pause:
                time.sleep(pause)
    return results


def summary_line(result: dict[str, Any]) -> str:
    keys = [k for k in ("median_ms", "tokens_per_s", "gflops") if k in result]
    return ", ".join(f"{k}={result[k]:.4g}" for k in keys) or str(result)[:80]


def set_torch_threads(threads: int) -> None:
    """Worker side: PyTorch's intra-op pool to ``threads``, inter-op to 1 (a training step is one
    stream of ops)."""
    import torch

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already started
        pass


# ----------------------------------------------------------------------------- memory


def rss_bytes() -> int:
    """Resident set size now (/proc/self/statm, second field, in pages)."""
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """Largest resident set size so far (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def page_faults() -> tuple[int, int]:
    """(minor, major) page faults of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_minflt, usage.ru_majflt


# ----------------------------------------------------------------------------- FLOPs


def gpt_matmul_flops_per_step(
    batch_size: int, block_size: int, n_layer: int, n_embd: int, vocab_size: int, **_: Any
) -> dict[str, float]:
    """Matrix-multiply FLOPs of one training step (multiply-add = 2 FLOPs).

    Per token and layer: qkv 2·E·3E, attention output projection 2·E·E, MLP 2·E·4E + 2·4E·E, i.e.
    24·E²; attention scores q·kᵀ and the weighted sum of values 2·T·E each, counted over the full
    T x T square because that is what a dense implementation computes (causal halves only the
    useful part). Head: 2·E·V per token. Backward is twice the forward (one product for the input
    gradient, one for the weight gradient), so a step is 3x forward.
    """
    T, E, L, V = block_size, n_embd, n_layer, vocab_size
    per_token = L * (24 * E * E + 4 * T * E) + 2 * E * V
    forward = batch_size * T * per_token
    return {"forward": float(forward), "step": float(3 * forward)}


def matmul_rate_gflops(n: int = 2048, repeats: int = 7) -> float:
    """Float32 GFLOP/s of one large np.matmul (n x n x n), best-of-repeats median-robust.

    Call in a worker whose thread count is already set.
    """
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty((n, n), dtype=np.float32)
    times = time_calls(lambda: np.matmul(a, b, out=out), repeats=repeats, warmup=2)
    return 2.0 * n**3 / min(times) / 1e9


# ----------------------------------------------------------------------------- machine


def machine_info() -> dict[str, Any]:
    """CPU, cores, Python/NumPy/BLAS/PyTorch versions and the glassllm commit."""
    import numpy as np

    cpu = platform.processor() or "unknown"
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        blas_text = f"{blas.get('name')} {blas.get('version')}"
        if "openblas configuration" in blas:
            blas_text += f" ({blas['openblas configuration']})"
    except Exception:  # noqa: BLE001 - show_config's layout differs across NumPy versions
        blas_text = "unknown"
    try:
        from importlib.metadata import version

        torch_version = version("torch")
    except Exception:  # noqa: BLE001
        torch_version = "not installed"
    commit = os.environ.get("BENCH_COMMIT", "")  # set where the tree travels without .git
    try:
        commit = (
            commit
            or subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                cwd=REPO_DIR,
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
        )
    except OSError:
        commit = "unknown"
    simd = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16") if f in flags]
    return {
        "cpu": cpu,
        "simd": simd,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": blas_text,
        "torch": torch_version,
        "glassllm_commit": commit,
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
    }


def write_json(name: str, payload: dict[str, Any]) -> Path:
    """bench/results/<name>.json with the machine description added."""
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    payload = {"machine": machine_info(), **payload}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-markdown table (also readable in a terminal); returns the text it printed."""
    cells = [[_fmt(c) for c in row] + [""] * (len(headers) - len(row)) for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)
    ]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=False)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += [
        "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + " |"
        for row in cells
    ]
    text = "\n".join(lines)
    print(text)
    return text


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value == 0 or 0.01 <= abs(value) < 1e5:
            return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
        return f"{value:.3e}"
    return str(value)

"""Regenerate the measured sections of bench/RESULTS.md from bench/results/*.json.

    python bench/report.py

Each benchmark writes its JSON (and calls this with --write-results). RESULTS.md keeps its
hand-written text (the profile, the recommendations); only the blocks between
``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->`` are replaced. A block whose JSON
does not exist yet says so.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from typing import Any

import _harness as H

RESULTS_MD = H.BENCH_DIR / "RESULTS.md"


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[H._fmt(c) for c in row] for row in rows]
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(out)


def machine_line(m: dict[str, Any]) -> str:
    return (
        f"{m['cpu']} ({m['usable_cpus']} usable of {m['logical_cpus']} logical CPUs, "
        f"{'/'.join(m.get('simd', []))}), load average {m['load_average']} when written; Python "
        f"{m['python']}, NumPy {m['numpy']} with {m['blas']}, PyTorch {m['torch']}; glassllm "
        f"{m['glassllm_commit']}; {m['date']}"
    )


def train_step(d: dict[str, Any]) -> str:
    rows = []
    for threads, e in d["by_threads"].items():
        g, t = e["sides"].get("glassllm", {}), e["sides"].get("torch", {})
        rows.append(
            [
                threads,
                g.get("median_ms", "-"),
                t.get("median_ms", "-"),
                e.get("ratio_paired", "-"),
                g.get("gflops", "-"),
                t.get("gflops", "-"),
                e["matmul_gflops"],
                e["floor_ms"],
            ]
        )
    phases = [
        [
            threads,
            side,
            v["median_ms"],
            *(v["phases_ms"][p] for p in ("forward", "backward", "clip", "optimizer")),
            v["minor_faults_per_step"],
        ]
        for threads, e in d["by_threads"].items()
        for side, v in e["sides"].items()
    ]
    eq = d.get("equivalence")
    lines = [
        f"Machine: {machine_line(d['machine'])}.",
        "",
        f"{d['rounds']} alternating rounds x {d['steps']} timed steps per process; matmul FLOPs "
        f"per step {d['flops_per_step']['step'] / 1e9:.3f} GFLOP."
        + (f" Extra glassllm environment: `{d['glassllm_env']}`." if d.get("glassllm_env") else ""),
        "",
    ]
    if eq:
        lines += [
            f"Same weights, same batch: loss {eq['loss_glassllm']:.6f} (glassllm) vs "
            f"{eq['loss_torch']:.6f} (torch), worst gradient difference "
            f"{eq['grad_max_rel_diff']:.1e} of the largest entry.",
            "",
        ]
    lines += [
        table(
            [
                "threads",
                "glassllm ms/step",
                "torch ms/step",
                "ratio glassllm/torch (paired)",
                "glassllm GFLOP/s",
                "torch GFLOP/s",
                "np.matmul 2048³ GFLOP/s",
                "BLAS floor ms (the step's matmuls alone)",
            ],
            rows,
        ),
        "",
        "Per side and phase (median ms) and minor page faults per step (`glassllm` calls "
        "`glassllm.allocator.tune_allocator()` first, as the `glassllm` command does; "
        "`glassllm-untuned` keeps glibc's defaults):",
        "",
        table(
            [
                "threads",
                "side",
                "step",
                "forward",
                "backward",
                "clip",
                "AdamW + zero_grad",
                "minor faults/step",
            ],
            phases,
        ),
    ]
    ratios = {
        t: e.get("ratio_per_round") for t, e in d["by_threads"].items() if e.get("ratio_per_round")
    }
    if ratios:
        lines += [
            "",
            "Per-round ratios: "
            + "; ".join(
                f"{t} threads " + ", ".join(f"{r:.2f}" for r in v) for t, v in ratios.items()
            )
            + ".",
        ]
    return "\n".join(lines)


def sample(d: dict[str, Any]) -> str:
    sides = ("glassllm-cache", "glassllm-nocache", "torch")
    rows = []
    for bs, by_side in d["tokens_per_s"].items():
        for regime in ("fill", "slide"):
            row = [bs, regime, *(by_side.get(s, {}).get(regime, "-") for s in sides)]
            both = "glassllm-cache" in by_side and "torch" in by_side
            row.append(
                by_side["glassllm-cache"][regime] / by_side["torch"][regime] if both else "-"
            )
            rows.append(row)
    return "\n".join(
        [
            f"Machine: {machine_line(d['machine'])}.",
            "",
            f"Batch 1, {d['threads']} threads, median of {d['rounds']} alternating rounds. "
            "*fill*: the first block_size - 1 tokens from a one-token prompt; *slide*: the next "
            "block_size tokens with the context cropped to block_size (learned positions shift, "
            "so the cache is refilled each token).",
            "",
            table(
                [
                    "block_size",
                    "regime",
                    "glassllm with cache tok/s",
                    "glassllm no cache tok/s",
                    "PyTorch nanoGPT (no cache) tok/s",
                    "cache / PyTorch",
                ],
                rows,
            ),
        ]
    )


def ops(d: dict[str, Any]) -> str:
    rows = []
    for name, e in d["ops"].items():
        fb = e.get("fwd_bwd_us", {})
        rows.append(
            [
                name,
                fb.get("glassllm", "-"),
                fb.get("torch", "-"),
                fb.get("ratio", "-"),
                e["fwd_us"]["glassllm"],
                e["fwd_us"]["torch"],
                e["fwd_us"]["ratio"],
            ]
        )
    return "\n".join(
        [
            f"Machine: {machine_line(d['machine'])}.",
            "",
            f"{d['threads']} thread(s), median of {d['rounds']} alternating rounds; "
            "microseconds per call.",
            "",
            table(
                [
                    "op",
                    "glassllm fwd+bwd µs",
                    "torch fwd+bwd µs",
                    "ratio",
                    "glassllm fwd µs",
                    "torch fwd µs",
                    "fwd ratio",
                ],
                rows,
            ),
        ]
    )


def memory(d: dict[str, Any]) -> str:
    rows = []
    for side, r in d["sides"].items():
        rows.append(
            [
                side,
                r["rss_model_built_mib"],
                r["step_peak_mib"],
                r["step_over_model_mib"],
                r["ru_maxrss_mib"],
                _trace(r["rss_steps_mib"], r["steps"]),
                r["steps_growth_mib"],
                _trace(r["rss_forwards_mib"], r["forwards"]),
                r["forwards_growth_mib"],
                r["gc_collected"],
            ]
        )
    first = next(iter(d["sides"].values()))
    lines = [
        f"Machine: {machine_line(d['machine'])}.",
        "",
        table(
            [
                "side",
                "RSS, model built (MiB)",
                "step peak (MiB)",
                "step peak over model (MiB)",
                "ru_maxrss (MiB)",
                f"RSS step 10 → {first['steps']}",
                "growth (MiB)",
                f"RSS no_grad fwd 10 → {first['forwards']}",
                "growth (MiB)",
                "gc.collect() freed",
            ],
            rows,
        ),
    ]
    if "step_over_model_ratio" in d:
        lines += [
            "",
            f"Training-step peak over the built model, glassllm/torch: "
            f"**{d['step_over_model_ratio']:.2f}x** (target <= 2x).",
        ]
    g = d["sides"].get("glassllm")
    if g and "live_tensors" in g:
        lines += [
            f"glassllm: {g['live_tensors']} live Tensor objects after the loops "
            f"({g['num_parameters']} of them parameters)."
        ]
    return "\n".join(lines)


def _trace(rss: dict[str, float], last: int) -> str:
    return f"{rss['10']:.1f} → {rss[str(last)]:.1f}"


def shakespeare(runs: list[dict[str, Any]]) -> str:
    """One row per run (bench/results/shakespeare*.json), the default run first."""
    rows = [
        [
            d.get("framework", "glassllm"),
            d["seed"],
            f"{d['final_train_loss_full']:.4f}",
            f"{d['final_val_loss_full']:.4f}",
            f"{d['evals'][-1]['val']:.4f}",
            "yes" if d["reached"] else "no",
            d["wall_s_training_loop"],
            d["ms_per_iter"],
            d["peak_rss_mib"],
            d["machine"]["cpu"],
        ]
        for d in runs
    ]
    first = runs[0]
    evals = ", ".join(f"{e['iter']}: {e['val']:.3f}" for e in first["evals"])
    return "\n".join(
        [
            f"{first['max_iters']} iterations each; target: val loss over the whole split <= "
            f"{first['target_val_loss']}. First run: {machine_line(first['machine'])}.",
            "",
            table(
                [
                    "framework",
                    "seed",
                    "train loss (whole split)",
                    "val loss (whole split)",
                    "val, 20-batch estimate",
                    "reached",
                    "training loop s",
                    "ms/iter",
                    "peak RSS MiB",
                    "CPU",
                ],
                rows,
            ),
            "",
            f"First run's val loss, 20-batch estimate during training (iteration: loss): {evals}.",
        ]
    )


# section name -> (JSON file names or a glob under bench/results/, renderer, script to run)
SECTIONS: dict[str, tuple[str, Callable[[Any], str], str]] = {
    "train_step": ("train_step", train_step, "train_step.py"),
    "train_step_local": ("train_step_local", train_step, "train_step.py --out train_step_local"),
    "sample": ("sample", sample, "sample.py"),
    "sample_local": (
        "sample_local",
        sample,
        "sample.py, then rename the JSON to sample_local.json",
    ),
    "ops": ("ops", ops, "ops.py"),
    "ops_local": ("ops_local", ops, "ops.py, then rename the JSON to ops_local.json"),
    "memory": ("memory", memory, "memory.py"),
    "shakespeare": ("shakespeare*", shakespeare, "shakespeare.py"),
}


def render(name: str) -> str:
    pattern, fn, script = SECTIONS[name]
    paths = sorted(
        H.RESULTS_DIR.glob(f"{pattern}.json"), key=lambda p: (p.stem != pattern.rstrip("*"), p.stem)
    )
    if not paths:
        return f"_Not measured yet: run `python bench/{script}`._"
    loaded = [json.loads(p.read_text()) for p in paths]
    return fn(loaded if "*" in pattern else loaded[0])


def main(argv: list[str] | None = None) -> int:
    text = (
        RESULTS_MD.read_text()
        if RESULTS_MD.exists()
        else "\n\n".join(
            f"## {name}\n\n<!-- generated:{name} -->\n<!-- /generated:{name} -->"
            for name in SECTIONS
        )
    )
    for name in SECTIONS:
        pattern = re.compile(rf"(<!-- generated:{name} -->\n).*?(<!-- /generated:{name} -->)", re.S)
        body = render(name)
        text = pattern.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
    RESULTS_MD.write_text(text)
    print(f"updated {RESULTS_MD}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Regenerate the measured blocks of bench/RESULTS.md from bench/results/<benchmark>.json.

    python bench/report.py

Each benchmark stores its runs in its result file (and calls this with --write-results).
RESULTS.md keeps its hand-written text; only the blocks between ``<!-- generated:NAME -->`` and
``<!-- /generated:NAME -->`` are replaced, each from results/NAME.json.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from typing import Any

import common as C
import memory
import ops
import sample
import train_step

RESULTS_MD = C.BENCH_DIR / "RESULTS.md"
Runs = dict[str, dict[str, Any]]


def machine_line(m: dict[str, Any]) -> str:
    return (
        f"Machine: {m['cpu']} ({m['usable_cpus']} usable of {m['logical_cpus']} logical CPUs, "
        f"{'/'.join(m.get('simd', []))}), load average {m['load_average']} when written; Python "
        f"{m['python']}, NumPy {m['numpy']} with {m['blas']}, PyTorch {m['torch']}; glassllm "
        f"{m['glassllm_commit']}; {m['date']}."
    )


def render_train_step(runs: Runs) -> str:
    lines = []
    for size, run in runs.items():
        lines += [machine_line(run["machine"]), ""]
        lines += [
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
        lines += [C.table(*train_step.report_rows({size: run})), ""]
        phases = [  # measured by the scripts before the benchmarks drove the Trainer
            [t, side, *v["phases_ms"].values()]
            for t, e in run["by_threads"].items()
            for side, v in e["sides"].items()
            if "phases_ms" in v
        ]
        if phases:
            headers = ["threads", "side", "forward", "backward", "clip", "AdamW + zero_grad"]
            lines += ["Per phase (median ms):", "", C.table(headers, phases), ""]
        per_round = [
            f"{t} threads {side} " + ", ".join(f"{ms:.1f}" for ms in v["per_round_ms"])
            for t, e in run["by_threads"].items()
            for side, v in e["sides"].items()
        ]
        lines += ["Per-round ms: " + "; ".join(per_round) + ".", ""]
    return "\n".join(lines).rstrip()


def render_sample(runs: Runs) -> str:
    run = next(iter(runs.values()))
    return "\n".join(
        [
            machine_line(run["machine"]),
            "",
            f"{C.fmt_dict(run['config'])}; batch 1, {run['threads']} threads, median of "
            f"{run['rounds']} alternating rounds. *fill*: the first block_size - 1 tokens from a "
            "one-token prompt; *slide*: the next block_size tokens with the context cropped to "
            "block_size (learned positions shift, so the cache is refilled each token).",
            "",
            C.table(*sample.report_rows(run)),
        ]
    )


def render_ops(runs: Runs) -> str:
    run = next(iter(runs.values()))
    return "\n".join(
        [
            machine_line(run["machine"]),
            "",
            f"{run['threads']} thread(s), median of {run['rounds']} alternating rounds; "
            "microseconds per call.",
            "",
            C.table(*ops.report_rows(run)),
        ]
    )


def render_memory(runs: Runs) -> str:
    run = next(iter(runs.values()))
    first = next(iter(run["sides"].values()))
    lines = [
        machine_line(run["machine"]),
        "",
        f"Growth over {first['steps']} training steps and {first['forwards']} no_grad forwards, "
        "from the 10th on.",
        "",
        C.table(*memory.report_rows(run)),
    ]
    if "step_over_model_ratio" in run:
        lines += [
            "",
            "Training-step peak over the built model, glassllm/torch: "
            f"**{run['step_over_model_ratio']:.2f}x**.",
        ]
    if "live_tensors" in run["sides"].get("glassllm", {}):
        lines.append(f"glassllm: {run['sides']['glassllm']['live_tensors']} live Tensor objects.")
    return "\n".join(lines)


def render_shakespeare(runs: Runs) -> str:
    headers = ["framework", "seed", "train loss (whole split)", "val loss (whole split)"]
    headers += ["val, 20-batch estimate", "reached", "run s", "ms/step", "peak RSS MiB", "CPU"]
    rows = [
        [
            r["framework"],
            r["seed"],
            f"{r['final_train_loss_full']:.4f}",
            f"{r['final_val_loss_full']:.4f}",
            f"{r['evals'][-1]['val']:.4f}",
            "yes" if r["reached"] else "no",
            r["wall_s_training_loop"],
            r["ms_per_iter"],
            r["peak_rss_mib"],
            r["machine"]["cpu"],
        ]
        for r in runs.values()
    ]
    first = next(iter(runs.values()))
    evals = ", ".join(f"{e['iter']}: {e['val']:.3f}" for e in first["evals"])
    return "\n".join(
        [
            f"{first['max_iters']} iterations each; target: val loss over the whole split <= "
            f"{first['target_val_loss']}. First row: {machine_line(first['machine'])}",
            "",
            C.table(headers, rows),
            "",
            f"First run's val loss, 20-batch estimate during training (iteration: loss): {evals}.",
        ]
    )


SECTIONS: dict[str, Callable[[Runs], str]] = {
    "train_step": render_train_step,
    "sample": render_sample,
    "ops": render_ops,
    "memory": render_memory,
    "shakespeare": render_shakespeare,
}


def main() -> int:
    text = RESULTS_MD.read_text()
    for name, render in SECTIONS.items():
        path = C.RESULTS_DIR / f"{name}.json"
        body = (
            render(json.loads(path.read_text())["runs"])
            if path.is_file()
            else f"_Not measured yet: run `python bench/{name}.py`._"
        )
        block = re.compile(rf"(<!-- generated:{name} -->\n).*?(<!-- /generated:{name} -->)", re.S)
        text = block.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
    RESULTS_MD.write_text(text)
    print(f"updated {RESULTS_MD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

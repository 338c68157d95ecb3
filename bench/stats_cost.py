"""What ``glassllm train --stats-interval`` costs: training time with stats.jsonl on vs off.

    python bench/stats_cost.py                        # tiny model, 300 steps, 3 rounds, 2 threads
    python bench/stats_cost.py --steps 100 --rounds 1 --interval 1

Each round runs two fresh processes, one with ``--stats-interval N`` (default 10, the default of
the command) and one with 0, in alternating order, each a `Trainer.fit` of ``--steps`` steps of the
default model (common.SIZES["tiny"], batch 12) on random text, evaluating every 250 steps as the
command does. Reported per round: the training time of each side (``TrainResult.elapsed_s``:
steps, evaluations and checkpoints) and their ratio; the headline is the median of the per-round
ratios minus one. The "on" side also times the stats calls themselves (`StatsLog.before_update` +
`after_update`, histograms included), which gives the direct cost, stats time / training time,
free of the drift between two processes on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
MARKER = "BENCH_JSON "


def worker(args: argparse.Namespace) -> dict:
    sys.path.insert(1, str(BENCH_DIR))
    import common as C

    with tempfile.TemporaryDirectory() as tmp:
        trainer = C.glassllm_trainer(
            Path(tmp), "tiny", seed=args.seed, max_iters=args.steps, stats_interval=args.interval
        )
        spent = [0.0]
        stats = trainer.stats
        for name in ("before_update", "after_update"):
            original = getattr(stats, name)

            def timed(*a, _original=original, **k):
                start = time.perf_counter()
                try:
                    return _original(*a, **k)
                finally:
                    spent[0] += time.perf_counter() - start

            setattr(stats, name, timed)
        result = trainer.fit(progress=False)
        lines = 0
        if (Path(tmp) / "out" / "stats.jsonl").exists():
            lines = len((Path(tmp) / "out" / "stats.jsonl").read_text().splitlines())
    return {"elapsed_s": result.elapsed_s, "stats_s": spent[0], "lines": lines}


def run_worker(interval: int, args: argparse.Namespace) -> dict:
    env = {
        **os.environ,
        "OPENBLAS_NUM_THREADS": str(args.threads),
        "OMP_NUM_THREADS": str(args.threads),
    }
    done = subprocess.run(
        [
            sys.executable,
            __file__,
            "--worker",
            "--interval",
            str(interval),
            "--steps",
            str(args.steps),
            "--seed",
            str(args.seed),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith(MARKER))
    return json.loads(line[len(MARKER) :])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(MARKER + json.dumps(worker(args)), flush=True)
        return 0
    ratios, direct = [], []
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    print("| round | off (s) | on (s) | on/off | stats calls (s) | stats / on |")
    print("|---|---|---|---|---|---|")
    for round_ in range(args.rounds):
        order = (0, args.interval) if round_ % 2 == 0 else (args.interval, 0)
        results = {interval: run_worker(interval, args) for interval in order}
        off, on = results[0], results[args.interval]
        ratios.append(on["elapsed_s"] / off["elapsed_s"])
        direct.append(on["stats_s"] / on["elapsed_s"])
        print(
            f"| {round_} | {off['elapsed_s']:.2f} | {on['elapsed_s']:.2f} | {ratios[-1]:.3f} | "
            f"{on['stats_s']:.3f} ({on['lines']} lines) | {100 * direct[-1]:.2f}% |",
            flush=True,
        )
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    print(
        f"median on/off - 1: {100 * (statistics.median(ratios) - 1):+.2f}%; "
        f"median direct cost (stats calls / training time): "
        f"{100 * statistics.median(direct):.2f}%"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

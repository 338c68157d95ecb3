"""What ``glassllm train --stats-interval`` costs: training time with stats.jsonl on vs off.

    python bench/stats_cost.py                        # tiny model, 300 steps, 3 rounds, 2 threads
    python bench/stats_cost.py --steps 100 --rounds 1 --interval 1

Per round, alternating, a fresh `Trainer.fit` process per side (``--stats-interval N`` and 0). The
headline: median per-round ratio of ``elapsed_s`` minus one; and the direct cost, the "on" side's
time in the stats calls / its training time, free of drift between processes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common as C

SIDES = ("off", "on")
DEFAULT_SIDES = SIDES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--interval", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)


def worker(args: argparse.Namespace) -> dict[str, Any]:
    interval = args.interval if args.worker == "on" else 0
    with tempfile.TemporaryDirectory() as tmp:
        trainer = C.glassllm_trainer(
            Path(tmp), "tiny", seed=args.seed, max_iters=args.steps, stats_interval=interval
        )
        spent = [0.0]
        for name in ("before_update", "after_update"):
            original = getattr(trainer.stats, name)

            def timed(*a: Any, _original: Any = original, **k: Any) -> Any:
                start = time.perf_counter()
                try:
                    return _original(*a, **k)
                finally:
                    spent[0] += time.perf_counter() - start

            setattr(trainer.stats, name, timed)
        result = trainer.fit(progress=False)
        stats = Path(tmp) / "out" / "stats.jsonl"
        lines = len(stats.read_text().splitlines()) if stats.exists() else 0
    return {"elapsed_s": result.elapsed_s, "stats_s": spent[0], "lines": lines}


def parent(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    results = C.alternate(args, args.threads[0], flip=True)
    payload: dict[str, Any] = {"steps": args.steps, "interval": args.interval, "sides": results}
    if set(results) == {"on", "off"}:
        on = [r["elapsed_s"] for r in results["on"]]
        payload["on_over_off"] = C.paired_ratio(on, [r["elapsed_s"] for r in results["off"]])
        payload["direct_cost"] = C.median([r["stats_s"] / r["elapsed_s"] for r in results["on"]])
    return {f"interval {args.interval}": payload}


def render(runs: dict[str, Any]) -> str:
    """One row per round; then the median on/off - 1 and the direct cost."""
    lines = []
    for run in runs.values():
        sides = run["sides"]
        rows = [
            [r, *(f"{sides[s][r]['elapsed_s']:.2f}" if s in sides else "-" for s in SIDES)]
            for r in range(len(next(iter(sides.values()))))
        ]
        lines += [C.machine_line(run["machine"]), "", C.table(["round", "off (s)", "on (s)"], rows)]
        if "on_over_off" in run:
            lines.append(
                f"\nmedian on/off - 1: {100 * (run['on_over_off'] - 1):+.2f}%; median direct cost"
                f" (stats calls / training time): {100 * run['direct_cost']:.2f}%"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return C.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())

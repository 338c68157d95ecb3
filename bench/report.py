"""Regenerate the measured blocks of bench/RESULTS.md from bench/results/<benchmark>.json.

    python bench/report.py

Each benchmark stores its runs in its result file (and calls this with --write-results), and
renders them with its own ``render``. RESULTS.md keeps its hand-written text; only the blocks
between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->`` are replaced.
"""

from __future__ import annotations

import importlib
import json
import re
import sys

import common as C

RESULTS_MD = C.BENCH_DIR / "RESULTS.md"
SECTIONS = ("train_step", "sample", "ops", "memory", "shakespeare")
MODULE = {"memory": "train_step"}  # train_step.py --memory stores memory.json


def main() -> int:
    text = RESULTS_MD.read_text()
    for name in SECTIONS:
        path = C.RESULTS_DIR / f"{name}.json"
        body = (
            importlib.import_module(MODULE.get(name, name)).render(
                json.loads(path.read_text())["runs"]
            )
            if path.is_file()
            else f"_Not measured yet: run `python bench/{MODULE.get(name, name)}.py`._"
        )
        block = re.compile(rf"(<!-- generated:{name} -->\n).*?(<!-- /generated:{name} -->)", re.S)
        text = block.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
    RESULTS_MD.write_text(text)
    print(f"updated {RESULTS_MD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Regenerate the measured blocks of bench/RESULTS.md from bench/results/<benchmark>.json.

    python bench/report.py

Each result file is rendered by its benchmark's ``render``; RESULTS.md keeps its hand-written
text, and only the blocks between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->``
are replaced (a benchmark's ``--write-results`` calls this).
"""

from __future__ import annotations

import importlib
import json
import re
import sys

import common as C

RESULTS_MD = C.BENCH_DIR / "RESULTS.md"
RENDERED_BY = {"memory": "train_step"}  # train_step.py --memory stores memory.json


def main() -> int:
    text = RESULTS_MD.read_text()
    for path in sorted(C.RESULTS_DIR.glob("*.json")):
        bench = importlib.import_module(RENDERED_BY.get(path.stem, path.stem))
        body = bench.render(json.loads(path.read_text())["runs"])
        block = rf"(<!-- generated:{path.stem} -->\n).*?(<!-- /generated:{path.stem} -->)"
        text = re.sub(
            block, lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text, flags=re.S
        )
    RESULTS_MD.write_text(text)
    print(f"updated {RESULTS_MD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

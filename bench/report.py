"""Regenerate the measured blocks of bench/RESULTS.md from bench/results/<benchmark>.json.

    python bench/report.py

Every result file has one shape and one renderer (``common.render``); RESULTS.md keeps its
hand-written text, and only the blocks between ``<!-- generated:NAME -->`` and
``<!-- /generated:NAME -->`` are replaced (a benchmark's ``--write-results`` calls this).
"""

from __future__ import annotations

import json
import re
import sys

import common as C

RESULTS_MD = C.BENCH_DIR / "RESULTS.md"


def main() -> int:
    text = RESULTS_MD.read_text()
    for path in sorted(C.RESULTS_DIR.glob("*.json")):
        body = C.render(json.loads(path.read_text())["runs"])
        block = rf"(<!-- generated:{path.stem} -->\n).*?(<!-- /generated:{path.stem} -->)"
        text = re.sub(
            block, lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text, flags=re.S
        )
    RESULTS_MD.write_text(text)
    print(f"updated {RESULTS_MD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Regenerate the measured blocks of bench/RESULTS.md from bench/results/<benchmark>.json.

    python bench/report.py

Every result file has one shape and one renderer (``common.render``); RESULTS.md keeps its
hand-written text, and only the blocks between ``<!-- generated:NAME -->`` and
``<!-- /generated:NAME -->`` are replaced (a benchmark's ``--write-results`` does it too).
"""

import common as C

if __name__ == "__main__":
    C.report()

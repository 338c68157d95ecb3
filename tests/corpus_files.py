"""A synthetic multi-file corpus for the tests of glassllm prepare (tests/data, tests/app)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

WORDS = "the cat sat on a mat and then it ran far away from home".split()


def write_corpus(root: Path, files: int = 5, lines: int = 30, seed: int = 0) -> Path:
    """``files`` .txt documents and one .jsonl of ``lines`` documents (and a file ignored)."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (root / f"doc{i}.txt").write_text(" ".join(rng.choice(WORDS, 200)) + "\n")
    (root / "sub").mkdir(exist_ok=True)
    with open(root / "sub" / "lines.jsonl", "w") as handle:
        for _ in range(lines):
            handle.write(json.dumps({"text": " ".join(rng.choice(WORDS, 40)), "id": 1}) + "\n")
        handle.write("\n")  # a blank line is skipped
    (root / "notes.csv").write_text("not,a,corpus\n")
    return root

"""Replacing a directory (glassllm.atomic_directory, behind ``glassllm export --overwrite``):
after a kill at any moment the old directory or the new one is at the path, and the next run
puts back or removes what the killed one left. Killed for real: a subprocess exports and ends
itself with ``os._exit`` before or after a named step, with and without the atomic swap."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from glassllm.atomic_directory import exchange, make_temporary, recover, replace_directory
from glassllm.hf import save_pretrained
from glassllm.models import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = "model.safetensors"

# Runs the export of SOURCE onto TARGET, ending the process (as SIGKILL would: no clean-up,
# no finally) at its STEP: before or after the N-th call of one function.
KILLER = textwrap.dedent(
    """
    import functools, os, shutil, sys
    import glassllm.atomic_directory as ad
    source, target, name, when, nth, swap = sys.argv[1:7]
    calls = [0]
    def killing(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            calls[0] += 1
            if when == "before" and calls[0] == int(nth):
                os._exit(9)
            result = function(*args, **kwargs)
            if when == "after" and calls[0] == int(nth):
                os._exit(9)
            return result
        return wrapper
    if swap == "off":  # a system or file system without renameat2(RENAME_EXCHANGE)
        ad.exchange = lambda a, b: False
    owner = {"rename": os, "rmtree": shutil, "exchange": ad, "fsync_path": ad}[name]
    setattr(owner, name, killing(getattr(owner, name)))
    from glassllm.app import main
    sys.exit(main(["export", "--checkpoint", source, "--out-dir", target, "--overwrite"]))
    """
)


def model_dir(path: Path, seed: int) -> Path:
    config = GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8)
    return save_pretrained(GPT(config, rng=np.random.default_rng(seed)), None, path)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A glassllm checkpoint (char tokenizer) to export, and what its export holds."""
    root = tmp_path_factory.mktemp("source")
    (root / "text.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 40)
    argv = ["train", "--data", str(root / "text.txt"), "--out-dir", str(root), "--max-iters",
            "1", "--n-layer", "1", "--n-head", "2", "--n-embd", "8", "--block-size", "8",
            "--eval-iters", "1", "--sample-tokens", "0", "--batch-size", "2"]  # fmt: skip
    from glassllm.app import main

    assert main(argv) == 0
    checkpoint = root / "ckpt.safetensors"
    assert main(["export", "--checkpoint", str(checkpoint), "--out-dir", str(root / "new")]) == 0
    return checkpoint, (root / "new" / WEIGHTS).read_bytes()


def run_killed(source, target, step, swap):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-c", KILLER, str(source), str(target), *step, swap],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def which(target: Path, old: bytes, new: bytes) -> str:
    """'old' or 'new': the model at ``target`` (failing when there is none, or another)."""
    assert target.is_dir(), f"no directory at {target}: {sorted(os.listdir(target.parent))}"
    weights = (target / WEIGHTS).read_bytes()
    assert weights in (old, new)
    return "old" if weights == old else "new"


STEPS = [(name, when, nth) for name in ("rename", "exchange", "rmtree", "fsync_path")
         for when in ("before", "after") for nth in ("1", "2")]  # fmt: skip


@pytest.mark.parametrize("swap", ["on", "off"])
@pytest.mark.parametrize("step", STEPS, ids="-".join)
def test_a_kill_at_any_step_leaves_the_old_or_the_new_model(sources, tmp_path, step, swap):
    if swap == "on" and not exchange_works(tmp_path):
        pytest.skip("no renameat2(RENAME_EXCHANGE) here")
    source, new = sources
    target = model_dir(tmp_path / "model", seed=1)
    old = (target / WEIGHTS).read_bytes()
    killed = run_killed(source, target, step, swap)
    assert killed.returncode in (0, 9), killed.stderr
    if swap == "on" or killed.returncode == 0:  # the swap: never a moment without a model
        which(target, old, new)
    # The next run finds what was left: the old model back (if it was hidden), leftovers gone.
    notes = recover(target)
    was = which(target, old, new)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"], notes
    assert killed.returncode == 9 or was == "new"
    again = run_killed(source, target, ("rename", "after", "99"), swap)  # never killed
    assert again.returncode == 0, again.stderr
    assert which(target, old, new) == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def exchange_works(folder: Path) -> bool:
    a, b = folder / "probe_a", folder / "probe_b"
    a.mkdir()
    b.mkdir()
    try:
        return exchange(a, b)
    finally:
        a.rmdir()
        b.rmdir()


def test_a_kill_between_the_two_renames_is_repaired_by_the_next_export(sources, tmp_path):
    """Without the swap the path is empty for a moment; the next export puts the old back."""
    source, _ = sources
    target = model_dir(tmp_path / "model", seed=1)
    old = (target / WEIGHTS).read_bytes()
    killed = run_killed(source, target, ("rename", "after", "1"), "off")
    assert killed.returncode == 9
    assert not target.exists() and sorted(p.name[-4:] for p in tmp_path.iterdir()) == [
        ".old",
        ".tmp",
    ]
    refused = subprocess.run(  # no --overwrite: refused, but the old model is back first
        [sys.executable, "-m", "glassllm", "export", "--checkpoint", str(source), "--out-dir",
         str(target)], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert refused.returncode == 2
    lines = refused.stderr.splitlines()
    assert lines[0].startswith(f"glassllm: put back {target} from .model.")
    assert lines[1].startswith("glassllm: removed .model.") and lines[1].endswith("killed writer")
    assert lines[2].startswith("glassllm: error: ") and "--overwrite" in lines[2]
    assert (target / WEIGHTS).read_bytes() == old
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_replace_directory_swaps_a_full_directory_and_fills_an_empty_one(tmp_path):
    target = tmp_path / "t"
    for contents in (None, [], ["a"], ["b", "c"]):
        if contents is not None and not target.exists():
            target.mkdir()
        temporary = make_temporary(target)
        (temporary / "new").write_text(str(contents))
        replace_directory(temporary, target)
        assert [p.name for p in target.iterdir()] == ["new"]
        assert (target / "new").read_text() == str(contents)
        assert [p.name for p in tmp_path.iterdir()] == ["t"]


def test_recover_leaves_a_live_writer_s_and_other_files_alone(tmp_path):
    target = tmp_path / "t"
    target.mkdir()
    live = make_temporary(target)  # this process is alive
    for name in (".t.x.00000000.tmp", ".u.999999999.00000000.tmp", "t.old"):
        (tmp_path / name).mkdir()
    link = tmp_path / ".t.999999999.0000000a.old"
    link.symlink_to(target)  # never followed, never removed
    assert recover(target) == []
    assert live.exists() and link.is_symlink() and len(list(tmp_path.iterdir())) == 6

"""Fixtures shared by the test files: a tiny text corpus, a tiny GPT, PyTorch as an optional
oracle, and running a Python program the way a user does (a fresh process).

Optional dependencies: a test that needs one asks for it through :func:`optional`, which skips
with the reason when it is missing, except under ``CI=true``, where a missing oracle is a failure
(the CI installs every extra, so a skip there would hide a test that never ran).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]

# tests/fixtures/ holds committed files and the scripts that made them (with torch and
# transformers, imported at their top): nothing to collect, and not importable on a bare machine.
collect_ignore = ["fixtures"]

# 60 short lines: enough characters for a tiny GPT's train and validation splits.
TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(60))


def optional(name: str) -> ModuleType:
    """Import an optional dependency; skip the test when it is absent (fail under CI=true)."""
    if os.environ.get("CI") == "true":
        module = importlib.import_module(name)
    else:
        module = pytest.importorskip(name, reason=f"{name} is not installed (optional oracle)")
    # why: a test folder of the same name (tests/gguf/) imports as an empty namespace package
    # when the real one is absent.
    if getattr(module, "__file__", None) is None:
        if os.environ.get("CI") == "true":
            raise ImportError(f"{name} is only a namespace package here, not installed")
        pytest.skip(f"{name} is not installed (optional oracle)")
    return module


@contextlib.contextmanager
def small_disk(path: Path, size: str = "256k") -> Iterator[Path]:
    """A real filesystem of ``size`` at ``path`` (tmpfs; needs root), else a pytest.skip (the
    tests that use it have an RLIMIT_FSIZE variant for machines without)."""
    path.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        done = None
    if done is None or done.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (not root?)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


@pytest.fixture(scope="session")
def torch() -> ModuleType:
    """PyTorch, the tests' oracle (see :func:`optional`)."""
    return optional("torch")


@pytest.fixture(params=["numpy", "compiled"])
def kernel_path(request: pytest.FixtureRequest) -> str:
    """Run the test on each path of the fused functions: NumPy alone, then the ``fast`` extra's
    compiled kernels (numba, through :func:`optional`)."""
    from glassllm.kernels import compiled

    if request.param == "compiled":
        optional("numba")
    before = compiled.enabled()
    compiled.set_enabled(request.param == "compiled")
    assert compiled.enabled() == (request.param == "compiled")
    yield request.param
    compiled.set_enabled(before)


@pytest.fixture(params=["reference", "numpy", "compiled"])
def op_path(request: pytest.FixtureRequest) -> str:
    """Run the test on the fused functions' plain definitions (``kernels.use("reference")``),
    then on each path of their kernels (see :func:`kernel_path`)."""
    from glassllm import kernels
    from glassllm.kernels import compiled

    if request.param == "compiled":
        optional("numba")
    before = compiled.enabled()
    compiled.set_enabled(request.param == "compiled")
    with kernels.use("reference" if request.param == "reference" else "fast"):
        assert kernels.reference() == (request.param == "reference")
        yield request.param
    compiled.set_enabled(before)


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    """A file holding :data:`TEXT`."""
    path = tmp_path / "tiny.txt"
    path.write_text(TEXT)
    return path


@pytest.fixture
def tiny_gpt() -> Callable[..., object]:
    """``tiny_gpt(seed=0, dtype=np.float32, **config)``: a 2-layer, 16-wide GPT over 11 tokens."""
    from glassllm.models import GPT, GPTConfig

    def build(seed: int = 0, dtype: type = np.float32, **overrides: object) -> GPT:
        config = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16) | overrides
        return GPT(GPTConfig(**config), rng=np.random.default_rng(seed), dtype=dtype)

    return build


@pytest.fixture
def run_python() -> Callable[..., subprocess.CompletedProcess]:
    """``run_python(*args, timeout=300, cwd=None)``: ``python *args`` in a fresh process that
    imports this tree's glassllm; returns the completed process (output captured as text)."""

    def run(*args: object, timeout: float = 300, cwd: Path | None = None):
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": path}
        return subprocess.run(
            [sys.executable, *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            env=env,
        )

    return run


def run_cli(argv: list[object], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``glassllm ARGV`` in this process: ``(exit status, stdout, stderr)`` (argparse's exits
    included)."""
    from glassllm.app.cli import main

    try:
        status = main([str(a) for a in argv])
    except SystemExit as exit_:
        status = exit_.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def on_threads(count: int, fn: Callable):
    """``fn()`` with glassllm's worker threads set to ``count``, the count before restored."""
    from glassllm import threads

    before = threads.get_num_threads()
    threads.set_num_threads(count)
    try:
        return fn()
    finally:
        threads.set_num_threads(before)

"""Every install instruction installs this project: the name ``glassllm`` on the public package
index belongs to another project, so no file of the tree (the package's messages and docstrings,
the README, docs/, examples/, bench/, .ci/) may tell a user to ``pip install glassllm`` or one
of its extras by that name; and every extra a hint names exists in pyproject.toml."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from glassllm._install import EXTRAS, install_hint
from glassllm.data.bpe import INSTALL_HINT as HF_HINT
from glassllm.distributed import INSTALL_HINT as MPI_HINT

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ["README.md", "pyproject.toml", "glassllm", "docs", "examples", "bench", ".ci"]
# pip install [options] glassllm / 'glassllm[hf]' / "glassllm[mpi]" / glassllm==0.1 ...
BY_NAME = re.compile(r"pip3?\s+install\s+(?:-{1,2}[\w-]+\s+)*['\"]?glassllm(?![\w./-])", re.I)
FROM_CHECKOUT = re.compile(r"pip install -e '\.\[([\w,]+)\]'")


def tree_files() -> list[Path]:
    files = []
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += [
                p for p in sorted(path.rglob("*")) if p.is_file() and "__pycache__" not in p.parts
            ]
    return files


def text_of(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None  # a binary file (a plot, a fixture) holds no instruction


def test_the_scan_sees_the_readme_the_package_and_the_docs():
    names = {p.relative_to(ROOT).as_posix() for p in tree_files()}
    assert {"README.md", "glassllm/_install.py", "docs/distributed.md"} <= names


@pytest.mark.parametrize(
    "line",
    [
        "pip install glassllm",
        "pip install 'glassllm[hf]'",
        'pip install "glassllm[mpi]"',
        "pip install -U glassllm mpi4py",
        "pip3 install glassllm==0.1.0",
    ],
)
def test_the_rule_catches_an_install_by_name(line):
    assert BY_NAME.search(line)


@pytest.mark.parametrize("line", ["pip install -e '.[hf]'", "pip install -e . mpi4py"])
def test_the_rule_lets_an_install_from_the_checkout_pass(line):
    assert not BY_NAME.search(line)


def test_no_file_installs_glassllm_by_name():
    found = []
    for path in tree_files():
        text = text_of(path)
        for match in BY_NAME.finditer(text or ""):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{path.relative_to(ROOT)}:{line}: {match.group(0)}")
    assert found == [], "install by name (another project's package):\n" + "\n".join(found)


def test_every_extra_named_in_a_hint_exists():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    declared = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    assert set(EXTRAS) == declared
    named = set()
    for path in tree_files():
        for match in FROM_CHECKOUT.finditer(text_of(path) or ""):
            named |= set(match.group(1).split(","))
    assert named and named <= declared, named - declared


def test_the_program_s_hints_come_from_one_place():
    assert HF_HINT == install_hint("hf") and MPI_HINT == install_hint("mpi")
    assert "pip install -e '.[mpi]'" in MPI_HINT and not BY_NAME.search(MPI_HINT)
    with pytest.raises(ValueError, match="no extra 'gpu'"):
        install_hint("gpu")

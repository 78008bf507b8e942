"""The package's floors point one way and no import circle remains (docs/layout.md).

Every module of the package is parsed (imports at module level, inside functions and under
`if TYPE_CHECKING:` alike) and each import of a grpolab module is an edge. Two rules:

- floors: a module imports only its own package and packages on lower floors (`FLOORS`); two rooms on
  one floor do not import each other. Type-only imports count: a ground-floor module naming a room's
  type would still tie the floor to the room.
- no circle among the imports that run (type-only imports left out: `if TYPE_CHECKING:` blocks are the
  standard way to name a type of a module that imports yours, and never execute).

The checker itself is tested on small graphs with a circle and a downward-pointing floor, so a
layering test that cannot fail would fail here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIPPED_DIRS = {"tests", "benchmarks", ".venv", ".git", "__pycache__", "build", ".whl"}

FLOORS: dict[str, int] = {
    "grpolab": 0,  # the package's own __init__: the version, nothing imported
    "core": 0,  # ground floor: config, model files, engines, algorithms, batch, data, rewards, det backend, checkpoint
    "rundir": 1,  # the run directory: one writer, one reader
    "replay": 2,
    "checkers": 2,
    "monitor": 2,
    "diagnose": 2,
    "serve": 2,
    "convert": 2,  # checkpoints exported for serving (grpolab convert)
    "rollout": 3,  # rollout paths (replay, inject, the engine, a fleet) behind one protocol
    "diff": 3,
    "train": 4,  # the run's orchestration: loop, start-up, preflight, step report, train phase, colocation
    "ui": 5,
    "fixtures": 5,  # the scripts that make the fixtures stand beside the product
    "examples": 5,  # runnable examples of the extension points (the custom rollout logger)
    "cli": 6,  # the `grpolab` command dispatches to every room, the UI included
    "__main__": 7,
}
"""Each top-level package's floor (`grpolab.<name>`); a module may import its own package and lower floors."""


def module_name(path: Path) -> str:
    """`grpolab.core.config` for core/config/__init__.py, `grpolab.cli` for cli.py."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["grpolab", *parts])


def package_modules() -> dict[str, Path]:
    """Every module of the package by name."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        if SKIPPED_DIRS.intersection(path.relative_to(ROOT).parts[:-1]):
            continue
        found[module_name(path)] = path
    return found


def _type_only_lines(tree: ast.Module) -> set[int]:
    """Line numbers of the statements inside `if TYPE_CHECKING:` blocks."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.If)
            and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
        ):
            for stmt in node.body:
                lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return lines


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> dict[str, bool]:
    """The grpolab modules `name` imports, each with whether some import of it runs (False: type-only)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_only = _type_only_lines(tree)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: dict[str, bool] = {}
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for target in targets:
            while target and target not in modules:  # `grpolab.core.config.Config` -> its module
                target = target.rpartition(".")[0]
            if target.startswith("grpolab") and target != name:
                found[target] = found.get(target, False) or node.lineno not in type_only
    return found


def import_graph() -> dict[str, dict[str, bool]]:
    modules = package_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def top_package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "grpolab"


def floor_violations(graph: dict[str, dict[str, bool]], floors: dict[str, int]) -> list[str]:
    """Imports that point up a floor or sideways into another room of the same floor."""
    found = []
    for module, targets in sorted(graph.items()):
        mine = top_package(module)
        for target in sorted(targets):
            theirs = top_package(target)
            if theirs == mine or theirs == "grpolab":
                continue
            if floors[theirs] > floors[mine] or (floors[theirs] == floors[mine] and theirs != mine):
                found.append(f"{module} (floor {floors[mine]}) imports {target} (floor {floors[theirs]})")
    return found


def cycles(graph: dict[str, dict[str, bool]]) -> list[list[str]]:
    """The import circles among imports that run: strongly connected components of more than one module."""
    edges = {m: [t for t, runs in ts.items() if runs and t in graph] for m, ts in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(root: str) -> None:  # Tarjan's algorithm, iterative (no recursion limit)
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(edges[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, dict[str, bool]]:
    return import_graph()


def test_every_package_has_a_floor(graph: dict[str, dict[str, bool]]) -> None:
    unknown = sorted({top_package(m) for m in graph} - set(FLOORS))
    assert not unknown, (
        f"give these packages a floor in FLOORS (and a paragraph in the layout docs): {unknown}"
    )
    assert {"grpolab.core.config", "grpolab.train.loop", "grpolab.rollout.paths"} <= set(graph)


def test_floors_point_one_way(graph: dict[str, dict[str, bool]]) -> None:
    assert floor_violations(graph, FLOORS) == []


def test_no_import_circle(graph: dict[str, dict[str, bool]]) -> None:
    assert cycles(graph) == []


def test_the_checks_find_a_circle_and_an_upward_import() -> None:
    circle = {
        "grpolab.core.config": {"grpolab.checkers.faults": True},
        "grpolab.checkers.faults": {"grpolab.rundir.writer": True},
        "grpolab.rundir.writer": {"grpolab.core.config": True},
    }
    assert cycles(circle) == [sorted(circle)]
    assert floor_violations(circle, FLOORS) == [
        "grpolab.core.config (floor 0) imports grpolab.checkers.faults (floor 2)"
    ]
    type_only = {"grpolab.core.a": {"grpolab.core.b": True}, "grpolab.core.b": {"grpolab.core.a": False}}
    assert cycles(type_only) == []  # a type-only import back is no circle
    sideways = {"grpolab.replay.x": {"grpolab.checkers.y": False}, "grpolab.checkers.y": {}}
    assert floor_violations(sideways, FLOORS) == [
        "grpolab.replay.x (floor 2) imports grpolab.checkers.y (floor 2)"
    ]


def test_the_parser_sees_function_level_relative_and_type_only_imports(tmp_path: Path) -> None:
    modules = {
        "grpolab.core.a": tmp_path / "a.py",
        "grpolab.core.b": tmp_path / "b.py",
        "grpolab.checkers.c": tmp_path,
    }
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from grpolab.checkers.c import Thing\n"
        "def f():\n    from .b import g\n"
    )
    (tmp_path / "a.py").write_text(source)
    assert imports_of("grpolab.core.a", tmp_path / "a.py", modules) == {
        "grpolab.checkers.c": False,
        "grpolab.core.b": True,
    }

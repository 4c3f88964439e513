"""The layout rules of the shipped packages, computed from their source with `ast`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "app"
PACKAGES = ("gaudi_cluster", "train")
MAX_LINES = 350
# Modules that decide (parse, validate, plan, render, check) and must never reach the edges.
PURE = {
    "gaudi_cluster.aws.diff",
    "gaudi_cluster.aws.facts",
    "gaudi_cluster.aws.render",
    "gaudi_cluster.aws.request",
    "gaudi_cluster.aws.spec",
    "gaudi_cluster.aws.userdata",
    "gaudi_cluster.nodes.checks",
    "gaudi_cluster.compat.translate",
    "gaudi_cluster.settings.config",
    "gaudi_cluster.view.diagnosis",
    "gaudi_cluster.engines.auto",
    "gaudi_cluster.env.envfile",
    "gaudi_cluster.nodes.hostfile",
    "gaudi_cluster.env.jobenv",
    "gaudi_cluster.view.jobview",
    "gaudi_cluster.launch.launchers",
    "gaudi_cluster.supervise.outcome",
    "gaudi_cluster.launch.plan",
    "gaudi_cluster.env.presets",
    "gaudi_cluster.settings.profiles",
    "gaudi_cluster.launch.program",
    "gaudi_cluster.settings.setting_types",
    "gaudi_cluster.nodes.slurm",
}
EDGES = {"subprocess", "socket", "threading"}


def module_files() -> dict[str, Path]:
    files = {}
    for package in PACKAGES:
        for path in sorted((APP / package).rglob("*.py")):
            parts = path.relative_to(APP).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            files[name] = path
    return files


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module of ours that `name` imports, at module level or inside a function."""
    found: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import module` depends on that module; the package's own __init__ runs
            # before any of its modules anyway, so it is not an edge of its own.
            modules = {f"{base}.{alias.name}" for alias in node.names} & known
            found.update(modules or {base})
    return {module for module in found if module in known and module != name}


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imports_of(name, path, set(files)) for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_import_graph_is_real():
    graph = import_graph()
    assert "gaudi_cluster.env.envfile" in graph["gaudi_cluster.settings.config"]
    assert "gaudi_cluster.nodes.survey" in graph["gaudi_cluster.launch.prepare"]


def test_no_import_cycle_in_the_shipped_packages():
    assert find_cycle(import_graph()) is None


@pytest.mark.parametrize("name", sorted(PURE))
def test_pure_modules_never_import_an_edge(name):
    graph = import_graph()
    reached, todo = set(), [name]
    while todo:
        module = todo.pop()
        for nxt in graph[module]:
            if nxt not in reached:
                reached.add(nxt)
                todo.append(nxt)
    # `train` (the package's __init__) holds the default job's constants only.
    allowed = PURE | {"gaudi_cluster.errors", "gaudi_cluster", "gaudi_cluster.aws", "train"}
    assert not reached - allowed, reached - allowed
    source = ast.parse(module_files()[name].read_text())
    stdlib = {alias.name for node in ast.walk(source) if isinstance(node, ast.Import) for alias in node.names}
    stdlib |= {node.module for node in ast.walk(source) if isinstance(node, ast.ImportFrom) and node.module}
    assert not stdlib & EDGES


@pytest.mark.parametrize("name", sorted(module_files()))
def test_no_module_is_over_the_size_limit(name):
    lines = len(module_files()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines; split it by phase or concept"

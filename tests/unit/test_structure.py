"""The layout rules of the shipped packages, computed from their source with `ast`."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "app"
PACKAGES = ("gaudi_cluster", "train")
# A soft budget, not a cap that shapes the code: past WARN_LINES a module is worth a look (split it
# where it holds two concepts, each part named after its concept); past FAIL_LINES it must be split.
WARN_LINES = 450
FAIL_LINES = 600
MAX_TOP_MODULES = 8
# The modules a process starts from (`python -m ...`), and the process each one is: what a reader
# opens to learn where code runs. gaudi_cluster itself (__main__) is every role of the image.
ENTRY_MODULES = {
    "gaudi_cluster.__main__": "master, node (worker) or user's machine: the image's roles",
    "gaudi_cluster.engines.nodewatch": "node: a worker's life under Slurm",
    "gaudi_cluster.launch.fanout": "master: the direct launcher's fan-out to every node",
    "gaudi_cluster.launch.node": "node: the direct launcher's per-node process",
    "gaudi_cluster.nodes.probe": "node: what the node reports of itself, run by the master on every node",
    "gaudi_cluster.rank.agent": "rank: one rank's agent",
    "gaudi_cluster.rank.relay": "node: the node's one control connection",
    "gaudi_cluster.rank.zygote": "node: the pre-imported parent that forks the node's ranks",
    "gaudi_cluster.settings.profiles_cli": "user's machine: the profile matrix for the build and docs",
    "gaudi_cluster.settings.reference": "user's machine: docs/reference.md",
}
# Where a module says which process it runs in: the first words of its docstring.
PROCESSES = ("master", "node", "rank", "user's machine", "runs on", "any process", "every process")
# The folders of gaudi_cluster in the order of the job's path, lowest first: a module imports its own
# folder, the folders before it, and gaudi_cluster.errors; never a folder after it, nor a top module.
FOLDERS = (
    "wire",
    "rank",
    "env",
    "settings",
    "nodes",
    "launch",
    "view",
    "supervise",
    "engines",
    "job",
    "compat",
    "aws",
)
# Modules that decide (parse, validate, plan, render, check) and must never reach the edges.
PURE = {
    "gaudi_cluster.aws.diff",
    "gaudi_cluster.aws.facts",
    "gaudi_cluster.aws.render",
    "gaudi_cluster.aws.request",
    "gaudi_cluster.aws.spec",
    "gaudi_cluster.aws.userdata",
    "gaudi_cluster.compat.translate",
    "gaudi_cluster.engines.auto",
    "gaudi_cluster.rank.zygote_rules",
    "gaudi_cluster.env.cpu_threads",
    "gaudi_cluster.env.envfile",
    "gaudi_cluster.env.jobenv",
    "gaudi_cluster.env.presets",
    "gaudi_cluster.launch.attempts",
    "gaudi_cluster.launch.launchers",
    "gaudi_cluster.launch.plan",
    "gaudi_cluster.launch.program",
    "gaudi_cluster.nodes.checks",
    "gaudi_cluster.nodes.image_checks",
    "gaudi_cluster.nodes.hostfile",
    "gaudi_cluster.nodes.slurm",
    "gaudi_cluster.nodes.srun",
    "gaudi_cluster.nodes.discovery",
    "gaudi_cluster.nodes.find",
    "gaudi_cluster.settings.config",
    "gaudi_cluster.settings.host_names",
    "gaudi_cluster.settings.profiles",
    "gaudi_cluster.settings.profiles_build",
    "gaudi_cluster.settings.profiles_check",
    "gaudi_cluster.settings.setting_types",
    "gaudi_cluster.settings.usage",
    "gaudi_cluster.supervise.outcome",
    "gaudi_cluster.view.diagnosis",
    "gaudi_cluster.view.fabric",
    "gaudi_cluster.view.history",
    "gaudi_cluster.view.figures",
    "gaudi_cluster.view.jobview",
    "gaudi_cluster.wire.node_report",
    "gaudi_cluster.wire.node_spec",
    "gaudi_cluster.wire.protocol",
    "gaudi_cluster.wire.messages",
    "gaudi_cluster.wire.handshake",
    "gaudi_cluster.wire.fields",
    "gaudi_cluster.wire.kinds",
    "gaudi_cluster.wire.host_name",
    "gaudi_cluster.wire.private_args",
    "gaudi_cluster.wire.workload_events",
    "gaudi_cluster.wire.work_window",
    "gaudi_cluster.rank.agent_beat",
}
EDGES = {"subprocess", "socket", "threading", "shutil", "glob", "tempfile"}
# What reaches the file system, the environment or the clock of the process, as a pure module must not:
# its world comes in as arguments.
IO_CALLS = {
    ("os", "environ"),
    ("os", "getenv"),
    ("os", "getcwd"),
    ("os", "listdir"),
    ("os", "scandir"),
    ("os", "stat"),
    ("os", "chdir"),
    ("os", "remove"),
    ("os", "unlink"),
    ("os", "makedirs"),
    ("path", "exists"),
    ("path", "isdir"),
    ("path", "isfile"),
    ("path", "abspath"),
    ("path", "expanduser"),
    ("path", "getsize"),
}
PACKAGE_DATA = {"MATRIX_PATH"}
IO_METHODS = {"read_text", "read_bytes", "write_text", "write_bytes", "open", "mkdir", "exists", "is_dir",
              "is_file", "iterdir", "glob", "unlink", "home", "cwd"}  # fmt: skip


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
    assert "gaudi_cluster.job.attempt" in graph["gaudi_cluster.master"]
    assert "gaudi_cluster.nodes.survey" in graph["gaudi_cluster.job.attempt"]


def folder_of(module: str) -> str | None:
    """The folder of a gaudi_cluster module; None for the top-level modules and the package itself."""
    parts = module.split(".")
    return parts[1] if (parts[0] == "gaudi_cluster" and len(parts) > 2) or parts[1:2] == ["aws"] else None


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, imports in sorted(graph.items()):
        folder = folder_of(module)
        if folder is None:
            continue
        rank = FOLDERS.index(folder)
        for target in sorted(imports):
            other = folder_of(target)
            if target.split(".")[0] != "gaudi_cluster" or (
                target == "gaudi_cluster.errors" and folder != "wire"
            ):
                continue
            if other is None or FOLDERS.index(other) > rank or (folder == "wire" and other != "wire"):
                found.append(f"{module} -> {target}")
    return found


def test_the_layering_check_finds_an_upward_import():
    graph = {
        "gaudi_cluster.wire.protocol": {"gaudi_cluster.errors"},
        "gaudi_cluster.nodes.ssh": {"gaudi_cluster.master"},
    }
    assert layering_violations(graph) == [
        "gaudi_cluster.nodes.ssh -> gaudi_cluster.master",
        "gaudi_cluster.wire.protocol -> gaudi_cluster.errors",
    ]
    assert layering_violations({"gaudi_cluster.launch.plan": {"gaudi_cluster.nodes.hostfile"}}) == []
    assert layering_violations({"gaudi_cluster.nodes.survey": {"gaudi_cluster.launch.program"}}) == [
        "gaudi_cluster.nodes.survey -> gaudi_cluster.launch.program"
    ]


def test_no_folder_imports_one_that_stands_above_it():
    assert layering_violations(import_graph()) == []


def test_the_top_of_the_package_holds_only_the_modules_a_reader_starts_from():
    top = sorted(p.name for p in (APP / "gaudi_cluster").glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top
    folders = {p.name for p in (APP / "gaudi_cluster").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(FOLDERS)


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
    allowed = PURE | {"gaudi_cluster.errors", "gaudi_cluster", "train"}
    allowed |= {f"gaudi_cluster.{folder}" for folder in FOLDERS}  # the folders' docstring-only __init__
    assert not reached - allowed, reached - allowed
    source = ast.parse(module_files()[name].read_text())
    stdlib = {alias.name for node in ast.walk(source) if isinstance(node, ast.Import) for alias in node.names}
    stdlib |= {node.module for node in ast.walk(source) if isinstance(node, ast.ImportFrom) and node.module}
    assert not stdlib & EDGES


def io_uses(source: ast.AST) -> list[str]:
    """Every reach of a module into the file system or the environment, as `owner.attr at line N`."""
    found = []
    for node in ast.walk(source):
        if isinstance(node, ast.Attribute):
            owner = (
                node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
            )
            if (owner, node.attr) in IO_CALLS:
                found.append(f"{owner}.{node.attr} at line {node.lineno}")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == "open":
                found.append(f"open() at line {node.lineno}")
            elif (
                isinstance(func, ast.Attribute) and func.attr in IO_METHODS and not _package_data(func.value)
            ):
                found.append(f".{func.attr}() at line {node.lineno}")
    return sorted(found, key=lambda text: int(text.rsplit(" ", 1)[1]))


def _package_data(receiver: ast.expr) -> bool:
    """Reading the package's own data file (profiles.json, next to its module) reads code, not the world."""
    return isinstance(receiver, ast.Name) and receiver.id in PACKAGE_DATA


def test_the_io_check_finds_file_and_environment_access():
    code = (
        "import os\nx = os.environ['A']\nPath('f').read_text()\nopen('g')\nos.path.isdir('/')\ny = spec.cwd\n"
    )
    assert io_uses(ast.parse(code)) == [
        "os.environ at line 2",
        ".read_text() at line 3",
        "open() at line 4",
        "path.isdir at line 5",
    ]


@pytest.mark.parametrize("name", sorted(PURE))
def test_pure_modules_touch_no_file_and_no_environment(name):
    assert io_uses(ast.parse(module_files()[name].read_text())) == []


@pytest.mark.parametrize("name", sorted(module_files()))
def test_no_module_is_over_the_size_budget(name):
    lines = len(module_files()[name].read_text().splitlines())
    assert lines <= FAIL_LINES, f"{name} has {lines} lines; split it by concept, each part named after one"
    if lines > WARN_LINES:
        warnings.warn(f"{name}: {lines} lines (budget {WARN_LINES}); two concepts?", stacklevel=1)


def main_modules() -> set[str]:
    """Every module that runs as a process: a __main__.py, or a module with a `__main__` guard."""
    found = set()
    for name, path in module_files().items():
        if not name.startswith("gaudi_cluster."):
            continue
        tree = ast.parse(path.read_text())
        guarded = any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body)
        if path.name == "__main__.py" or (guarded and name != "gaudi_cluster.cli"):
            found.add(name)
    return found


def test_the_process_entry_modules_are_listed():
    """cli's guard only repeats __main__'s entry; every other process entry is named above."""
    assert main_modules() == set(ENTRY_MODULES)


# Modules whose docstring already starts with their process (the rest follow as they are touched).
SAYS_ITS_PROCESS = {
    "gaudi_cluster.__main__",
    "gaudi_cluster.doctor",
    "gaudi_cluster.master",
    "gaudi_cluster.engines.nodewatch",
    "gaudi_cluster.launch.fanout",
    "gaudi_cluster.launch.node",
    "gaudi_cluster.launch.prepare",
    "gaudi_cluster.launch.restart",
    "gaudi_cluster.nodes.cleanup",
    "gaudi_cluster.nodes.handover",
    "gaudi_cluster.nodes.reach",
    "gaudi_cluster.nodes.survey",
    "gaudi_cluster.supervise.supervisor",
    "gaudi_cluster.view.fabric",
    "gaudi_cluster.settings.reference",
} | {name for name in module_files() if name.startswith("gaudi_cluster.job")}


@pytest.mark.parametrize("name", sorted(SAYS_ITS_PROCESS))
def test_a_module_says_which_process_it_runs_in(name):
    doc = ast.get_docstring(ast.parse(module_files()[name].read_text())) or ""
    assert doc.lower().startswith(PROCESSES), f"{name}: its docstring starts {doc[:60]!r}"


def test_every_test_file_has_its_own_basename():
    """pytest imports test modules by basename (no __init__ in tests/): two test_x.py files stop the
    whole run at collection."""
    names = [path.name for path in (APP.parent / "tests").rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []

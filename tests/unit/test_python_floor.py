"""The shipped code runs on the oldest Python an image gives it: the gaudi profiles' bases are Habana's
Ubuntu 22.04 images with Python 3.10 (profiles.json `python`), the cpu image Debian 12's 3.11. The
syntax is compiled by the image build; what only fails at import (a stdlib name newer than the floor,
as `enum.StrEnum` did: every gaudi node's `gaudi-cluster` died on start) is found here, from the source
with `ast`, on any interpreter."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = (ROOT / "app", ROOT / "examples")

# Standard-library names added after 3.10 (What's New in Python 3.11, 3.12, 3.13), by module.
NEWER = {
    (3, 11): {
        "enum": "StrEnum ReprEnum EnumCheck FlagBoundary verify member nonmember global_enum property "
        "show_flag_values",
        "typing": "Self LiteralString Never assert_never assert_type reveal_type dataclass_transform "
        "Required NotRequired TypeVarTuple Unpack get_overloads clear_overloads",
        "datetime": "UTC",
        "asyncio": "TaskGroup timeout timeout_at Runner Barrier",
        "contextlib": "chdir",
        "hashlib": "file_digest",
        "operator": "call",
        "inspect": "getmembers_static",
        "logging": "getLevelNamesMapping",
        "math": "cbrt exp2",
        "builtins": "ExceptionGroup BaseExceptionGroup",
        "tomllib": "*",
        "wsgiref.types": "*",
    },
    (3, 12): {
        "itertools": "batched",
        "typing": "override TypeAliasType",
        "calendar": "Month Day",
        "pathlib": "UnsupportedOperation",
    },
    (3, 13): {"warnings": "deprecated", "copy": "replace", "typing": "ReadOnly TypeIs NoDefault"},
}


def floor() -> tuple[int, int]:
    profiles = json.loads((ROOT / "app/gaudi_cluster/settings/profiles.json").read_text())["profiles"]
    versions = {tuple(int(part) for part in p["python"].split(".")) for p in profiles.values()}
    return min((3, 11), *versions)  # 3.11: the cpu image (Debian 12)


def newer_than(version: tuple[int, int]) -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for added, modules in NEWER.items():
        if added > version:
            for module, words in modules.items():
                names.setdefault(module, set()).update(words.split())
    return names


def findings(tree: ast.AST, newer: dict[str, set[str]]) -> list[str]:
    """`module.name`, `from module import name`, `import module` and bare builtins newer than the floor."""
    found = []
    aliases = {}  # local name -> module
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if newer.get(alias.name) == {"*"}:
                    found.append(f"line {node.lineno}: import {alias.name}")
                aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module in newer:
            wanted = newer[node.module]
            for alias in node.names:
                if "*" in wanted or alias.name in wanted:
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
        elif getattr(ast, "TryStar", None) and isinstance(node, ast.TryStar):
            found.append(f"line {node.lineno}: except* (3.11)")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = aliases.get(node.value.id)
            if module in newer and node.attr in newer[module]:
                found.append(f"line {node.lineno}: {module}.{node.attr}")
        elif isinstance(node, ast.Name) and node.id in newer.get("builtins", set()):
            found.append(f"line {node.lineno}: {node.id}")
    return found


def shipped_files() -> list[Path]:
    return sorted(p for base in SHIPPED for p in base.rglob("*.py") if "__pycache__" not in p.parts)


def test_the_floor_is_what_the_package_declares():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = re.fullmatch(r">=(\d+)\.(\d+)", project["project"]["requires-python"])
    assert declared, project["project"]["requires-python"]
    assert (int(declared[1]), int(declared[2])) <= floor(), (
        f"requires-python {project['project']['requires-python']} is above the oldest image Python {floor()}"
    )
    target = project["tool"]["ruff"]["target-version"]
    assert target == "py{}{}".format(*floor()), f"ruff's target-version {target} is not the floor {floor()}"


@pytest.mark.parametrize("path", shipped_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_stdlib_name_newer_than_the_oldest_image_python(path):
    newer = newer_than(floor())
    found = findings(ast.parse(path.read_text(), filename=str(path)), newer)
    assert not found, (
        f"{path.relative_to(ROOT)} uses names Python {'.'.join(map(str, floor()))} lacks (the gaudi image's "
        f"Python, profiles.json): {found}; fix: a 3.10 spelling (e.g. gaudi_cluster.wire.kinds.StrEnum)"
    )


def test_the_check_finds_what_broke_the_gaudi_image():
    source = "import enum\nclass A(enum.StrEnum):\n    X = 'x'\nfrom typing import Self\nimport tomllib\n"
    found = findings(ast.parse(source), newer_than((3, 10)))
    assert found == [
        "line 4: from typing import Self",
        "line 5: import tomllib",
        "line 2: enum.StrEnum",
    ]
    assert findings(ast.parse(source), newer_than((3, 11))) == []

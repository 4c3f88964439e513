"""What DeepSpeed's PDSH runner, pdsh and the remote shell do to a command line, for the plan and
env-file tests.

The quoting functions are lifted from the installed DeepSpeed source with `ast` (importing
deepspeed would import torch: seconds per test run), so a DeepSpeed upgrade that changes the
quoting fails these tests; a copy of the known behaviour stands in when DeepSpeed is absent.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


def deepspeed_launcher_file(name: str) -> Path | None:
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "launcher" / name
    return path if path.is_file() else None


def _method(path: Path, cls: str, method: str) -> Callable[..., object]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    module = ast.Module(body=[item], type_ignores=[])
                    namespace: dict[str, object] = {"re": re}
                    exec(compile(module, str(path), "exec"), namespace)
                    return namespace[method]  # type: ignore[return-value]
    raise LookupError(f"{cls}.{method} not found in {path}")


def _model_parse_user_args(self: object) -> list[str]:
    out = []
    for arg in self.args.user_args:  # type: ignore[attr-defined]
        out.append('"{}"'.format(arg.replace('"', '\\"')) if " " in arg else arg)
    return out


def _model_add_export(self: object, key: str, var: str) -> None:
    var = var.strip()
    if re.search(r"[^\w@%+=:,./-]", var):
        var = f'"{var}"'
    self.exports[key.strip()] = var  # type: ignore[attr-defined]


_RUNNER = deepspeed_launcher_file("multinode_runner.py")
USING_REAL_DEEPSPEED = _RUNNER is not None
_parse_user_args = _method(_RUNNER, "PDSHRunner", "parse_user_args") if _RUNNER else _model_parse_user_args
_add_export = _method(_RUNNER, "MultiNodeRunner", "add_export") if _RUNNER else _model_add_export


def ds_parse_user_args(user_args: Sequence[str]) -> list[str]:
    fake = types.SimpleNamespace(args=types.SimpleNamespace(user_args=list(user_args)))
    return list(_parse_user_args(fake))  # type: ignore[arg-type]


def ds_exports_from_env_file(text: str) -> dict[str, str]:
    """runner.py's reader: readlines, split on the first '=', add_export."""
    fake = types.SimpleNamespace(exports={})
    for line in text.splitlines(keepends=True):
        key, val = line.split("=", maxsplit=1)
        _add_export(fake, key, val)
    return fake.exports


def pdsh_substitute(arg: str, host: str, rank: int, user: str = "root") -> str:
    """pdsh rewrites %h, %u, %n and %% in every remote command argument (checked with pdsh 2.34)."""
    return re.sub(r"%([hun%])", lambda m: {"h": host, "u": user, "n": str(rank), "%": "%"}[m.group(1)], arg)


PRINTER = (
    "import json, os, sys\n"
    "print(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ), 'cwd': os.getcwd()}))\n"
)


def pdsh_command_args(
    *, exports: Mapping[str, str], cwd: str, python: str, runner_argv: Sequence[str], world_info: str = "e30="
) -> list[str]:
    """The remote-command part of PDSHRunner.get_cmd for the runner argv our plan produces."""
    i = runner_argv.index("--module") if "--module" in runner_argv else runner_argv.index("--no_python")
    flag, user_script, user_args = runner_argv[i], runner_argv[i + 1], runner_argv[i + 2 :]
    opts = {k: runner_argv[runner_argv.index(k) + 1] for k in ("--master_addr", "--master_port")}
    export_str = "".join(f"export {k}={v}; " for k, v in exports.items())
    launch = [
        export_str,
        f"cd {os.path.abspath(cwd)};",
        python,
        "-u",
        "-m",
        "deepspeed.launcher.launch",
        f"--world_info={world_info}",
        "--node_rank=%n",
        f"--master_addr={opts['--master_addr']}",
        f"--master_port={opts['--master_port']}",
        flag,
        "--no_local_rank",
    ]
    return [*launch, user_script, *ds_parse_user_args(user_args)]


def run_remote(command_args: Sequence[str], host: str, rank: int, tmp: Path) -> dict:
    """pdsh substitution, ssh's join with spaces, then the remote login shell (bash -c)."""
    line = " ".join(pdsh_substitute(a, host, rank) for a in command_args)
    done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, check=False, cwd=tmp)
    assert done.returncode == 0, (line, done.stderr)
    return json.loads(done.stdout)


def make_printer(tmp: Path) -> str:
    """An executable standing in for the remote python: prints its argv, env and cwd as JSON."""
    path = tmp / "printer"
    path.write_text(f"#!{sys.executable}\n{PRINTER}")
    path.chmod(0o755)
    return str(path)


def make_fake_ssh(tmp: Path) -> Path:
    """A directory with an `ssh` that runs the remote command locally, as sshd would (bash -c)."""
    bindir = tmp / "fakebin"
    bindir.mkdir()
    ssh = bindir / "ssh"
    # pdsh passes its ssh options, the host, then the command words; sshd joins the words.
    ssh.write_text(
        "#!/bin/bash\n"
        'while [ $# -gt 0 ] && [ "$1" != "$FAKE_SSH_HOST" ]; do shift; done\n'
        "shift\n"
        'exec bash -c "$*"\n'
    )
    ssh.chmod(0o755)
    return bindir

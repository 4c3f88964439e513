"""Run what gaudi_spawn.py / DistributedRunner ask for through the same supervised master path.

`compat` translates their arguments (pure); this module runs the result. `main` is the one parser
front end of `gaudi-cluster spawn` and `gaudi_spawn.py`. DistributedRunner takes an injectable
`run=` callable (as Ray's command runner takes a process runner), so tests can record the requests.

DistributedRunner's commands are strings that optimum-habana runs through bash; here too, bash
expands each command's words ($VAR, ~, globs, as optimum-habana's users expect), and the words then
run as argv under the agents. Shell operators (; | & < > and parentheses) are refused: they cannot
mean anything once the command is split into ranks.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from gaudi_cluster.compat.translate import (
    DEFAULT_MASTER_PORT,
    SpawnConfigError,
    SpawnInvocation,
    SpawnRequest,
    check_launcher_choice,
    config_for_spawn,
    options_for_spawn,
    parse_gaudi_spawn_args,
    validate_spawn_request,
)
from gaudi_cluster.errors import GaudiClusterError, error_line, exit_code_for
from gaudi_cluster.master import run_master
from gaudi_cluster.nodes import probe
from gaudi_cluster.nodes.world import read_hostfile
from gaudi_cluster.settings.config import resolve_config
from gaudi_cluster.view.logs import configure_logging

SpawnRunner = Callable[[SpawnRequest, bool], int | None]
_OPERATORS = ";&|<>()"
_EXPANDED = set("$~*?[{`")


def parse_spawn_args(argv: Sequence[str], prog: str = "gaudi_spawn.py") -> SpawnInvocation:
    """gaudi_spawn.py's arguments, checked against this node's files (the script, the hostfile)."""
    return parse_gaudi_spawn_args(
        argv, prog=prog, exists=os.path.exists, load_hostfile=read_hostfile, cwd=os.getcwd()
    )


def run_spawn(
    request: SpawnRequest,
    dry_run: bool = False,
    environ: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    topology: Callable[[], tuple[int, int] | None] = probe.cpu_topology,
) -> int:
    """`topology`: this node's sockets and cores, as optimum-habana reads them for --use_mpi (lscpu)."""
    environ = os.environ if environ is None else environ
    config = config_for_spawn(request, resolve_config({}, environ), dry_run)
    argv = [request.script, *request.script_args]
    options = options_for_spawn(request, topology() if request.use_mpi else None)
    return run_master(config, argv, environ, out or sys.stdout, options)


def command_words(command: str, index: int) -> list[str]:
    """One DistributedRunner command as argv, expanded by bash like optimum-habana's run() does."""
    where = f"command_list[{index}] {command!r}"
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=_OPERATORS)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError as exc:
        raise SpawnConfigError(f"{where} cannot be split ({exc}); fix: balance the quotes") from None
    operators = [t for t in tokens if t and set(t) <= set(_OPERATORS)]
    if operators:
        raise SpawnConfigError(
            f"{where} holds the shell operator '{operators[0]}'; fix: give one command per list entry "
            "(they run in order) and put redirections in the script"
        )
    if not tokens:
        raise SpawnConfigError(f"command_list[{index}] is empty; fix: give 'script.py args' or drop it")
    if not _EXPANDED & set(command):
        return shlex.split(command)
    done = subprocess.run(
        ["bash", "-c", 'printf "%s\\0" ' + command], capture_output=True, timeout=30, check=False
    )
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["failed"]
        raise SpawnConfigError(f"{where}: bash cannot expand it ({detail[0]}); fix: check its $ and quotes")
    return [word.decode() for word in done.stdout.split(b"\0")[:-1]]


def commands_from_list(command_list: object) -> list[list[str]]:
    if isinstance(command_list, str | bytes):
        raise SpawnConfigError(
            "command_list is one string, not a list of strings; fix: pass ['script.py --arg value']"
        )
    if not isinstance(command_list, Sequence) or not all(isinstance(c, str) for c in command_list):
        raise SpawnConfigError("command_list must be a list of strings; fix: pass ['script.py --arg value']")
    return [command_words(command, i) for i, command in enumerate(command_list)]


class DistributedRunner:
    """Drop-in for optimum.habana.distributed.DistributedRunner (same constructor arguments)."""

    def __init__(
        self,
        command_list: Sequence[str] | None = None,
        world_size: int = 1,
        hostfile: str | Path | None = None,
        use_mpi: bool = False,
        use_deepspeed: bool = False,
        master_port: int = DEFAULT_MASTER_PORT,
        use_env: bool = False,
        map_by: str = "socket",
        multi_hls: object = None,
        *,
        dry_run: bool = False,
        run: SpawnRunner = run_spawn,
    ) -> None:
        if multi_hls is not None:
            warnings.warn("multi_hls is deprecated and ignored", DeprecationWarning, stacklevel=2)
        check_launcher_choice(use_mpi, use_deepspeed, hostfile, as_arguments=True)
        if isinstance(world_size, bool) or not isinstance(world_size, int):
            raise SpawnConfigError(f"world_size={world_size!r} is not an integer; fix: pass the device count")
        self.commands = commands_from_list([] if command_list is None else command_list)
        self.command_list = list(command_list or [])
        self.world_size = world_size
        self.hostfile = None if hostfile is None else str(hostfile)
        self.use_mpi = use_mpi
        self.use_deepspeed = use_deepspeed
        self.master_port = master_port
        self.use_env = use_env
        self.map_by = map_by
        self.dry_run = dry_run
        self._run = run

    def requests(self) -> list[SpawnRequest]:
        return [
            validate_spawn_request(
                SpawnRequest(
                    script=argv[0],
                    script_args=tuple(argv[1:]),
                    world_size=self.world_size,
                    hostfile=self.hostfile,
                    use_mpi=self.use_mpi,
                    use_deepspeed=self.use_deepspeed,
                    master_port=self.master_port,
                    use_env=self.use_env,
                    map_by=self.map_by,
                    # The original ignores world_size with a hostfile; only a non-default value can conflict.
                    world_size_explicit=self.world_size != 1,
                ),
                exists=os.path.exists,
                load_hostfile=read_hostfile,
                cwd=os.getcwd(),
            )
            for argv in self.commands
        ]

    def run(self) -> int | None:
        """Run the commands in order; the first non-zero exit code stops and is returned, else None
        (as optimum-habana's run(): gaudi_spawn.py's sys.exit(None) is exit status 0)."""
        for request in self.requests():
            code = self._run(request, self.dry_run)
            if code:
                return int(code)
        return None


def main(argv: Sequence[str], prog: str, run: SpawnRunner = run_spawn) -> int:
    """`gaudi-cluster spawn ...` and gaudi_spawn.py: parse like gaudi_spawn.py, run; errors -> codes."""
    try:
        invocation = parse_spawn_args(argv, prog)
        configure_logging(invocation.verbose)
        # GAUDI_CLUSTER_DRY_RUN and every other setting in the environment, checked like the master's.
        dry_run = invocation.dry_run or resolve_config({}, os.environ).dry_run
        return int(run(invocation.request, dry_run) or 0)
    except GaudiClusterError as error:
        print(error_line(error, prog, tag_bad_input_only=True), file=sys.stderr)
        return exit_code_for(error)

"""optimum-habana compatibility: gaudi_spawn.py's flags and DistributedRunner's constructor, translated
into a SpawnRequest that `gaudi_cluster.launch.run_spawn` executes.

Differences from the original, all on purpose: errors are one-line ConfigErrors (also ValueErrors,
so callers catching ValueError keep working); an explicit --world_size that contradicts the
hostfile is refused instead of silently ignored; arguments are passed as argv, never re-joined
into a bash line, so quotes, spaces and '$' reach the script verbatim; run() returns 0, not None.
"""

from __future__ import annotations

import argparse
import os
import shlex
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn

from gaudi_cluster.errors import ConfigError
from gaudi_cluster.hostfile import Hostfile, read_hostfile

DEFAULT_MASTER_PORT = 29500


class SpawnConfigError(ConfigError, ValueError):
    """ConfigError that optimum-habana callers can still catch as the ValueError they expect."""


@dataclass(frozen=True)
class SpawnRequest:
    script: str
    script_args: tuple[str, ...]
    world_size: int
    hostfile: str | None
    use_mpi: bool
    use_deepspeed: bool
    master_port: int
    use_env: bool = False
    map_by: str = "socket"
    # Whether the user chose world_size (flag given) or it is the default / the hostfile's total.
    world_size_explicit: bool = False


def validate_spawn_request(
    req: SpawnRequest,
    *,
    exists: Callable[[str], bool] = os.path.exists,
    load_hostfile: Callable[[str], Hostfile] = read_hostfile,
) -> SpawnRequest:
    """The request with world_size taken from the hostfile when one is given; ConfigError otherwise."""
    if req.use_mpi and req.use_deepspeed:
        raise SpawnConfigError("--use_mpi and --use_deepspeed were both given; fix: choose one launcher")
    if req.hostfile is not None and not req.use_deepspeed:
        raise SpawnConfigError(
            f"--hostfile {req.hostfile} needs --use_deepspeed (multi-node runs go through DeepSpeed); "
            "fix: add --use_deepspeed"
        )
    if not 1 <= req.master_port <= 65535:
        raise SpawnConfigError(f"--master_port {req.master_port} is not a TCP port; fix: use 1024-65535")
    if not req.script:
        raise SpawnConfigError("no training script was given; fix: put the script path after the options")
    if not req.script.startswith("-") and not exists(req.script):
        raise SpawnConfigError(
            f"training script '{req.script}' does not exist (cwd {os.getcwd()}); fix: pass an existing path"
        )
    if req.hostfile is not None:
        total = load_hostfile(req.hostfile).world_size
        if req.world_size_explicit and req.world_size != total:
            raise SpawnConfigError(
                f"--world_size {req.world_size} contradicts hostfile {req.hostfile}, whose slots add up to "
                f"{total}; fix: drop --world_size or make it {total}"
            )
        return replace(req, world_size=total)
    if req.world_size < 1:
        raise SpawnConfigError(f"--world_size {req.world_size} is below 1; fix: use the number of devices")
    return req


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise SpawnConfigError(f"{message}; fix: see 'gaudi_spawn.py --help'")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="gaudi_spawn.py",
        description="Run a training script on Gaudi devices, one node or many (optimum-habana compatible).",
    )
    p.add_argument("--world_size", type=int, default=None, help="Number of devices to use (default 1)")
    p.add_argument("--hostfile", type=str, default=None, help="Path to the hostfile (multi-node, DeepSpeed)")
    p.add_argument("--use_mpi", action="store_true", help="Use MPI (single node)")
    p.add_argument("--use_deepspeed", action="store_true", help="Use DeepSpeed")
    p.add_argument(
        "--master_port", type=int, default=DEFAULT_MASTER_PORT, help="Master port used by DeepSpeed and MPI"
    )
    p.add_argument("training_script", type=str, help="Path to the single-device training script")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER, help="Arguments of the training script")
    return p


def parse_gaudi_spawn_args(
    argv: Sequence[str],
    *,
    exists: Callable[[str], bool] = os.path.exists,
    load_hostfile: Callable[[str], Hostfile] = read_hostfile,
) -> SpawnRequest:
    ns = _parser().parse_args(list(argv))
    req = SpawnRequest(
        script=ns.training_script,
        script_args=tuple(ns.training_script_args),
        world_size=1 if ns.world_size is None else ns.world_size,
        hostfile=ns.hostfile,
        use_mpi=ns.use_mpi,
        use_deepspeed=ns.use_deepspeed,
        master_port=ns.master_port,
        world_size_explicit=ns.world_size is not None,
    )
    return validate_spawn_request(req, exists=exists, load_hostfile=load_hostfile)


def command_from_list(command_list: Sequence[str]) -> list[list[str]]:
    """DistributedRunner's "script.py --a b" strings as argv lists (shell-style splitting)."""
    commands: list[list[str]] = []
    for i, cmd in enumerate(command_list):
        try:
            argv = shlex.split(cmd)
        except ValueError as exc:
            raise SpawnConfigError(
                f"command_list[{i}] {cmd!r} cannot be split ({exc}); fix: balance the quotes"
            ) from None
        if not argv:
            raise SpawnConfigError(f"command_list[{i}] is empty; fix: give 'script.py args' or drop it")
        commands.append(argv)
    return commands


def _run_spawn(request: SpawnRequest, dry_run: bool) -> int:
    # Imported here so the pure parsing above has no runtime dependency, and tests can swap it.
    from gaudi_cluster.launch import run_spawn

    code = run_spawn(request, dry_run=dry_run)
    return 0 if code is None else int(code)


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
    ) -> None:
        if multi_hls is not None:
            warnings.warn("multi_hls is deprecated and ignored", DeprecationWarning, stacklevel=2)
        if use_mpi and use_deepspeed:
            raise SpawnConfigError("use_mpi and use_deepspeed were both set; fix: choose one launcher")
        if hostfile is not None and not use_deepspeed:
            raise SpawnConfigError(
                f"hostfile {hostfile} needs use_deepspeed=True (multi-node runs go through DeepSpeed); "
                "fix: pass use_deepspeed=True"
            )
        self.command_list = list(command_list or [])
        self.world_size = world_size
        self.hostfile = None if hostfile is None else str(hostfile)
        self.use_mpi = use_mpi
        self.use_deepspeed = use_deepspeed
        self.master_port = master_port
        self.use_env = use_env
        self.map_by = map_by
        self.dry_run = dry_run

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
                )
            )
            for argv in command_from_list(self.command_list)
        ]

    def run(self) -> int:
        """Run the commands in order; the first non-zero exit code stops and is returned, else 0."""
        for request in self.requests():
            code = _run_spawn(request, self.dry_run)
            if code != 0:
                return code
        return 0


def spawn_main(argv: Sequence[str], *, dry_run: bool) -> int:
    """`gaudi-cluster spawn ...` and gaudi_spawn.py: parse like gaudi_spawn.py, then run."""
    return _run_spawn(parse_gaudi_spawn_args(argv), dry_run)

"""optimum-habana compatibility, pure: gaudi_spawn.py's flags and DistributedRunner's commands translated
into a SpawnRequest, and a SpawnRequest into the ClusterConfig the master runs (see `spawn`).

Differences from the original, all on purpose: errors are one-line ConfigErrors (also ValueErrors,
so callers catching ValueError keep working); an explicit --world_size that contradicts the
hostfile is refused instead of silently ignored; arguments are passed as argv, never re-joined
into a bash line, so quotes, spaces and '$' reach the script verbatim; run() returns 0, not None.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import NoReturn

from gaudi_cluster.config import ClusterConfig
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


def config_for_spawn(request: SpawnRequest, base: ClusterConfig, dry_run: bool) -> ClusterConfig:
    """The master's configuration for a spawn: the launcher and port asked for, the hostfile as the
    only peer source, or this node alone with world_size slots."""
    launcher = "mpirun" if request.use_mpi else "deepspeed" if request.use_deepspeed else "torchrun"
    config = replace(
        base, launcher=launcher, master_port=request.master_port, dry_run=dry_run or base.dry_run
    )
    if request.hostfile:
        # The hostfile names every node, the master included: it is the only peer source.
        return replace(config, hostfile=request.hostfile, peers=None, peers_dns=None, nodes=None)
    return replace(config, hostfile=None, peers=None, peers_dns=None, nodes=None, slots=request.world_size)

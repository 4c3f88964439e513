"""Run what gaudi_spawn.py / DistributedRunner ask for through the same supervised master path.

`compat` translates their arguments (pure); this module runs the result. DistributedRunner takes
an injectable `run=` callable (as Ray's command runner takes a process runner), so tests can record
the requests instead of launching anything.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from gaudi_cluster.compat import (
    DEFAULT_MASTER_PORT,
    SpawnConfigError,
    SpawnRequest,
    command_from_list,
    config_for_spawn,
    parse_gaudi_spawn_args,
    validate_spawn_request,
)
from gaudi_cluster.config import resolve_config
from gaudi_cluster.master import run_master

SpawnRunner = Callable[[SpawnRequest, bool], int]


def run_spawn(
    request: SpawnRequest,
    dry_run: bool = False,
    environ: Mapping[str, str] | None = None,
    out: TextIO | None = None,
) -> int:
    environ = os.environ if environ is None else environ
    config = config_for_spawn(request, resolve_config({}, environ), dry_run)
    return run_master(config, [request.script, *request.script_args], environ, out or sys.stdout)


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
                )
            )
            for argv in command_from_list(self.command_list)
        ]

    def run(self) -> int:
        """Run the commands in order; the first non-zero exit code stops and is returned, else 0."""
        for request in self.requests():
            code = self._run(request, self.dry_run)
            if code:
                return int(code)
        return 0


def spawn_main(argv: Sequence[str], *, dry_run: bool, run: SpawnRunner = run_spawn) -> int:
    """`gaudi-cluster spawn ...` and gaudi_spawn.py: parse like gaudi_spawn.py, then run."""
    return run(parse_gaudi_spawn_args(argv), dry_run)

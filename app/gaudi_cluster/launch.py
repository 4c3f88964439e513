"""Run what gaudi_spawn.py / DistributedRunner ask for through the same supervised master path."""

from __future__ import annotations

import os
import sys
from dataclasses import replace

from gaudi_cluster.compat import SpawnRequest
from gaudi_cluster.config import ClusterConfig, resolve_config
from gaudi_cluster.roles import run_master


def config_for_spawn(request: SpawnRequest, base: ClusterConfig, dry_run: bool) -> ClusterConfig:
    launcher = "mpirun" if request.use_mpi else "deepspeed" if request.use_deepspeed else "torchrun"
    config = replace(
        base, launcher=launcher, master_port=request.master_port, dry_run=dry_run or base.dry_run
    )
    if request.hostfile:
        # The hostfile names every node, the master included: it is the only peer source.
        return replace(config, hostfile=request.hostfile, peers=None, peers_dns=None, nodes=None)
    return replace(config, hostfile=None, peers=None, peers_dns=None, nodes=None, slots=request.world_size)


def run_spawn(request: SpawnRequest, *, dry_run: bool = False) -> int:
    config = config_for_spawn(request, resolve_config({}, os.environ), dry_run)
    return run_master(config, [request.script, *request.script_args], os.environ, sys.stdout)

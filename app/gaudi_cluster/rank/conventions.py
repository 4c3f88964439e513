"""The conventions of others a rank agent follows: the rank's identity in the torch/DeepSpeed or
OpenMPI variables its launcher set, DeepSpeed's `--local_rank=N` argument, and transformers'
`--output_dir`. Pure.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


def with_local_rank(program: Sequence[str], local_rank: int) -> list[str]:
    """The program with `--local_rank=N` right after its script or module, where DeepSpeed's
    launch.py puts it (for scripts that still parse the flag instead of reading LOCAL_RANK)."""
    argv = list(program)
    at = 1
    if os.path.basename(argv[0]).startswith("python"):
        at = 1
        while at < len(argv) and argv[at].startswith("-") and argv[at] != "-m":
            at += 1
        at += 2 if at < len(argv) and argv[at] == "-m" else 1
    return [*argv[:at], f"--local_rank={local_rank}", *argv[at:]]


def output_dir_in(program: Sequence[str]) -> str | None:
    """The program's --output_dir (the transformers convention), as `--output_dir X` or `--output_dir=X`."""
    for word, following in zip(program, [*program[1:], None], strict=True):
        if word.startswith("--output_dir="):
            return word.split("=", 1)[1]
        if word == "--output_dir" and following is not None:
            return following
    return None


@dataclass(frozen=True)
class RankIdentity:
    rank: int
    local_rank: int
    world: int
    local_world: int


def rank_identity(environ: Mapping[str, str]) -> RankIdentity:
    """The rank's place in the job from torch/deepspeed or OpenMPI variables."""

    def first(*names: str, default: int) -> int:
        for name in names:
            if environ.get(name, "").strip():
                return int(environ[name])
        return default

    rank = first("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", default=0)
    local_rank = first("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", default=0)
    world = first("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", default=1)
    local_world = first("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", default=1)
    return RankIdentity(rank, local_rank, world, local_world)


SHM_DIR = Path("/dev/shm")  # where shm_open's names live on Linux


def deepspeed_shm_buffer(environ: Mapping[str, str], rank: int, uid: int) -> str:
    """The /dev/shm name of the all-reduce buffer DeepSpeed's CPU shm op makes for a rank when all
    ranks share one node (deepspeed/ops/csrc/cpu/comm/shm.cpp: its prefix, the uid, MASTER_ADDR,
    MASTER_PORT and the rank). DeepSpeed never unlinks it, so each such rank leaves 67 MB of shared
    memory behind on its node."""
    addr, port = environ.get("MASTER_ADDR", ""), environ.get("MASTER_PORT", "")
    return f"deepspeed_allreduce_buffer_{uid}_{addr}_{port}_{rank}"

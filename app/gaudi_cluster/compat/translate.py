"""optimum-habana compatibility, pure: gaudi_spawn.py's flags (plus the DeepSpeed runner flags users
pass through it) and DistributedRunner's commands translated into a SpawnRequest, and a SpawnRequest
into the configuration and launch options the master runs (see `spawn`).

Differences from the original, all on purpose: errors are one-line ConfigErrors (also ValueErrors,
so callers catching ValueError keep working); an explicit --world_size that contradicts the
hostfile is refused instead of silently ignored.

As the original: `--use_mpi` binds each rank to its share of the node's cores (`plan.mpi_binding`: PE =
sockets x cores per socket // ranks, mapped by socket, by slot with one core per socket) and mpirun
reports the bindings; one card runs one plain process whatever the launcher flag; `use_env` only
concerns the torch.distributed run, whose ranks read LOCAL_RANK from the environment and never get
--local_rank (what use_env asks for: torch.distributed.run itself refuses the --use_env flag the
original appends, so it is not passed on).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import NoReturn

from gaudi_cluster.errors import ConfigError
from gaudi_cluster.launch.plan import LaunchOptions, mpi_binding
from gaudi_cluster.nodes.hostfile import Hostfile, active_resources
from gaudi_cluster.settings.config import ClusterConfig
from gaudi_cluster.wire.kinds import LauncherName

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
    # DeepSpeed runner flags, with DeepSpeed's meaning (`deepspeed --help`).
    include: str = ""
    exclude: str = ""
    num_nodes: int | None = None
    num_gpus: int | None = None
    master_addr: str | None = None
    ssh_port: int | None = None
    launcher_args: str = ""
    bind_cores_to_rank: bool = False
    bind_core_list: str | None = None


def _check_deepspeed_flags(req: SpawnRequest) -> None:
    deepspeed_only = [
        flag
        for flag, given in (
            ("--include", req.include),
            ("--exclude", req.exclude),
            ("--num_nodes", req.num_nodes is not None),
            ("--bind_cores_to_rank", req.bind_cores_to_rank),
            ("--bind_core_list", req.bind_core_list),
        )
        if given
    ]
    if deepspeed_only and not req.use_deepspeed:
        flag = deepspeed_only[0]
        raise SpawnConfigError(f"{flag} is a DeepSpeed runner flag; fix: add --use_deepspeed or drop {flag}")
    if req.include and req.exclude:
        raise SpawnConfigError(
            "--include and --exclude were both given; fix: keep one (DeepSpeed refuses both)"
        )
    if (req.include or req.exclude) and (req.num_nodes is not None or req.num_gpus is not None):
        raise SpawnConfigError(
            "--num_nodes/--num_gpus cannot be combined with --include/--exclude (DeepSpeed refuses it too); "
            "fix: keep one kind"
        )
    for flag, value in (("--num_nodes", req.num_nodes), ("--num_gpus", req.num_gpus)):
        if value is not None and value < 1:
            raise SpawnConfigError(f"{flag} {value} is below 1; fix: give a positive count")
    if req.num_nodes is not None and req.num_nodes > 1 and req.hostfile is None:
        raise SpawnConfigError(
            f"--num_nodes {req.num_nodes} needs a hostfile listing the nodes; fix: add --hostfile H"
        )
    if req.ssh_port is not None and not 1 <= req.ssh_port <= 65535:
        raise SpawnConfigError(f"--ssh_port {req.ssh_port} is not a TCP port; fix: use 1-65535")


def check_launcher_choice(
    use_mpi: bool, use_deepspeed: bool, hostfile: str | os.PathLike[str] | None, *, as_arguments: bool = False
) -> None:
    """One launcher at most, and DeepSpeed for a hostfile. Checked for gaudi_spawn.py's flags and,
    as soon as it is built, for DistributedRunner (`as_arguments`: the names are its keywords)."""

    def name(option: str) -> str:
        return option if as_arguments else f"--{option}"

    if use_mpi and use_deepspeed:
        verb = "set" if as_arguments else "given"
        raise SpawnConfigError(
            f"{name('use_mpi')} and {name('use_deepspeed')} were both {verb}; fix: choose one launcher"
        )
    if hostfile is not None and not use_deepspeed:
        deepspeed, fix = ("use_deepspeed=True", "pass") if as_arguments else ("--use_deepspeed", "add")
        raise SpawnConfigError(
            f"{name('hostfile')} {hostfile} needs {deepspeed} (multi-node runs go through DeepSpeed); "
            f"fix: {fix} {deepspeed}"
        )


def validate_spawn_request(
    req: SpawnRequest, *, exists: Callable[[str], bool], load_hostfile: Callable[[str], Hostfile], cwd: str
) -> SpawnRequest:
    """The request with world_size taken from the hostfile when one is given; ConfigError otherwise.
    The node's files come in as `exists`, `load_hostfile` and `cwd` (spawn passes the real ones)."""
    check_launcher_choice(req.use_mpi, req.use_deepspeed, req.hostfile)
    if not 1024 <= req.master_port <= 65535:
        raise SpawnConfigError(
            f"--master_port {req.master_port} is not a rendezvous port (1024-65535, unprivileged); "
            f"fix: --master_port {DEFAULT_MASTER_PORT}"
        )
    if not req.script:
        raise SpawnConfigError("no training script was given; fix: put the script path after the options")
    if not req.script.startswith("-") and not exists(req.script):
        raise SpawnConfigError(
            f"training script '{req.script}' does not exist (cwd {cwd}); fix: pass an existing path"
        )
    _check_deepspeed_flags(req)
    if req.hostfile is not None:
        hostfile = load_hostfile(req.hostfile)
        try:
            active = active_resources(hostfile, req.include, req.exclude, req.num_nodes, req.num_gpus)
        except ConfigError as error:
            raise SpawnConfigError(str(error)) from None
        total = sum(len(slots) for slots in active.values())
        if req.world_size_explicit and req.world_size != total:
            raise SpawnConfigError(
                f"--world_size {req.world_size} contradicts hostfile {req.hostfile}, whose slots "
                f"add up to {total}; fix: drop --world_size or make it {total}"
            )
        return replace(req, world_size=total)
    if req.num_gpus is not None:
        if req.world_size_explicit and req.world_size != req.num_gpus:
            raise SpawnConfigError(
                f"--world_size {req.world_size} and --num_gpus {req.num_gpus} disagree; fix: give one of them"
            )
        req = replace(req, world_size=req.num_gpus)
    if req.world_size < 1:
        raise SpawnConfigError(f"--world_size {req.world_size} is below 1; fix: use the number of devices")
    return req


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise SpawnConfigError(f"{message}; fix: see '{self.prog} --help'")


EPILOG = """\
Every flag goes before the training script: whatever follows the script, --dry-run included, is
the script's own argument. Each flag is taken with _ or - alike (--master_port or --master-port,
--dry-run or --dry_run), as torchrun takes them.

examples:
  %(prog)s --world_size 8 --use_mpi run_clm.py --do_train ...          one node, 8 ranks, no ssh
  %(prog)s --world_size 2 --use_deepspeed train.py --deepspeed ds.json one node through DeepSpeed
  %(prog)s --hostfile hostfile --use_deepspeed run_clm.py ...          every node of the hostfile
  %(prog)s --dry-run --hostfile hostfile --use_deepspeed run_clm.py    print what would run
"""


def spawn_parser(prog: str = "gaudi_spawn.py") -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog,
        description=(
            "Run a training script on every device of this node or of the hostfile's nodes, supervised "
            "(optimum-habana's gaudi_spawn.py, plus DeepSpeed's runner flags). Without a hostfile, or "
            "with one that names only this node, the ranks start locally with no ssh. Environment: "
            "GAUDI_CLUSTER_* settings (see `gaudi-cluster master --help`) apply too."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument(
        "--world_size", type=int, default=None, help="number of devices (ranks) on this node; default 1"
    )
    p.add_argument(
        "--hostfile", default=None, help="hostfile of every node ('host slots=N'); needs --use_deepspeed"
    )
    p.add_argument("--use_mpi", action="store_true", help="start the ranks with mpirun (one node)")
    p.add_argument("--use_deepspeed", action="store_true", help="start the ranks with DeepSpeed's launcher")
    p.add_argument(
        "--master_port",
        type=int,
        default=DEFAULT_MASTER_PORT,
        help="rendezvous port; default 29500",
    )
    p.add_argument(
        "--dry-run",
        dest="dry_run",
        action="store_true",
        help="print hostfile, env file and command; launch nothing",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    ds = p.add_argument_group("DeepSpeed runner flags (with --use_deepspeed; DeepSpeed's meaning)")
    ds.add_argument(
        "-i", "--include", default="", help="NODE[:SLOT,...][@NODE...] to use, e.g. host1:0,1@host2"
    )
    ds.add_argument("-e", "--exclude", default="", help="NODE[:SLOT,...][@NODE...] to leave out")
    ds.add_argument("--num_nodes", type=int, default=None, help="use the first N hosts of the hostfile")
    ds.add_argument(
        "--num_gpus",
        "--num_accelerators",
        "--nproc_per_node",
        type=int,
        default=None,
        dest="num_gpus",
        help="ranks per node (every host gets slots 0..N-1)",
    )
    ds.add_argument("--master_addr", default=None, help="rendezvous address; default: the first host")
    ds.add_argument("--ssh_port", type=int, default=None, help="sshd port on every node; default 3022")
    ds.add_argument(
        "--launcher_args", default="", help="extra flags for the backend (pdsh, mpirun), one string"
    )
    ds.add_argument(
        "--bind_cores_to_rank", action="store_true", help="bind each rank to its share of the cores"
    )
    ds.add_argument("--bind_core_list", default=None, help="cores to share out, e.g. 0-47")
    p.add_argument("training_script", help="the training script (its own arguments follow it)")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    _accept_both_spellings(p)
    return p  # fmt: skip


def _accept_both_spellings(parser: argparse.ArgumentParser) -> None:
    """Every long flag also with - for _ and _ for - (--master-port = --master_port), as torchrun
    takes both; --help shows the one spelling each flag is documented with."""
    for action in list(parser._actions):
        for option in action.option_strings:
            if not option.startswith("--"):
                continue
            for other in ("--" + option[2:].replace("_", "-"), "--" + option[2:].replace("-", "_")):
                # What add_argument does, without adding the spelling to the help's list.
                parser._option_string_actions.setdefault(other, action)


@dataclass(frozen=True)
class SpawnInvocation:
    request: SpawnRequest
    dry_run: bool
    verbose: bool


def parse_gaudi_spawn_args(
    argv: Sequence[str],
    *,
    prog: str = "gaudi_spawn.py",
    exists: Callable[[str], bool],
    load_hostfile: Callable[[str], Hostfile],
    cwd: str,
) -> SpawnInvocation:
    ns = spawn_parser(prog).parse_args(list(argv))
    req = SpawnRequest(
        script=ns.training_script,
        script_args=tuple(ns.training_script_args),
        world_size=1 if ns.world_size is None else ns.world_size,
        hostfile=ns.hostfile,
        use_mpi=ns.use_mpi,
        use_deepspeed=ns.use_deepspeed,
        master_port=ns.master_port,
        world_size_explicit=ns.world_size is not None,
        include=ns.include,
        exclude=ns.exclude,
        num_nodes=ns.num_nodes,
        num_gpus=ns.num_gpus,
        master_addr=ns.master_addr,
        ssh_port=ns.ssh_port,
        launcher_args=ns.launcher_args,
        bind_cores_to_rank=ns.bind_cores_to_rank,
        bind_core_list=ns.bind_core_list,
    )
    request = validate_spawn_request(req, exists=exists, load_hostfile=load_hostfile, cwd=cwd)
    return SpawnInvocation(request, ns.dry_run, ns.verbose)


def config_for_spawn(request: SpawnRequest, base: ClusterConfig, dry_run: bool) -> ClusterConfig:
    """The master's configuration for a spawn: the launcher and ports asked for, and the hostfile as
    the only peer source, or this node alone with world_size slots."""
    # As optimum-habana: mpirun, DeepSpeed, torch.distributed.run for several cards, plain python for
    # one (here the direct launcher: one rank agent, no launcher in between).
    launcher = LauncherName.MPIRUN if request.use_mpi else LauncherName.TORCHRUN
    if request.use_deepspeed:
        launcher = LauncherName.DEEPSPEED
    elif request.world_size == 1 and request.hostfile is None:
        launcher = LauncherName.DIRECT  # optimum-habana's single card: one plain process, no mpirun
    config = replace(
        base,
        launcher=launcher,
        master_port=request.master_port,
        master_addr=request.master_addr or base.master_addr,
        ssh_port=request.ssh_port or base.ssh_port,
        dry_run=dry_run or base.dry_run,
        peers=None,
        peers_dns=None,
    )
    if request.hostfile:
        # The hostfile names every node, the master included; --num_gpus sets every host's slots.
        return replace(config, hostfile=request.hostfile, nodes=request.num_nodes, slots=request.num_gpus)
    return replace(config, hostfile=None, nodes=None, slots=request.world_size)


def options_for_spawn(request: SpawnRequest, topology: tuple[int, int] | None = None) -> LaunchOptions:
    """`topology`: this node's (sockets, cores per socket), which --use_mpi binds the ranks by."""
    # optimum-habana passes --no_local_rank to DeepSpeed except on a single card.
    single_card = request.use_deepspeed and request.hostfile is None and request.world_size == 1
    use_mpi = request.use_mpi and request.world_size > 1
    return LaunchOptions(
        mpi_binding=mpi_binding(request.world_size, topology, request.map_by) if use_mpi else None,
        include=request.include,
        exclude=request.exclude,
        bind_cores_to_rank=request.bind_cores_to_rank,
        bind_core_list=request.bind_core_list,
        launcher_args=request.launcher_args,
        local_rank_arg=single_card,
    )

"""Launch plans as values: the exact argv and added environment of a launch, what goes into one, and
what a launcher needs of the machine.

Every rank runs the rank agent (`python -u -m gaudi_cluster.rank.agent --job-id J ... -- program`), which
owns the child process, the log prefix and the heartbeat. The launchers that build plans are in
`launchers`. Nothing runs here.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from gaudi_cluster.env.envfile import mask_secrets
from gaudi_cluster.errors import ConfigError
from gaudi_cluster.nodes.hostfile import Hostfile
from gaudi_cluster.wire.node_spec import AGENT_MODULE


@dataclass(frozen=True)
class LaunchPlan:
    argv: tuple[str, ...]
    # Only what the plan adds to the launcher process's own environment (not the ranks').
    env: Mapping[str, str] = field(default_factory=dict)
    launcher: str = ""
    stdin: str | None = None  # the launcher's whole standard input (the direct launcher's node specs)
    # Whether the launcher may end with exit code 0 while its ranks run on: it handed them over to
    # their node relays once they were seated (the direct launcher's nodes reached over ssh).
    hands_over: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))


def render_shell(plan: LaunchPlan) -> str:
    """One copy-pasteable shell line for --dry-run (its stdin as a here-document)."""
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(plan.env.items()))
    cmd = shlex.join(plan.argv)
    line = f"{prefix} {cmd}" if prefix else cmd
    return f"{line} <<'SPEC'\n{plan.stdin}\nSPEC" if plan.stdin is not None else line


def log_line(plan: LaunchPlan) -> str:
    """The launch command for the master's `launching:` line: one line, token-like arguments and URL
    userinfo masked (envfile.mask_secrets)."""
    return mask_secrets(render_shell(plan).split("\n")[0])


@dataclass(frozen=True)
class AgentSettings:
    """What every rank agent of a job is told on its command line (it reads no settings itself)."""

    job_id: str
    job_root: str
    heartbeat_timeout_s: float
    control: str | None  # HOST:PORT of the master's control channel; None: unsupervised
    local_rank_arg: bool = False  # pass --local_rank=N to the script (DeepSpeed's default); else env only
    # Where the job writes, resolved once on the master, so no agent guesses it from the program's argv.
    output_dir: str | None = None
    # Once seated, the rank's lines go over its node relay, not the launcher's output (the direct
    # launcher: no ssh session has to carry them).
    output_to_relay: bool = False

    def args(self, program: Sequence[str]) -> list[str]:
        if not program:
            raise ConfigError(
                "the job has no program to run; fix: give the training command after the options"
            )
        args = ["--job-id", self.job_id, "--job-root", self.job_root]
        args += ["--heartbeat-timeout", f"{self.heartbeat_timeout_s:g}"]
        if self.control:
            args += ["--control", self.control]
        if self.local_rank_arg:
            args.append("--local-rank-arg")
        if self.output_dir:
            args += ["--output-dir", self.output_dir]
        if self.output_to_relay and self.control:
            args.append("--output-relay")
        return [*args, "--", *program]


def rank_command(agent: AgentSettings, program: Sequence[str], python: str = sys.executable) -> list[str]:
    return [python, "-u", "-m", AGENT_MODULE, *agent.args(program)]


def quote_for_pdsh(arg: str) -> str:
    """Make `arg` arrive verbatim through DeepSpeed's PDSH runner, pdsh and the remote shell.

    The runner wraps an argument containing a space in double quotes, escaping only '"'; pdsh then
    replaces %h/%u/%n/%% in every argument; ssh joins everything with spaces and the remote
    login shell parses the line. So: '%' is doubled for pdsh; an argument with a space gets the
    characters that stay special inside double quotes escaped (the runner adds the quotes);
    any other argument is single-quoted by shlex, which never introduces a space.
    """
    if " " in arg:
        quoted = arg.replace("\\", "\\\\").replace("$", "\\$").replace("`", "\\`")
    else:
        quoted = shlex.quote(arg)
    return quoted.replace("%", "%%")


def no_space(value: str, what: str) -> str:
    if not value or any(c.isspace() for c in value):
        raise ConfigError(f"{what} '{value}' is empty or contains whitespace; fix: use a path without spaces")
    return value


# What a launcher needs of the machine it runs on (its `requires()`); `launch.tools` checks them.
@dataclass(frozen=True)
class OnPath:
    """A program the launch runs here, found on PATH (or at its absolute path)."""

    tool: str
    fix: str


@dataclass(frozen=True)
class PythonModule:
    """A module the launch runs with `python -m`, importable by this interpreter."""

    module: str
    fix: str


@dataclass(frozen=True)
class OpenMpiMajor:
    """The mpirun on PATH is Open MPI of one of these major versions."""

    majors: tuple[int, ...]
    fix: str


Requirement = OnPath | PythonModule | OpenMpiMajor


@dataclass(frozen=True)
class MpiBinding:
    """optimum-habana's `--use_mpi` core binding: each rank bound to PE cores, mapped by socket (by slot
    when a socket has one core, as inside some VMs); mpirun reports the bindings it made."""

    map_by: str
    pe: int

    def args(self, rank_by: str) -> list[str]:
        """mpirun's words for it; rank_by is the Open MPI's own spelling (core on 4, slot on 5)."""
        return [
            "--bind-to",
            "core",
            "--map-by",
            f"{self.map_by}:PE={self.pe}",
            "--rank-by",
            rank_by,
            "--report-bindings",
        ]


def mpi_binding(ranks: int, topology: tuple[int, int] | None, map_by: str = "socket") -> MpiBinding | None:
    """The binding DistributedRunner computes from lscpu's sockets and cores per socket for `ranks` ranks on
    one node: PE = sockets * cores // ranks; None when the topology is unknown (then nothing is bound)."""
    if topology is None:
        return None
    sockets, cores_per_socket = topology
    if not map_by or any(c.isspace() or c == ":" for c in map_by):
        raise ConfigError(f"map_by={map_by!r} is not an mpirun mapping object; fix: use socket or slot")
    if cores_per_socket == 1:  # optimum-habana: "Running inside a VM?"
        map_by = "slot"
    pe = sockets * cores_per_socket // max(ranks, 1)
    if pe < 1:
        raise ConfigError(
            f"{ranks} ranks on {sockets * cores_per_socket} cores ({sockets} sockets x {cores_per_socket}) "
            "leave no core per rank to bind (optimum-habana would pass PE=0); fix: fewer ranks"
        )
    return MpiBinding(map_by, pe)


@dataclass(frozen=True)
class LaunchOptions:
    """DeepSpeed runner flags a gaudi_spawn.py user passed through, kept with DeepSpeed's meaning."""

    include: str = ""
    exclude: str = ""
    bind_cores_to_rank: bool = False
    bind_core_list: str | None = None
    launcher_args: str = ""
    local_rank_arg: bool = False  # the script gets --local_rank=N (DeepSpeed's default)
    mpi_binding: MpiBinding | None = None  # --use_mpi: optimum-habana's core binding for mpirun

    def runner_args(self, with_selection: bool = True) -> tuple[str, ...]:
        """The flags for DeepSpeed's runner; with_selection=False leaves out --include/--exclude, which
        every other launcher applies itself (PlanInputs.device_ids)."""
        args: list[str] = []
        if self.include and with_selection:
            args += ["--include", self.include]
        if self.exclude and with_selection:
            args += ["--exclude", self.exclude]
        if self.bind_cores_to_rank:
            args.append("--bind_cores_to_rank")
        if self.bind_core_list:
            args += ["--bind_core_list", self.bind_core_list]
        return tuple(args)


@dataclass(frozen=True)
class PlanInputs:
    """Everything a launcher needs to know about one prepared job (paths are on every node)."""

    hostfile: Hostfile
    hostfile_path: str
    env: Mapping[str, str]  # the env file's content
    env_path: str
    ssh_config_path: str | None
    ssh_port: int
    master_addr: str
    master_port: int
    program: tuple[str, ...]
    python: str
    agent: AgentSettings
    socket_ifname: str | None = None
    mpi_root: str | None = None
    openmpi_major: int = 4
    local: bool = False  # every rank on this node: no ssh, no pdsh
    this_node: str | None = None  # the hostfile entry that is this machine (started without ssh)
    cwd: str = "/"  # where the ranks run (the master's working directory, as DeepSpeed's runner does)
    # DeepSpeed runner flags passed through as given: --include/--exclude, --bind_cores_to_rank, ...
    runner_args: tuple[str, ...] = ()
    launcher_args: str = ""  # DeepSpeed's --launcher_args: extra flags for the backend (pdsh, mpirun)
    mpi_binding: MpiBinding | None = None  # mpirun binds each rank to its cores (else --bind-to none)
    # The master's environment sets Open MPI's tree-spawn parameter (every node holds the client key):
    # mpirun's default then, else the plan turns tree spawn off.
    mpi_tree_spawn: bool = False
    # Inside a Slurm allocation (nodes/srun): the srun step that starts every node's process; empty: ssh.
    srun: tuple[str, ...] = ()
    # --include/--exclude applied for a launcher other than DeepSpeed's: the device ids each host of
    # `hostfile` (then already narrowed to the selected hosts) runs its ranks on; empty: 0..slots-1.
    device_ids: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    preimport: bool = True  # the direct launcher's nodes start ranks from a pre-imported zygote
    preimport_keep_s: float = 0.0  # how long each node's zygote stays warm after the attempt

    def check_first_slots(self, launcher: str) -> None:
        """mpirun and torchrun give a node's ranks devices 0..N-1: a selection of other slots cannot hold."""
        for host, ids in self.device_ids.items():
            if ids != tuple(range(len(ids))):
                raise ConfigError(
                    f"--launcher {launcher} runs a node's ranks on its first slots, but --include/--exclude "
                    f"select slots {','.join(map(str, ids))} of {host}; fix: --launcher direct (or select "
                    "whole nodes)"
                )

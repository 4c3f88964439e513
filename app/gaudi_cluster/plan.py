"""Launch plans: the exact argv and added environment for deepspeed | mpirun | torchrun. Nothing runs here.

Every rank runs the rank agent (`python -u -m gaudi_cluster.agent --job-id J ... -- program`), which
owns the child process, the log prefix and the heartbeat. As in DeepSpeed's multinode_runner.py, each
launcher is one small class whose `plan()` returns the command without running it; `plan_for` picks
the class from the launcher's name.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from gaudi_cluster.errors import ConfigError
from gaudi_cluster.hostfile import Hostfile, render_mpi_hosts

AGENT_MODULE = "gaudi_cluster.agent"


@dataclass(frozen=True)
class LaunchPlan:
    argv: tuple[str, ...]
    # Only what the plan adds to the launcher process's own environment (not the ranks').
    env: Mapping[str, str] = field(default_factory=dict)
    launcher: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))


def render_shell(plan: LaunchPlan) -> str:
    """One copy-pasteable shell line for --dry-run."""
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(plan.env.items()))
    cmd = shlex.join(plan.argv)
    return f"{prefix} {cmd}" if prefix else cmd


@dataclass(frozen=True)
class AgentSettings:
    """What every rank agent of a job is told on its command line (it reads no settings itself)."""

    job_id: str
    job_root: str
    heartbeat_timeout_s: float
    control: str | None  # HOST:PORT of the master's control channel; None: unsupervised

    def args(self, program: Sequence[str]) -> list[str]:
        if not program:
            raise ConfigError(
                "the job has no program to run; fix: give the training command after the options"
            )
        args = ["--job-id", self.job_id, "--job-root", self.job_root]
        args += ["--heartbeat-timeout", f"{self.heartbeat_timeout_s:g}"]
        if self.control:
            args += ["--control", self.control]
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


def _no_space(value: str, what: str) -> str:
    if not value or any(c.isspace() for c in value):
        raise ConfigError(f"{what} '{value}' is empty or contains whitespace; fix: use a path without spaces")
    return value


def deepspeed_plan(
    *,
    hostfile_path: str,
    master_addr: str,
    master_port: int,
    ssh_port: int,
    env_file_path: str,
    program: Sequence[str],
    python: str = sys.executable,
    ssh_config_path: str | None = None,
    agent: AgentSettings,
    module_agent: bool = True,
) -> LaunchPlan:
    """`deepspeed` runner over pdsh, always multi-node mode (--force_multi).

    --force_multi keeps a one-host job on the pdsh path too: otherwise the runner starts the
    ranks directly (no shell, so the quoting below would be wrong) and ignores the env file.
    DS_ENV_FILE must be absolute: the runner joins it to '~' and '.', and os.path.join returns
    an absolute second part unchanged (so it reads the same file twice, harmlessly).
    """
    if not os.path.isabs(env_file_path):
        raise ConfigError(
            f"env file path '{env_file_path}' is relative (DeepSpeed would look for it under ~ and the cwd); "
            "fix: pass an absolute path"
        )
    _no_space(env_file_path, "env file path")
    argv = [
        python,
        "-m",
        "deepspeed.launcher.runner",
        "--hostfile",
        hostfile_path,
        "--master_addr",
        master_addr,
        "--master_port",
        str(master_port),
        "--ssh_port",
        str(ssh_port),
        "--no_ssh_check",
        "--no_local_rank",
        "--force_multi",
    ]
    if module_agent:
        user_script, user_args = AGENT_MODULE, agent.args(program)
        argv.append("--module")
    else:
        if not program:
            raise ConfigError(
                "the job has no program to run; fix: give the training command after the options"
            )
        user_script, user_args = program[0], list(program[1:])
        argv.append("--no_python")
    # The runner never re-quotes the script itself, so it only needs the shell and pdsh layers.
    argv += [shlex.quote(user_script).replace("%", "%%"), *(quote_for_pdsh(a) for a in user_args)]
    env = {"DS_ENV_FILE": env_file_path}
    if ssh_config_path:
        # pdsh splits this variable on whitespace, so the path must not contain any.
        env["PDSH_SSH_ARGS_APPEND"] = f"-F {_no_space(ssh_config_path, 'ssh config path')}"
    return LaunchPlan(tuple(argv), env, "deepspeed")


def mpirun_plan(
    *,
    hostfile: Hostfile,
    master_addr: str,
    master_port: int,
    ssh_port: int,
    ssh_config_path: str | None,
    env: Mapping[str, str],
    program: Sequence[str],
    python: str = sys.executable,
    agent: AgentSettings,
    mpi_root: str | None = None,
    openmpi_major: int = 4,
    socket_ifname: str | None = None,
) -> LaunchPlan:
    """OpenMPI 4 (ORTE, --mca plm_rsh_args) or 5 (PRRTE, --prtemca plm_ssh_args)."""
    if openmpi_major not in (4, 5):
        raise ConfigError(f"OpenMPI {openmpi_major} is not supported; fix: use OpenMPI 4 or 5 in the image")
    ssh_args = f"-p {ssh_port}"
    if ssh_config_path:
        ssh_args += f" -F {_no_space(ssh_config_path, 'ssh config path')}"
    argv = ["mpirun", "--allow-run-as-root"]
    if mpi_root:
        argv += ["--prefix", mpi_root]
    argv += ["-n", str(hostfile.world_size), "-H", render_mpi_hosts(hostfile), "--bind-to", "none"]
    if openmpi_major == 4:
        argv += ["--mca", "plm_rsh_args", ssh_args, "--mca", "btl", "^openib"]
        if socket_ifname:
            argv += [
                "--mca",
                "btl_tcp_if_include",
                socket_ifname,
                "--mca",
                "oob_tcp_if_include",
                socket_ifname,
            ]
    else:
        argv += ["--prtemca", "plm_ssh_args", ssh_args]
        if socket_ifname:
            argv += [
                "--mca",
                "btl_tcp_if_include",
                socket_ifname,
                "--prtemca",
                "oob_tcp_if_include",
                socket_ifname,
            ]
    exported = {k: v for k, v in env.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    for name in sorted(exported):
        argv += ["-x", f"{name}={exported[name]}"]
    argv += ["-x", f"MASTER_ADDR={master_addr}", "-x", f"MASTER_PORT={master_port}"]
    argv += rank_command(agent, program, python)
    return LaunchPlan(tuple(argv), {}, "mpirun")


def torchrun_plan(
    *,
    nproc_per_node: int,
    master_port: int,
    program: Sequence[str],
    python: str = sys.executable,
    agent: AgentSettings,
    master_addr: str = "127.0.0.1",
) -> LaunchPlan:
    """Single node. Static rendezvous rather than --standalone, which would ignore master_port
    and so could not keep two jobs on one box apart."""
    if nproc_per_node < 1:
        raise ConfigError(f"nproc_per_node={nproc_per_node} is below 1; fix: run at least one rank")
    argv = [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--node_rank",
        "0",
        "--nproc_per_node",
        str(nproc_per_node),
        "--master_addr",
        master_addr,
        "--master_port",
        str(master_port),
        "--module",
        AGENT_MODULE,
        *agent.args(program),
    ]
    return LaunchPlan(tuple(argv), {}, "torchrun")


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


class DeepSpeedLauncher:
    name = "deepspeed"

    def plan(self, inputs: PlanInputs) -> LaunchPlan:
        base = deepspeed_plan(
            hostfile_path=inputs.hostfile_path,
            master_addr=inputs.master_addr,
            master_port=inputs.master_port,
            ssh_port=inputs.ssh_port,
            env_file_path=inputs.env_path,
            program=inputs.program,
            python=inputs.python,
            ssh_config_path=inputs.ssh_config_path,
            agent=inputs.agent,
        )
        # A one-node deepspeed run skips pdsh and the env file: give the launcher the variables too.
        return LaunchPlan(base.argv, {**inputs.env, **base.env}, base.launcher)


class MpirunLauncher:
    name = "mpirun"

    def plan(self, inputs: PlanInputs) -> LaunchPlan:
        return mpirun_plan(
            hostfile=inputs.hostfile,
            master_addr=inputs.master_addr,
            master_port=inputs.master_port,
            ssh_port=inputs.ssh_port,
            ssh_config_path=inputs.ssh_config_path,
            env=inputs.env,
            program=inputs.program,
            python=inputs.python,
            agent=inputs.agent,
            mpi_root=inputs.mpi_root,
            openmpi_major=inputs.openmpi_major,
            socket_ifname=inputs.socket_ifname,
        )


class TorchrunLauncher:
    name = "torchrun"

    def plan(self, inputs: PlanInputs) -> LaunchPlan:
        if len(inputs.hostfile.entries) > 1:
            raise ConfigError(
                "--launcher torchrun runs one node only; fix: use --launcher deepspeed or mpirun"
            )
        base = torchrun_plan(
            nproc_per_node=inputs.hostfile.world_size,
            master_port=inputs.master_port,
            program=inputs.program,
            python=inputs.python,
            agent=inputs.agent,
        )
        return LaunchPlan(base.argv, {**inputs.env, **base.env}, base.launcher)


LAUNCHERS = {cls.name: cls for cls in (DeepSpeedLauncher, MpirunLauncher, TorchrunLauncher)}


def plan_for(launcher: str, inputs: PlanInputs) -> LaunchPlan:
    if launcher not in LAUNCHERS:
        raise ConfigError(f"launcher '{launcher}' is unknown; fix: use one of {', '.join(LAUNCHERS)}")
    return LAUNCHERS[launcher]().plan(inputs)

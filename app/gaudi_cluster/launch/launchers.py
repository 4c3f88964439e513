"""The launchers: one small class per name that says what it needs on this machine (`requires()`)
and returns the command without running it (`plan()`), as DeepSpeed's multinode_runner.py has
`backend_exists()` and `get_cmd()`; `launcher_named` picks the class from the launcher's name. Pure:
`launch.tools` checks the requirements against the machine.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from gaudi_cluster.errors import ConfigError
from gaudi_cluster.launch.plan import (
    AgentSettings,
    LaunchPlan,
    MpiBinding,
    OnPath,
    OpenMpiMajor,
    PlanInputs,
    PythonModule,
    Requirement,
    no_space,
    quote_for_pdsh,
    rank_command,
)
from gaudi_cluster.nodes.hostfile import Hostfile, render_mpi_hosts
from gaudi_cluster.settings import profiles
from gaudi_cluster.wire.kinds import LauncherName
from gaudi_cluster.wire.node_spec import (
    AGENT_MODULE,
    FANOUT_MODULE,
    NODE_MODULE,
    FanoutSpec,
    NodeEntry,
    NodeRelaySpec,
    NodeSpec,
)

_OTHERWISE = "or choose another launcher"
SSH = OnPath("ssh", f"install it (apt-get install openssh-client) {_OTHERWISE}")
PDSH = OnPath("pdsh", f"install it (apt-get install pdsh) {_OTHERWISE}")
MPIRUN = OnPath("mpirun", f"install it (OpenMPI: apt-get install openmpi-bin) {_OTHERWISE}")
# ORTE and PRRTE: the dialects of launch flags mpirun_plan speaks, as profiles.json records them.
_MAJORS = profiles.matrix().openmpi_majors
OPENMPI = OpenMpiMajor(
    _MAJORS, f"put an Open MPI {' or '.join(map(str, _MAJORS))} mpirun first on PATH {_OTHERWISE}"
)
DEEPSPEED = PythonModule("deepspeed", f"install DeepSpeed in this Python environment {_OTHERWISE}")
TORCH = PythonModule("torch", f"install PyTorch in this Python environment {_OTHERWISE}")


@runtime_checkable
class Launcher(Protocol):
    """A launch backend: what it needs of this machine, and the command it would run (pure)."""

    name: str

    def requires(self, inputs: PlanInputs) -> tuple[Requirement, ...]:
        """What this machine must have for the plan to run, in the order to check it."""
        ...

    def plan(self, inputs: PlanInputs) -> LaunchPlan: ...


def _python(inputs: PlanInputs) -> OnPath:
    return OnPath(inputs.python, "run gaudi-cluster from the Python environment it is installed in")


def _is_here(inputs: PlanInputs, host: str) -> bool:
    return inputs.local or host == inputs.this_node


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
    runner_args: Sequence[str] = (),
    local: bool = False,
) -> LaunchPlan:
    """`deepspeed` runner over pdsh, always multi-node mode (--force_multi) unless `local`.

    --force_multi keeps a one-host job on the pdsh path too: otherwise the runner starts the
    ranks directly (no shell, so the quoting below would be wrong) and ignores the env file.
    DS_ENV_FILE must be absolute: the runner joins it to '~' and '.', and os.path.join returns
    an absolute second part unchanged (so it reads the same file twice, harmlessly).
    A `local` plan takes the runner's own one-node path: launch.py started directly, argv passed
    verbatim (no shell, no quoting), the variables inherited from the runner's environment.
    """
    if local:
        argv = [python, "-m", "deepspeed.launcher.runner", "--hostfile", hostfile_path]
        argv += ["--master_addr", master_addr, "--master_port", str(master_port), "--no_ssh_check"]
        argv += ["--no_local_rank", *runner_args, "--module", AGENT_MODULE, *agent.args(program)]
        return LaunchPlan(tuple(argv), {}, LauncherName.DEEPSPEED)
    if not os.path.isabs(env_file_path):
        raise ConfigError(
            f"env file path '{env_file_path}' is relative (DeepSpeed would look for it under ~ and the cwd); "
            "fix: pass an absolute path"
        )
    no_space(env_file_path, "env file path")
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
        *runner_args,
        "--module",
    ]
    # The runner never re-quotes the script (a plain module name here); each argument crosses the runner's
    # quoting, pdsh and the remote shell.
    argv += [AGENT_MODULE, *(quote_for_pdsh(a) for a in agent.args(program))]
    env = {"DS_ENV_FILE": env_file_path}
    if ssh_config_path:
        # pdsh splits this variable on whitespace, so the path must not contain any.
        env["PDSH_SSH_ARGS_APPEND"] = f"-F {no_space(ssh_config_path, 'ssh config path')}"
    return LaunchPlan(tuple(argv), env, LauncherName.DEEPSPEED)


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
    launcher_args: str = "",
    local: bool = False,
    binding: MpiBinding | None = None,
    tree_spawn: bool = False,
) -> LaunchPlan:
    """Open MPI 4 (ORTE) or 5 (PRRTE), each with its own flags (profiles.json's openmpi_dialects); a
    `local` plan starts every rank on this node and never uses ssh. With a binding, each rank is bound
    to its cores as optimum-habana's --use_mpi does; without one, nothing is bound. Without
    `tree_spawn` mpirun starts every daemon itself: a worker holds no client key (make keys)."""
    dialect = profiles.matrix().dialect(openmpi_major)
    argv = ["mpirun", "--allow-run-as-root"]
    if mpi_root:
        argv += ["--prefix", mpi_root]
    argv += ["-n", str(hostfile.world_size), "-H", render_mpi_hosts(hostfile)]
    argv += binding.args(dialect.rank_by) if binding else ["--bind-to", "none"]
    if not local:
        config = f" -F {no_space(ssh_config_path, 'ssh config path')}" if ssh_config_path else ""
        argv += [*dialect.ssh_args, f"-p {ssh_port}{config}"]
        no_tree = dialect.ssh_args[1].replace("_args", "_no_tree_spawn")  # plm_rsh_* (plm_ssh_* on PRRTE)
        argv += [] if tree_spawn else [dialect.ssh_args[0], no_tree, "1"]
    argv += dialect.btl
    if socket_ifname and not local:
        argv += ["--mca", "btl_tcp_if_include", socket_ifname]
        argv += [dialect.oob_mca, "oob_tcp_if_include", socket_ifname]
    argv += shlex.split(launcher_args)
    exported = {k: v for k, v in env.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    for name in sorted(exported):
        argv += ["-x", f"{name}={exported[name]}"]
    argv += ["-x", f"MASTER_ADDR={master_addr}", "-x", f"MASTER_PORT={master_port}"]
    argv += rank_command(agent, program, python)
    return LaunchPlan(tuple(argv), {}, LauncherName.MPIRUN)


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
    return LaunchPlan(tuple(argv), {}, LauncherName.TORCHRUN)


class DeepSpeedLauncher:
    name = LauncherName.DEEPSPEED

    def requires(self, inputs: PlanInputs) -> tuple[Requirement, ...]:
        # The runner's one-node path starts launch.py itself: no pdsh.
        return (_python(inputs), DEEPSPEED) if inputs.local else (_python(inputs), DEEPSPEED, PDSH)

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
            runner_args=_runner_args(inputs),
            local=inputs.local,
        )
        # A one-node deepspeed run skips pdsh and the env file: give the launcher the variables too.
        return LaunchPlan(base.argv, {**inputs.env, **base.env}, base.launcher)


def _runner_args(inputs: PlanInputs) -> list[str]:
    launcher_args = ["--launcher_args", inputs.launcher_args] if inputs.launcher_args else []
    return [*inputs.runner_args, *launcher_args]


class MpirunLauncher:
    name = LauncherName.MPIRUN

    def requires(self, inputs: PlanInputs) -> tuple[Requirement, ...]:
        return (MPIRUN, OPENMPI)  # a local run too: mpirun starts the ranks here

    def plan(self, inputs: PlanInputs) -> LaunchPlan:
        inputs.check_first_slots(self.name)
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
            launcher_args=inputs.launcher_args,
            local=inputs.local,
            binding=inputs.mpi_binding,
            tree_spawn=inputs.mpi_tree_spawn,
        )


class TorchrunLauncher:
    name = LauncherName.TORCHRUN

    def requires(self, inputs: PlanInputs) -> tuple[Requirement, ...]:
        return (_python(inputs), TORCH)

    def plan(self, inputs: PlanInputs) -> LaunchPlan:
        inputs.check_first_slots(self.name)
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


def node_relay(agent: AgentSettings) -> NodeRelaySpec | None:
    """The relay a node process runs itself, for a supervised job (an unsupervised one has none)."""
    if agent.control is None:
        return None
    return NodeRelaySpec(agent.job_id, agent.job_root, agent.control, agent.heartbeat_timeout_s)


class DirectLauncher:
    """Our own launch: `gaudi_cluster.launch.node` on every node, each starting its rank agents with
    the environment DeepSpeed's launch.py would give them; started by one `gaudi_cluster.launch.fanout`
    here (this node without ssh, the others over the survey's ssh connections), or inside Slurm by one
    srun step on every node. Nothing on the way imports torch, as DeepSpeed's runner and launch.py
    each do."""

    name = LauncherName.DIRECT

    def requires(self, inputs: PlanInputs) -> tuple[Requirement, ...]:
        if inputs.srun:
            return (_python(inputs), OnPath(inputs.srun[0], "or set GAUDI_CLUSTER_SLURM_LAUNCH=ssh"))
        if all(_is_here(inputs, entry.host) for entry in inputs.hostfile.entries):
            return (_python(inputs),)
        return (_python(inputs), SSH)

    def nodes(self, inputs: PlanInputs) -> tuple[NodeEntry, ...]:
        entries, first = [], 0
        agent = dataclasses.replace(inputs.agent, output_to_relay=True)
        agent_args = tuple(agent.args(inputs.program))
        for index, entry in enumerate(inputs.hostfile.entries):
            here = _is_here(inputs, entry.host)
            # Over ssh (not here, not an srun task, whose step would end with it), supervised.
            hand_over = not here and not inputs.srun and agent.control is not None
            spec = NodeSpec(
                node_rank=index,
                nnodes=len(inputs.hostfile.entries),
                first_rank=first,
                slots=inputs.device_ids.get(entry.host, tuple(range(entry.slots))),
                world_size=inputs.hostfile.world_size,
                master_addr=inputs.master_addr,
                master_port=inputs.master_port,
                cwd=inputs.cwd,
                env=inputs.env,
                python=inputs.python,
                agent_args=agent_args,
                preimport=inputs.preimport,
                preimport_keep_s=inputs.preimport_keep_s,
                hand_over=hand_over,
                # Where the node process outlives nothing of its node's ranks, it runs their relay.
                relay=None if hand_over else node_relay(agent),
            )
            entries.append(NodeEntry(entry.host, here, spec))
            first += entry.slots
        return tuple(entries)

    def plan(self, inputs: PlanInputs) -> LaunchPlan:
        given = (*inputs.runner_args, "--launcher_args" if inputs.launcher_args else "")
        if flags := [word for word in given if word.startswith("--")]:
            raise ConfigError(f"{', '.join(flags)} need DeepSpeed's launcher; fix: --launcher deepspeed")
        # A dry run writes no ssh config: the spec shows where it would be.
        ssh_config = inputs.ssh_config_path or "(the job's ssh config)"
        nodes = self.nodes(inputs)
        launch = FanoutSpec(inputs.python, ssh_config, nodes, srun=inputs.srun)
        # Inside Slurm the launcher is the srun step itself, every node a task taking its own entry
        # of the launch from the step's stdin: no fan-out interpreter on the master's critical path.
        argv = (
            (*inputs.srun, inputs.python, "-u", "-m", NODE_MODULE, "--from-launch")
            if inputs.srun
            else (inputs.python, "-u", "-m", FANOUT_MODULE)
        )
        hands_over = any(node.spec.hand_over for node in nodes)
        return LaunchPlan(argv, {}, self.name, stdin=launch.to_json(), hands_over=hands_over)


LAUNCHERS: Mapping[LauncherName, type[Launcher]] = {
    cls.name: cls for cls in (DirectLauncher, DeepSpeedLauncher, MpirunLauncher, TorchrunLauncher)
}


def launcher_named(launcher: str) -> Launcher:
    if launcher not in LAUNCHERS:
        raise ConfigError(f"launcher '{launcher}' is unknown; fix: use one of {', '.join(LAUNCHERS)}")
    return LAUNCHERS[launcher]()


def plan_for(launcher: str, inputs: PlanInputs) -> LaunchPlan:
    return launcher_named(launcher).plan(inputs)

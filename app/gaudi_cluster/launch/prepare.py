"""Master: the second phase of a job, from the node survey to files on disk and a launch plan.

preflight checks (blocking ones stop here) -> hostfile -> .deepspeed_env -> LaunchPlan. In a dry run
nothing is written; the same values are printed instead. What the probe stages on every node before
the survey (the attempt's secret, variables delivered privately) is made here too: `staged_values`.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TextIO

from gaudi_cluster.env import cpu_threads, envfile, jobenv
from gaudi_cluster.errors import ClusterNotReady, ConfigError
from gaudi_cluster.launch import launchers, plan, tools
from gaudi_cluster.nodes import checks, ssh
from gaudi_cluster.nodes.devices import resolve_accelerator
from gaudi_cluster.nodes.hostfile import HostEntry, Hostfile, active_resources, make_hostfile, render_hostfile
from gaudi_cluster.nodes.reach import SshReach
from gaudi_cluster.nodes.survey import NodeSurvey
from gaudi_cluster.rank.jobdir import write_private_file
from gaudi_cluster.wire import protocol
from gaudi_cluster.wire.kinds import Accelerator, LauncherName
from gaudi_cluster.wire.private_payload import PrivatePayload

log = logging.getLogger("gaudi_cluster.launch.prepare")

# Next to the job directories: the hostfile `gaudi_spawn.py --hostfile` is given on a held cluster.
STABLE_HOSTFILE = "hostfile"
# Which attempt of the job the ranks run (read by app/train/timeline.py): set from the second one on.
ATTEMPT_VARIABLE = "GAUDI_CLUSTER_ATTEMPT"


@dataclass(frozen=True)
class PreparedJob:
    job_id: str
    job_dir: Path
    hostfile: Hostfile
    ranks_by_host: Mapping[str, int]  # what the launch really starts (--include/--exclude applied)
    env: envfile.EnvFile
    plan: plan.LaunchPlan
    accelerator: str
    ssh_config: Path | None
    local: bool
    control_addr: str  # where the control channel listens: the address the ranks reach it on
    rank_hosts: Mapping[int, str]  # each rank and the host name of the node it runs on
    rank_nodes: Mapping[int, str]  # each rank and its node's name in the plan (whose key it holds)
    output_dir: str  # where the job writes (its --output_dir, else the cluster's): the report goes there
    survey: NodeSurvey = field(repr=False)  # its shared ssh connections end with the attempt
    token: str = field(repr=False, default="")  # this attempt's secret for the control channel
    attempt: int = 1  # which attempt of the job this is (1: the first; the ranks get it on a restart)

    @property
    def world_size(self) -> int:
        return sum(self.ranks_by_host.values())


@dataclass(frozen=True)
class PrepareSettings:
    """What preparing a launch reads of the cluster's settings, and nothing else."""

    accelerator: str
    env_preset: str
    env: tuple[tuple[str, str], ...]
    env_pass: tuple[str, ...]
    slots: int | None
    min_free_disk: int
    skip_doctor: bool
    dry_run: bool
    launcher: str
    ssh_port: int
    master_port: int
    control_port: int
    heartbeat_timeout: float
    job_root: str
    preimport: bool = True  # the direct launcher's nodes fork their ranks from a zygote (rank/zygote)
    preimport_keep: float = 0.0  # seconds a node's zygote stays warm after the attempt


@dataclass(frozen=True)
class StagedValues:
    """What the probe stages in every node's 0600 private file, known before the survey: this attempt's
    control-channel secret and the variables delivered privately (never on a command line)."""

    user_files: tuple[jobenv.UserEnvFile, ...]
    private_env: Mapping[str, str] = field(repr=False)
    token: str = field(repr=False)

    def payload(self, node: str) -> PrivatePayload:
        """What node `node` gets: its own key (never the attempt's secret) and its name in the plan."""
        return PrivatePayload(node=node, token=protocol.node_key(self.token, node), env=self.private_env)


def staged_values(
    env_pass: Sequence[str], environ: Mapping[str, str], hidden_arguments: Mapping[str, str] | None = None
) -> StagedValues:
    """`hidden_arguments`: the program's token-like argument values (private_args.hide), which go
    through the private file too."""
    user_files = tuple(user_env_files(environ))
    private = {**jobenv.private_values(user_files, env_pass, environ), **(hidden_arguments or {})}
    return StagedValues(user_files, private, protocol.new_token())


def preimport_keep_s(keep: float, environ: Mapping[str, str]) -> float:
    """How long each node's zygote stays warm after an attempt: never inside a Slurm job, whose
    processes end with its steps (nothing of ours outlives an allocation)."""
    return 0.0 if "SLURM_JOB_ID" in environ else keep


def stable_hostfile_path(job_root: str) -> Path:
    return Path(job_root).parent / STABLE_HOSTFILE


def write_by_hand_ssh(job_config: Path, hosts: Sequence[str], directory: Path) -> Path:
    """The stable ssh client config beside the stable hostfile (and the nodes' trust, known_hosts):
    what the user's own ssh needs for a launch by hand on the hostfile (a held master's promise)."""
    known_hosts = directory / "known_hosts"
    trust = job_config.parent / "known_hosts"
    if trust.exists():
        write_private_file(known_hosts, trust.read_text())
    path = directory / ssh.BY_HAND_CONFIG
    write_private_file(path, ssh.by_hand_config(job_config.read_text(), hosts, known_hosts))
    return path


def include_by_hand_ssh(job_root: str) -> str:
    """Let the user's own ssh read the stable ssh config, if a job wrote one (ssh.include_in_user_config);
    the line that says how, else ""."""
    by_hand = stable_hostfile_path(job_root).with_name(ssh.BY_HAND_CONFIG)
    return ssh.include_in_user_config(by_hand, Path.home() / ".ssh/config") if by_hand.exists() else ""


def held_ready_text(hostfile: Hostfile, job_root: str, ssh_line: str) -> str:
    """What a held master says once the cluster is ready: the stable hostfile, how to launch on it,
    and how the user's own ssh reaches its nodes (`ssh_line`, for a raw launcher run by hand)."""
    stable = stable_hostfile_path(job_root)
    return (
        f"gaudi-cluster: cluster ready; hostfile at {stable}:\n{render_hostfile(hostfile)}"
        f"run e.g.: gaudi_spawn.py --hostfile {shlex.quote(str(stable))} --use_deepspeed SCRIPT ARGS\n"
        + (f"gaudi-cluster: {ssh_line}\n" if ssh_line else "")
    )


def _read_if_exists(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path} cannot be read ({error}); fix: make it a readable text file") from None


def user_env_files(environ: Mapping[str, str]) -> list[jobenv.UserEnvFile]:
    """The user's own .deepspeed_env files, where DeepSpeed's runner would read them."""
    return jobenv.read_user_env_files(environ, str(Path.home()), os.getcwd(), _read_if_exists)


def job_env_for(
    settings: PrepareSettings,
    accelerator: str,
    survey: NodeSurvey,
    environ: Mapping[str, str],
    staged: StagedValues,
) -> envfile.EnvFile:
    return jobenv.job_env(
        preset=settings.env_preset,
        accelerator=accelerator,
        master_report=survey.master_report,
        environ=environ,
        # HCCL's socket interface is never the seed's first-interface guess (see presets).
        socket_ifname=survey.hccl_socket_ifname if accelerator == Accelerator.HPU else survey.socket_ifname,
        extra=dict(settings.env),
        user_files=staged.user_files,
        env_pass=settings.env_pass,
        private=staged.private_env,
    )


def hostfile_for(cpu_slots: int | None, survey: NodeSurvey) -> Hostfile:
    """Slots per node: as requested (peer list, --slots on cpu), else the devices the node detected."""
    entries = []
    for host in survey.hosts:
        report = survey.reports[host]
        slots = (
            survey.requested_slots.get(host)
            or (cpu_slots if report.accelerator == Accelerator.CPU else None)
            or report.slots
        )
        entries.append(HostEntry(host, int(slots or 1)))
    return make_hostfile(entries)  # survey.hosts lists the first node (rank 0) first


def _check_or_stop(settings: PrepareSettings, survey: NodeSurvey, env_file: envfile.EnvFile) -> None:
    findings = survey.preflight(env_file.as_dict(), settings.min_free_disk)
    if settings.skip_doctor or settings.dry_run:
        return
    for warning in (f for f in findings if not f.ok and not f.blocking):
        log.warning("warning: %s %s: %s; fix: %s", warning.host, warning.check, warning.detail, warning.fix)
    problems = checks.blocking(findings)
    if problems:
        print(checks.render_table(findings), file=sys.stderr)
        first = problems[0]
        raise ClusterNotReady(
            f"preflight failed on {len(problems)} check(s); first: {first.host} {first.check}: "
            f"{first.detail}; fix: {first.fix}"
        )


def prepare(
    settings: PrepareSettings,
    survey: NodeSurvey,
    staged: StagedValues,
    program: Sequence[str],
    environ: Mapping[str, str],
    options: plan.LaunchOptions | None = None,
    attempt: int = 1,
) -> PreparedJob:
    """Everything the launch needs, from what the survey found; files are written unless a dry run."""
    options = options or plan.LaunchOptions()
    if survey.unreachable:
        details = "; ".join(f"{host}: {why}" for host, why in survey.unreachable.items())
        raise ClusterNotReady(
            f"{len(survey.unreachable)} of {len(survey.hosts)} nodes failed the probe "
            f"({survey.reached_by()}): {details}"
        )
    if survey.srun is not None and settings.launcher != LauncherName.DIRECT:
        # Inside Slurm no node runs sshd (nodes/srun): pdsh, mpirun's ssh agent and ours need one.
        raise ConfigError(
            f"launcher {settings.launcher} starts ranks over ssh, and inside Slurm the nodes run no sshd; "
            "fix: --launcher direct (Slurm starts it), or GAUDI_CLUSTER_SLURM_LAUNCH=ssh"
        )
    accelerator = resolve_accelerator(settings.accelerator, environ, survey.master_report)
    env_file = job_env_for(settings, accelerator, survey, environ, staged)
    for line in jobenv.describe(env_file, staged.user_files):
        log.log(logging.WARNING if line.startswith("warning:") else logging.INFO, "%s", line)
    _check_or_stop(settings, survey, env_file)
    hostfile = hostfile_for(settings.slots, survey)
    active = active_resources(hostfile, options.include, options.exclude)
    if accelerator == Accelerator.CPU:
        threads = cpu_threads.cpu_threads_per_rank({h: len(s) for h, s in active.items()}, survey.reports)
        threaded = cpu_threads.with_cpu_threads(env_file, threads)
        if threads is not None and threaded is not env_file:
            log.info("%s", threads.line())
        env_file = threaded
    if attempt > 1:  # a restart: the workload resumes instead of starting afresh (absent: attempt 1)
        values = {**env_file.as_dict(), ATTEMPT_VARIABLE: str(attempt)}
        env_file = replace(env_file, items=tuple(sorted(values.items())))
    hostfile_path = survey.job_dir / "hostfile"
    env_path = survey.job_dir / "deepspeed_env"
    if not settings.dry_run:
        hostfile_path.write_text(render_hostfile(hostfile))
        if not survey.local:
            stable = stable_hostfile_path(settings.job_root)
            stable.parent.mkdir(parents=True, exist_ok=True)
            stable.write_text(render_hostfile(hostfile))
            key_name = survey.reach.host_key_name if isinstance(survey.reach, SshReach) else None
            named = ssh.host_key_name_file(stable)
            if key_name:
                named.write_text(key_name + "\n")
            else:
                named.unlink(missing_ok=True)
            if isinstance(survey.reach, SshReach):
                write_by_hand_ssh(survey.reach.config, hostfile.hosts, stable.parent)
        env_path.write_text(envfile.render_env_file(env_file))
        env_path.chmod(0o600)
    launcher = launchers.launcher_named(settings.launcher)
    # DeepSpeed's runner applies --include/--exclude itself; every other launcher gets the selection.
    selects = settings.launcher != LauncherName.DEEPSPEED and bool(options.include or options.exclude)
    launch_hostfile = selected_hostfile(active) if selects else hostfile
    mpirun_major = tools.openmpi_major() if settings.launcher == LauncherName.MPIRUN else 4
    inputs = plan.PlanInputs(
        hostfile=launch_hostfile,
        hostfile_path=str(hostfile_path),
        env=env_file.as_dict(),
        env_path=str(env_path),
        ssh_config_path=str(survey.ssh_config) if survey.ssh_config else None,
        ssh_port=settings.ssh_port,
        master_addr=survey.master_addr,
        master_port=settings.master_port,
        program=tuple(program),
        python=sys.executable,
        agent=plan.AgentSettings(
            job_id=survey.job_id,
            job_root=settings.job_root,
            heartbeat_timeout_s=settings.heartbeat_timeout,
            control=f"{survey.local_addr}:{settings.control_port}",
            local_rank_arg=options.local_rank_arg,
            output_dir=survey.output_dir,
        ),
        socket_ifname=survey.socket_ifname,
        mpi_root=environ.get("MPI_ROOT"),
        openmpi_major=mpirun_major,
        local=survey.local,
        this_node=survey.this_node,
        cwd=os.getcwd(),
        runner_args=options.runner_args(with_selection=not selects),
        launcher_args=options.launcher_args,
        mpi_binding=options.mpi_binding,
        # Open MPI's tree-spawn parameter set in the master's environment (OMPI_MCA_plm_rsh_no_tree_spawn):
        # its choice, not the plan's (every node then holds the client key).
        srun=_launch_step(survey, launch_hostfile),
        device_ids={host: tuple(slots) for host, slots in active.items()} if selects else {},
        preimport=settings.preimport,
        preimport_keep_s=preimport_keep_s(settings.preimport_keep, environ),
        mpi_tree_spawn=any(
            name.startswith(("OMPI_MCA_", "PRTE_MCA_")) and name.endswith("_no_tree_spawn")
            for name in environ
        ),
    )
    # What the launcher needs on this machine is checked before it plans (DeepSpeed's backend_exists).
    requirements = launcher.requires(inputs)
    if settings.dry_run:  # prints what would run, runs nothing: a missing tool is worth a line, not a stop
        missing = tools.unmet_requirement(settings.launcher, requirements, mpirun_major=lambda: mpirun_major)
        if missing:
            log.warning("dry run: %s", missing)
    else:
        tools.check_requirements(settings.launcher, requirements, mpirun_major=lambda: mpirun_major)
    launch = launcher.plan(inputs)
    if inputs.mpi_tree_spawn and survey.ssh_config and not survey.local and not settings.dry_run:
        # mpirun's ssh arguments name the job's config (-F): tree spawn reads it on other nodes too.
        others = [host for host in survey.hosts if host != survey.this_node]
        failed = ssh.share_client_config(others, survey.ssh_config, sys.executable, settings.ssh_port)
        if failed:
            details = "; ".join(f"{host}: {why}" for host, why in failed.items())
            raise ClusterNotReady(f"could not stage the job's ssh config for mpirun on: {details}")
    return PreparedJob(
        job_id=survey.job_id,
        job_dir=survey.job_dir,
        hostfile=hostfile,
        ranks_by_host={host: len(slots) for host, slots in active.items()},
        env=env_file,
        plan=launch,
        accelerator=accelerator,
        ssh_config=survey.ssh_config,
        local=survey.local,
        control_addr=survey.local_addr,
        rank_hosts=rank_hosts(active, survey),
        rank_nodes={rank: host for rank, host in enumerate(h for h, slots in active.items() for _ in slots)},
        output_dir=survey.output_dir or os.getcwd(),
        survey=survey,
        token=staged.token,
        attempt=attempt,
    )


def selected_hostfile(active: Mapping[str, Sequence[int]]) -> Hostfile:
    """The hostfile of the hosts --include/--exclude leave, each with its number of selected slots."""
    return Hostfile(tuple(HostEntry(host, len(slots)) for host, slots in active.items()))


def _launch_step(survey: NodeSurvey, hostfile: Hostfile) -> tuple[str, ...]:
    """The srun step that starts the direct launcher's process on every node (nodes/srun), if any."""
    if survey.srun is None or survey.local:
        return ()
    return tuple(survey.srun.argv([entry.host for entry in hostfile.entries], "gc-launch", stdin=True))


def rank_hosts(active: Mapping[str, Sequence[int]], survey: NodeSurvey) -> dict[int, str]:
    """Which node's host name each rank reports: ranks are numbered node by node in hostfile order,
    as DeepSpeed's launch.py and mpirun's by-slot mapping both do."""
    ranks: dict[int, str] = {}
    for host, slots in active.items():
        name = survey.node_name(host)
        for _ in slots:
            ranks[len(ranks)] = name
    return ranks


def print_dry_run(job: PreparedJob, out: TextIO) -> None:
    out.write(f"# hostfile (not written: dry run)\n{render_hostfile(job.hostfile)}")
    out.write(f"# env file (not written: dry run)\n{envfile.render_env_file(job.env)}")
    out.write(f"# command\n{plan.render_shell(job.plan)}\n")
    out.flush()

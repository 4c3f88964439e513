"""The second phase of a job: from the node survey to files on disk and a launch plan.

preflight checks (blocking ones stop here) -> hostfile -> .deepspeed_env -> LaunchPlan. In a dry run
nothing is written; the same values are printed instead.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from gaudi_cluster.env import envfile, jobenv
from gaudi_cluster.errors import ClusterNotReady, ConfigError
from gaudi_cluster.launch import launchers, plan
from gaudi_cluster.launch.program import output_dir, required_paths, resolve_accelerator
from gaudi_cluster.nodes import checks
from gaudi_cluster.nodes.hostfile import HostEntry, Hostfile, active_resources, make_hostfile, render_hostfile
from gaudi_cluster.nodes.survey import NodeSurvey, survey_nodes
from gaudi_cluster.settings.config import ClusterConfig
from gaudi_cluster.wire import protocol

log = logging.getLogger("gaudi_cluster.launch.prepare")

# Next to the job directories: the hostfile `gaudi_spawn.py --hostfile` is given on a held cluster.
STABLE_HOSTFILE = "hostfile"


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
    node_python: str
    local: bool
    control_addr: str  # where the control channel listens: the address the ranks reach it on
    rank_hosts: Mapping[int, str]  # each rank and the host name of the node it runs on
    output_dir: str  # where the job writes (its --output_dir, else the cluster's): the report goes there
    survey: NodeSurvey = field(repr=False)  # its shared ssh connections end with the attempt
    token: str = field(repr=False, default="")  # this attempt's secret for the control channel

    @property
    def world_size(self) -> int:
        return sum(self.ranks_by_host.values())


def stable_hostfile_path(config: ClusterConfig) -> Path:
    return Path(config.job_root).parent / STABLE_HOSTFILE


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
    config: ClusterConfig,
    accelerator: str,
    survey: NodeSurvey,
    environ: Mapping[str, str],
    user_files: Sequence[jobenv.UserEnvFile] = (),
) -> envfile.EnvFile:
    return jobenv.job_env(
        preset=config.env_preset,
        accelerator=accelerator,
        master_report=survey.master_report,
        environ=environ,
        # HCCL's socket interface is never the seed's first-interface guess (see presets).
        socket_ifname=survey.hccl_socket_ifname if accelerator == "hpu" else survey.socket_ifname,
        extra=dict(config.env),
        user_files=user_files,
        env_pass=config.env_pass,
    )


def hostfile_for(config: ClusterConfig, survey: NodeSurvey) -> Hostfile:
    """Slots per node: as requested (peer list, --slots on cpu), else the devices the node detected."""
    entries = []
    for host in survey.hosts:
        report = survey.reports[host]
        slots = (
            survey.requested_slots.get(host)
            or (config.slots if report["accelerator"] == "cpu" else None)
            or report["slots"]
        )
        entries.append(HostEntry(host, int(slots or 1)))
    return make_hostfile(entries)  # survey.hosts lists the first node (rank 0) first


def _check_or_stop(config: ClusterConfig, survey: NodeSurvey, env_file: envfile.EnvFile) -> None:
    findings = checks.check_nodes(
        survey.reports,
        {},
        survey.requested_slots,
        survey.socket_ifname,
        env_file.as_dict(),
        survey.paths,
        min_free_disk=config.min_free_disk,
    )
    if config.skip_doctor or config.dry_run:
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


def openmpi_major() -> int:
    """The major version of the mpirun on PATH (4 when it cannot tell: Debian 12's and Habana's)."""
    try:
        out = subprocess.run(
            ["mpirun", "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 4
    for word in out.split():
        if word[:1].isdigit() and "." in word:
            return int(word.split(".")[0])
    return 4


def prepare(
    config: ClusterConfig,
    program: Sequence[str],
    environ: Mapping[str, str],
    options: plan.LaunchOptions | None = None,
) -> PreparedJob:
    options = options or plan.LaunchOptions()
    user_files = user_env_files(environ)
    token = protocol.new_token()
    private = {"env": jobenv.private_values(user_files, config.env_pass, environ), "token": token}
    survey = survey_nodes(
        config, required_paths(program, os.getcwd()), environ, private, output_dir(program, environ)
    )
    try:
        return _prepare_surveyed(config, program, environ, options, survey, user_files, token)
    except BaseException:
        survey.release()
        raise


def _prepare_surveyed(
    config: ClusterConfig,
    program: Sequence[str],
    environ: Mapping[str, str],
    options: plan.LaunchOptions,
    survey: NodeSurvey,
    user_files: Sequence[jobenv.UserEnvFile],
    token: str,
) -> PreparedJob:
    if survey.unreachable:
        details = "; ".join(f"{host}: {why}" for host, why in survey.unreachable.items())
        raise ClusterNotReady(
            f"{len(survey.unreachable)} of {len(survey.hosts)} nodes failed the ssh probe: {details}"
        )
    accelerator = resolve_accelerator(config.accelerator, environ, survey.master_report)
    env_file = job_env_for(config, accelerator, survey, environ, user_files)
    for line in jobenv.describe(env_file, user_files):
        log.log(logging.WARNING if line.startswith("warning:") else logging.INFO, "%s", line)
    _check_or_stop(config, survey, env_file)
    hostfile = hostfile_for(config, survey)
    active = active_resources(hostfile, options.include, options.exclude)
    if accelerator == "cpu":
        threads = jobenv.cpu_threads_per_rank({h: len(s) for h, s in active.items()}, survey.reports)
        threaded = jobenv.with_cpu_threads(env_file, threads)
        if threads is not None and threaded is not env_file:
            log.info("%s", threads.line())
        env_file = threaded
    hostfile_path = survey.job_dir / "hostfile"
    env_path = survey.job_dir / "deepspeed_env"
    if not config.dry_run:
        hostfile_path.write_text(render_hostfile(hostfile))
        if not survey.local:
            stable = stable_hostfile_path(config)
            stable.parent.mkdir(parents=True, exist_ok=True)
            stable.write_text(render_hostfile(hostfile))
        env_path.write_text(envfile.render_env_file(env_file))
        env_path.chmod(0o600)
    inputs = plan.PlanInputs(
        hostfile=hostfile,
        hostfile_path=str(hostfile_path),
        env=env_file.as_dict(),
        env_path=str(env_path),
        ssh_config_path=str(survey.ssh_config) if survey.ssh_config else None,
        ssh_port=config.ssh_port,
        master_addr=survey.master_addr,
        master_port=config.master_port,
        program=tuple(program),
        python=sys.executable,
        agent=plan.AgentSettings(
            job_id=survey.job_id,
            job_root=config.job_root,
            heartbeat_timeout_s=config.heartbeat_timeout,
            control=f"{survey.local_addr}:{config.control_port}",
            local_rank_arg=options.local_rank_arg,
        ),
        socket_ifname=survey.socket_ifname,
        mpi_root=environ.get("MPI_ROOT"),
        openmpi_major=openmpi_major() if config.launcher == "mpirun" else 4,
        local=survey.local,
        this_node=survey.this_node,
        cwd=os.getcwd(),
        runner_args=options.runner_args(),
        launcher_args=options.launcher_args,
    )
    launch = launchers.plan_for(config.launcher, inputs)
    if not shutil.which(launch.argv[0]):
        raise ClusterNotReady(
            f"--launcher {config.launcher} needs {launch.argv[0]}, which is not on PATH here; "
            "fix: install it (OpenMPI: apt-get install openmpi-bin) or choose another launcher"
        )
    return PreparedJob(
        job_id=survey.job_id,
        job_dir=survey.job_dir,
        hostfile=hostfile,
        ranks_by_host={host: len(slots) for host, slots in active.items()},
        env=env_file,
        plan=launch,
        accelerator=accelerator,
        ssh_config=survey.ssh_config,
        node_python=sys.executable,
        local=survey.local,
        control_addr=survey.local_addr,
        rank_hosts=rank_hosts(active, survey.reports),
        output_dir=output_dir(program, environ),
        survey=survey,
        token=token,
    )


def rank_hosts(
    active: Mapping[str, Sequence[int]], reports: Mapping[str, Mapping[str, object]]
) -> dict[int, str]:
    """Which node's host name each rank reports: ranks are numbered node by node in hostfile order,
    as DeepSpeed's launch.py and mpirun's by-slot mapping both do."""
    ranks: dict[int, str] = {}
    for host, slots in active.items():
        name = str(reports.get(host, {}).get("hostname") or host)
        for _ in slots:
            ranks[len(ranks)] = name
    return ranks


def print_dry_run(job: PreparedJob, out: TextIO) -> None:
    out.write(f"# hostfile (not written: dry run)\n{render_hostfile(job.hostfile)}")
    out.write(f"# env file (not written: dry run)\n{envfile.render_env_file(job.env)}")
    out.write(f"# command\n{plan.render_shell(job.plan)}\n")
    out.flush()

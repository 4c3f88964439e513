"""The master role, top to bottom: survey -> prepare -> launch and supervise -> report -> restart.

Each phase lives in its folder (nodes/survey, launch/prepare, supervise/, view/report) and receives
the settings it reads, cut here from the one ClusterConfig; no phase calls the next. This module owns
the job's lifetime: the control server, the final line, the clean-up on every node.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import time
from collections.abc import Mapping, Sequence, Set
from pathlib import Path
from typing import TextIO

from gaudi_cluster.engines import auto as engine
from gaudi_cluster.engines import nodewatch
from gaudi_cluster.launch import plan
from gaudi_cluster.launch.prepare import (
    PreparedJob,
    PrepareSettings,
    StagedValues,
    prepare,
    print_dry_run,
    stable_hostfile_path,
    staged_values,
)
from gaudi_cluster.launch.program import DEFAULT_OUTPUT, output_dir, program_from_args, required_paths
from gaudi_cluster.nodes import ssh
from gaudi_cluster.nodes.devices import resolve_accelerator
from gaudi_cluster.nodes.hostfile import render_hostfile
from gaudi_cluster.nodes.survey import NodeSurvey, SurveySettings, survey_nodes
from gaudi_cluster.rank import jobdir
from gaudi_cluster.rank.reap import reap_job
from gaudi_cluster.settings.config import ClusterConfig
from gaudi_cluster.supervise.control import ControlServer
from gaudi_cluster.supervise.outcome import JobOutcome, should_restart
from gaudi_cluster.supervise.supervisor import Supervisor, SupervisorSettings
from gaudi_cluster.view import report
from gaudi_cluster.view.status import StatusServer

log = logging.getLogger("gaudi_cluster.master")


def run_master(
    config: ClusterConfig,
    job_argv: Sequence[str],
    environ: Mapping[str, str],
    out: TextIO,
    options: plan.LaunchOptions | None = None,
) -> int:
    """Prepare and run the job, re-running it up to --max-restarts times after a failure."""
    config = engine.engine_defaults(config, environ)
    log.info("%s", config.describe())
    program = program_from_args(
        job_argv, sys.executable, resolve_accelerator(config.accelerator, environ), environ, os.getcwd()
    )
    attempt = 1
    job: PreparedJob | None = None
    exit_code: int | None = None
    lost: set[str] = set()
    try:
        while True:
            job = prepare_attempt(config, program, environ, options)
            if config.dry_run:
                print_dry_run(job, out)
                exit_code = 0
                return exit_code
            outcome = run_prepared(job, config, out)
            if outcome.lost_host is not None:
                lost.add(outcome.lost_host)
            if not should_restart(outcome, attempt, config.max_restarts):
                exit_code = outcome.exit_code
                return exit_code
            out.write(
                f"gaudi-cluster: restarting the job from its latest checkpoint "
                f"(restart {attempt} of {config.max_restarts})\n"
            )
            out.flush()
            attempt += 1
    finally:
        nodewatch.release_workers(config, environ, job.ssh_config if job else None, exit_code, skip=lost)


def survey_for(
    config: ClusterConfig,
    program: Sequence[str],
    environ: Mapping[str, str],
    staged: StagedValues | None = None,
) -> NodeSurvey:
    """The survey phase for this program: every node found, waited for and probed (and, for a launch,
    the attempt's private values staged on each)."""
    return survey_nodes(
        SurveySettings.from_config(config),
        required_paths(program, os.getcwd()),
        environ,
        staged.payload() if staged else None,
        job_output_dir(program, environ),
    )


def job_output_dir(program: Sequence[str], environ: Mapping[str, str]) -> str:
    return output_dir(program, environ, os.getcwd(), os.path.isdir(DEFAULT_OUTPUT))


def prepare_attempt(
    config: ClusterConfig,
    program: Sequence[str],
    environ: Mapping[str, str],
    options: plan.LaunchOptions | None = None,
) -> PreparedJob:
    """Survey, then prepare: the attempt's values are staged by the survey, used by the preparation."""
    staged = staged_values(config.env_pass, environ)
    survey = survey_for(config, program, environ, staged)
    try:
        return prepare(PrepareSettings.from_config(config), survey, staged, program, environ, options)
    except BaseException:
        survey.release()
        raise


def run_prepared(job: PreparedJob, config: ClusterConfig, out: TextIO) -> JobOutcome:
    """Run one attempt under supervision; whatever it leaves behind is reaped on every node."""
    # Listen only where the ranks reach the master (loopback for a local job), not on every interface.
    server = ControlServer(
        job.control_addr, config.control_port, job.job_id, config.heartbeat_timeout, job.token, job.rank_hosts
    )
    server.start()
    settings = SupervisorSettings(
        start_timeout_s=config.start_timeout,
        stuck_timeout_s=config.stuck_timeout,
        stop_grace_s=config.stop_grace,
        status_interval_s=config.status_interval,
    )
    supervisor = Supervisor(
        job.job_id,
        job.plan,
        server,
        job.ranks_by_host,
        settings,
        out,
        on_all_started=lambda: remove_private_files(job, config),
        on_first_step=report.warm_up_plotting,
    )
    supervisor.install_signal_handlers()
    status = StatusServer(job.job_dir, supervisor.snapshot)
    status.start()
    log.info(
        "job %s: %d ranks on %d nodes; launching: %s",
        job.job_id,
        job.world_size,
        len(job.ranks_by_host),
        plan.render_shell(job.plan).split("\n")[0],
    )
    started, launched_at = time.monotonic(), time.time()
    try:
        outcome = supervisor.run()
    finally:
        server.close()
        status.close()
    try:
        if outcome.leaves_processes:
            reap_everywhere(job, config, supervisor.lost_hosts)
        else:
            out.write(
                f"gaudi-cluster: job {job.job_id} succeeded: {job.world_size} ranks on "
                f"{len(job.ranks_by_host)} nodes in {time.monotonic() - started:.1f}s\n"
            )
            out.flush()
        supervisor.finish_first_step_work()
        write_report(job, outcome, supervisor, launched_at)
    finally:
        job.survey.release()
    return outcome


def write_report(job: PreparedJob, outcome: JobOutcome, supervisor: Supervisor, launched_at: float) -> None:
    """job_report.json and job_report.png next to the job's results (on this node)."""
    directory = Path(job.output_dir)
    events = report.read_events(job.job_dir / "events.jsonl", directory / "events.jsonl")
    first_events = {e["event"]: e.get("t") for e in reversed(events) if "event" in e}
    points = {
        "container_start": report.container_start(),
        "master_start": report.process_start(),
        "launch": launched_at,
        **{name: first_events.get(name) for name in ("start", "imports_done", "model_ready", "first_step")},
    }
    flagged = supervisor.view.watch.flagged
    built = report.build(
        job_id=job.job_id,
        state=outcome.state.value,
        exit_code=outcome.exit_code,
        reports=job.survey.reports,
        ranks_by_host=job.ranks_by_host,
        rank_hosts=job.rank_hosts,
        preset_names=[name for name, _ in job.env.items],
        private_names=[name for name, _ in job.env.private],
        points=points,
        events=events,
        stragglers=[s.line() for s in flagged.values()],
        failure=outcome.failure.summary(job.job_id) if outcome.failure else None,
    )
    written = report.write(built, supervisor.server.work_histories(), set(flagged), directory)
    if written:
        log.info("job report: %s", ", ".join(str(path) for path in written))


def remove_private_files(job: PreparedJob, config: ClusterConfig) -> None:
    """Every agent has read its node's private file once all ranks checked in: delete them all."""
    if job.local:
        (job.job_dir / jobdir.PRIVATE_FILE).unlink(missing_ok=True)
        return
    if job.ssh_config is None:
        return
    path = str(jobdir.job_dir(config.job_root, job.job_id) / jobdir.PRIVATE_FILE)
    results = ssh.run_on_hosts(job.hostfile.hosts, ["rm", "-f", path], job.ssh_config, timeout_s=10)
    for host, result in results.items():
        if not result.ok:
            log.warning(
                "could not remove the private file of job %s on %s (reap removes it)", job.job_id, host
            )


def reap_everywhere(job: PreparedJob, config: ClusterConfig, lost_hosts: Set[str] = frozenset()) -> None:
    """Kill whatever is left of this job (by its pid files) on every node still reachable.

    Nodes whose agents were lost are skipped: dead, or cut off, where those agents end their ranks
    themselves once the master's heartbeats stop; waiting on them would only delay the exit."""
    if job.local:
        reap_job(Path(config.job_root), job.job_id)
        return
    if job.ssh_config is None:
        return
    cmd = [
        job.node_python,
        "-m",
        "gaudi_cluster",
        "reap",
        "--job-id",
        job.job_id,
        "--job-root",
        config.job_root,
    ]
    # A dead or cut-off node must not hold the master's exit: its own agents end its ranks anyway.
    names = {host: job.survey.node_name(host) for host in job.hostfile.hosts}
    reachable = [host for host, name in names.items() if name not in lost_hosts]
    began = time.monotonic()
    results = ssh.run_on_hosts(reachable, cmd, job.ssh_config, timeout_s=3, connect_timeout_s=1)
    log.debug("reaped job %s on %s in %.2fs", job.job_id, ", ".join(reachable), time.monotonic() - began)
    for host, result in results.items():
        if not result.ok:
            why = ssh.explain_ssh_failure(result, config.ssh_port)
            log.warning("could not clean up job %s on %s: %s", job.job_id, host, why)


def hold(config: ClusterConfig, environ: Mapping[str, str], out: TextIO) -> int:
    """Prepare the cluster (hostfile, env file) and stay up so users can launch by hand."""
    program = program_from_args(
        [], sys.executable, resolve_accelerator(config.accelerator, environ), environ, os.getcwd()
    )
    job = prepare_attempt(config, program, environ)
    job.survey.release()  # users launch their own jobs; this one holds no ssh connection open
    stable = stable_hostfile_path(config.job_root)
    out.write(
        f"gaudi-cluster: cluster ready; hostfile at {stable}:\n{render_hostfile(job.hostfile)}"
        f"run e.g.: gaudi_spawn.py --hostfile {shlex.quote(str(stable))} --use_deepspeed SCRIPT ARGS\n"
    )
    out.flush()
    stop: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda s, _f: stop.append(s))
    while not stop:
        time.sleep(0.5)
    return 0

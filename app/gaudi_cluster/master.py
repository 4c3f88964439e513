"""Master: the master role, top to bottom: settings -> (fabric check) -> attempt -> report -> restart.

The settings are cut into each phase's slice once (job/settings); each attempt surveys, prepares and
runs under supervision (job/attempt), and the next one is planned from its result (job/run). This
module owns the job's lifetime: the metrics endpoint, the final line, the release of every node.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TextIO

from gaudi_cluster.engines import auto as engine
from gaudi_cluster.engines import nodewatch
from gaudi_cluster.errors import ClusterNotReady
from gaudi_cluster.job import fabric_check
from gaudi_cluster.job.attempt import AttemptContext, prepare_attempt, run_attempt
from gaudi_cluster.job.run import JobRun
from gaudi_cluster.job.settings import JobSettings
from gaudi_cluster.launch import here, plan
from gaudi_cluster.launch.prepare import PreparedJob, held_ready_text, include_by_hand_ssh, print_dry_run
from gaudi_cluster.launch.program import program_from_args
from gaudi_cluster.nodes import cleanup
from gaudi_cluster.nodes.devices import resolve_accelerator
from gaudi_cluster.settings.config import ClusterConfig
from gaudi_cluster.supervise import lifetime
from gaudi_cluster.supervise.metrics_serving import MetricsServer
from gaudi_cluster.supervise.outcome import should_restart
from gaudi_cluster.supervise.supervisor import SupervisorPhase

log = logging.getLogger("gaudi_cluster.master")


def run_master(
    config: ClusterConfig,
    job_argv: Sequence[str],
    environ: Mapping[str, str],
    out: TextIO,
    options: plan.LaunchOptions | None = None,
) -> int:
    """Prepare and run the job, re-running it up to --max-restarts times after a failure."""
    here.raise_open_file_limit()
    config = engine.engine_defaults(config, environ)
    here.check_before_survey(config.job_root, job_argv, os.getcwd(), not config.dry_run)
    return run_job(JobSettings.from_config(config), job_argv, environ, out, options, config.describe())


def run_job(
    settings: JobSettings, job_argv: Sequence[str], environ: Mapping[str, str], out: TextIO,
    options: plan.LaunchOptions | None = None, described: str = "",
) -> int:  # fmt: skip
    """The attempts of one job, each planned from the last one's result, until one needs no restart.
    `described` (the effective settings) is logged once the nodes are found: a bad peer or hostfile
    stays the one error line."""
    if (settings.include or settings.exclude) and options is None:  # gaudi_spawn.py brings its own
        options = plan.LaunchOptions(include=settings.include, exclude=settings.exclude)
    run = JobRun(tuple(program_for(settings, job_argv, environ)))
    job: PreparedJob | None = None
    exit_code: int | None = None
    metrics = metrics_server(settings)
    callers_threads = set(lifetime.others())  # an embedding program's own threads are not ours
    try:
        checked = None
        if settings.fabric.enabled and not settings.dry_run:
            checked = fabric_check.run_check(settings, environ, options)
            log.info("%s", described)
            described = ""
            if not checked.ok:
                out.write(fabric_check.stop_line(checked) + "\n")
                exit_code = 3
                return exit_code
        while True:
            job = prepare_attempt(settings, run.program, environ, options, run.attempt, run.nodes)
            if described:
                log.info("%s", described)
                described = ""
            if settings.dry_run:
                print_dry_run(job, out)
                exit_code = 0
                return exit_code
            before = (run.history, checked, run.planned, run.newcomers)
            result = run_attempt(job, AttemptContext(settings.attempt, out, metrics, *before))
            run = run.after(result)
            if not should_restart(result.outcome, run.attempt, settings.max_restarts):
                exit_code = result.outcome.exit_code
                return exit_code
            try:
                run = run.next(result, job, settings.restart)
            except ClusterNotReady as error:
                write_lines(out, [f"job {job.job_id} stops: {error}"])
                exit_code = error.exit_code
                return exit_code
            again = f"restart {run.attempt - 1} of {settings.max_restarts}"
            write_lines(out, [*run.lines, f"restarting the job from its latest checkpoint ({again})"])
    finally:
        reach = job.survey.reach if job else None
        nodewatch.release_workers(settings.release, environ, reach, exit_code, skip=run.lost)
        if metrics is not None:
            metrics.close()
        lifetime.join_all(existing=callers_threads)


def program_for(settings: JobSettings, job_argv: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    accelerator = resolve_accelerator(settings.accelerator, environ)
    return program_from_args(job_argv, sys.executable, accelerator, environ, os.getcwd())


def metrics_server(settings: JobSettings) -> MetricsServer | None:
    if settings.metrics.port is None or settings.dry_run:
        return None
    states = [phase.value for phase in SupervisorPhase]
    metrics = MetricsServer(settings.metrics.addr, settings.metrics.port, states)
    log.info("metrics for Prometheus on http://%s:%d/metrics", settings.metrics.addr, metrics.port)
    return metrics


def write_lines(out: TextIO, lines: Sequence[str]) -> None:
    out.write("".join(f"gaudi-cluster: {line}\n" for line in lines))
    out.flush()


def hold(config: ClusterConfig, environ: Mapping[str, str], out: TextIO) -> int:
    """Prepare the cluster (hostfile, env file) and stay up so users can launch by hand."""
    settings = JobSettings.from_config(config)
    job = prepare_attempt(settings, program_for(settings, [], environ), environ)
    # No rank of this prepared job ever starts, so nothing reads or removes its staged private files
    # (the --env-pass values): they go now, not with the node. Each job users launch stages its own.
    if not settings.dry_run:
        cleanup.remove_private_files(job.survey, settings.prepare.job_root)
    job.survey.release()  # users launch their own jobs; this one holds no ssh connection open
    root = settings.prepare.job_root
    out.write(held_ready_text(job.hostfile, root, include_by_hand_ssh(root)))
    out.flush()
    stop: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda s, _f: stop.append(s))
    while not stop:
        time.sleep(0.5)
    return 0

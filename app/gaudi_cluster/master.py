"""The master role, top to bottom: survey -> prepare -> launch and supervise -> report -> restart.

Each phase lives in its folder (nodes/survey, launch/prepare, supervise/, view/report) and receives
the settings it reads, cut here from the one ClusterConfig; no phase calls the next. This module owns
the job's lifetime: the control server, the final line, the clean-up on every node.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shlex
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from gaudi_cluster import fabric
from gaudi_cluster.engines import auto as engine
from gaudi_cluster.engines import nodewatch
from gaudi_cluster.errors import ClusterNotReady
from gaudi_cluster.launch import attempts, here, plan, restart
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
from gaudi_cluster.nodes import cleanup, handover
from gaudi_cluster.nodes.devices import resolve_accelerator
from gaudi_cluster.nodes.find import FoundNodes
from gaudi_cluster.nodes.hostfile import render_hostfile
from gaudi_cluster.nodes.survey import NodeSurvey, SurveySettings, survey_nodes
from gaudi_cluster.settings.config import ClusterConfig
from gaudi_cluster.supervise import lifetime
from gaudi_cluster.supervise.console import RANKS_DIR, RankLogs
from gaudi_cluster.supervise.control import ControlServer
from gaudi_cluster.supervise.metrics_serving import MetricsServer
from gaudi_cluster.supervise.outcome import JobOutcome, should_restart
from gaudi_cluster.supervise.supervisor import Supervisor, SupervisorPhase, SupervisorSettings
from gaudi_cluster.view import report, report_plot
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
    here.raise_open_file_limit()
    config = engine.engine_defaults(config, environ)
    here.check_before_survey(config.job_root, job_argv, os.getcwd(), not config.dry_run)
    described: list[bool] = []

    def prepare_described(*args: Any, **kwargs: Any) -> PreparedJob:
        prepared = prepare_attempt(*args, **kwargs)
        if not described:  # once the nodes are found: a bad peer or hostfile stays one error line
            described.append(True)
            log.info("%s", config.describe())
        return prepared

    if (config.include or config.exclude) and options is None:  # gaudi_spawn.py brings its own
        options = plan.LaunchOptions(include=config.include, exclude=config.exclude)
    program = program_from_args(
        job_argv, sys.executable, resolve_accelerator(config.accelerator, environ), environ, os.getcwd()
    )
    attempt = 1
    history: list[report.AttemptRecord] = []  # every attempt so far, for the job report
    job: PreparedJob | None = None
    exit_code: int | None = None
    lost: set[str] = set()  # node names, for the release at the end
    newcomers: tuple[str, ...] = ()  # nodes that take a lost node's place and need its checkpoint
    excluded: tuple[str, ...] = ()  # nodes out for the rest of the job
    shown: attempts.AttemptPlan | None = None  # how this attempt's nodes came from the last one's
    metrics: MetricsServer | None = None
    callers_threads = set(lifetime.others())  # an embedding program's own threads are not ours
    try:
        if config.metrics_port is not None and not config.dry_run:
            states = [phase.value for phase in SupervisorPhase]
            metrics = MetricsServer(config.metrics_addr, config.metrics_port, states)
            log.info("metrics for Prometheus on http://%s:%d/metrics", config.metrics_addr, metrics.port)
        fabric_figures = None
        if config.fabric_check and not config.dry_run:
            checked, check_id = fabric.run_check(config, environ, prepare_described, run_prepared, options)
            log.info("fabric check %s:\n%s", check_id, fabric.render_table(checked))
            if not checked.ok:
                out.write(fabric.stop_line(checked) + "\n")
                out.flush()
                exit_code = 3
                return exit_code
            fabric_figures = checked.to_json()
        chosen: FoundNodes | None = None  # a restart's nodes, planned from the last attempt's
        restarting = restart.RestartSettings.from_config(config)
        while True:
            job = prepare_described(config, program, environ, options, attempt, chosen)
            if config.dry_run:
                print_dry_run(job, out)
                exit_code = 0
                return exit_code
            if newcomers:  # before any rank starts: the nodes that took lost ones' places
                write_lines(out, handover.deliver(job.survey, newcomers, job.output_dir, config.job_root))
            lost_names: set[str] = set()
            outcome = run_prepared(
                job, config, out, metrics, attempt - 1, history, fabric_figures, lost_names, shown
            )
            lost_names |= {outcome.lost_host} if outcome.lost_host else set()
            lost |= lost_names
            if not should_restart(outcome, attempt, config.max_restarts):
                exit_code = outcome.exit_code
                return exit_code
            try:
                planned, shown, chosen, program, lines = restart.next_attempt(
                    restarting, job.survey, job.ranks_by_host, excluded, lost_names, program
                )
            except ClusterNotReady as error:
                write_lines(out, [f"job {job.job_id} stops: {error}"])
                exit_code = error.exit_code
                return exit_code
            again = f"restart {attempt} of {config.max_restarts}"
            write_lines(out, [*lines, f"restarting the job from its latest checkpoint ({again})"])
            excluded, newcomers = planned.nodes.excluded, planned.newcomers
            attempt += 1
    finally:
        nodewatch.release_workers(config, environ, job.ssh_config if job else None, exit_code, skip=lost)
        if metrics is not None:
            metrics.close()
        lifetime.join_all(existing=callers_threads)


def write_lines(out: TextIO, lines: Sequence[str]) -> None:
    out.write("".join(f"gaudi-cluster: {line}\n" for line in lines))
    out.flush()


def survey_for(
    config: ClusterConfig,
    program: Sequence[str],
    environ: Mapping[str, str],
    staged: StagedValues | None = None,
    chosen: FoundNodes | None = None,
) -> NodeSurvey:
    """The survey phase for this program: every node found, waited for and probed (and, for a launch,
    the attempt's private values staged on each)."""
    return survey_nodes(
        SurveySettings.from_config(config),
        required_paths(program, os.getcwd()),
        environ,
        staged.payload if staged else None,
        job_output_dir(program, environ),
        chosen,
    )


def job_output_dir(program: Sequence[str], environ: Mapping[str, str]) -> str:
    return output_dir(program, environ, os.getcwd(), os.path.isdir(DEFAULT_OUTPUT))


def prepare_attempt(
    config: ClusterConfig,
    program: Sequence[str],
    environ: Mapping[str, str],
    options: plan.LaunchOptions | None = None,
    attempt: int = 1,
    chosen: FoundNodes | None = None,
) -> PreparedJob:
    """Survey, then prepare: the attempt's values are staged by the survey, used by the preparation.
    `chosen`: a restart's nodes, as the master planned them (else they are found)."""
    staged = staged_values(config.env_pass, environ)
    survey = survey_for(config, program, environ, staged, chosen)
    try:
        settings = PrepareSettings.from_config(config)
        return prepare(settings, survey, staged, program, environ, options, attempt)
    except BaseException:
        cleanup.remove_private_files(survey, config.job_root)  # staged by the probe, never to be read now
        survey.release()
        raise


def run_prepared(
    job: PreparedJob,
    config: ClusterConfig,
    out: TextIO,
    metrics: MetricsServer | None = None,
    restarts: int = 0,
    history: list[report.AttemptRecord] | None = None,
    fabric_figures: str | None = None,
    lost: set[str] | None = None,
    planned: attempts.AttemptPlan | None = None,
) -> JobOutcome:
    """Run one attempt under supervision; whatever it leaves behind is reaped on every node. `lost`
    gets the names of the nodes lost in it; `planned`: how its nodes came from the last attempt's."""
    # Listen only where the ranks reach the master (loopback for a local job), not on every interface.
    server = ControlServer(
        job.control_addr,
        config.control_port,
        job.job_id,
        config.heartbeat_timeout,
        job.token,
        job.rank_hosts,
        nodes=job.rank_nodes,
        addresses=job.survey.addresses(),
    )
    server.start()
    settings = SupervisorSettings(
        start_timeout_s=config.start_timeout,
        stuck_timeout_s=config.stuck_timeout,
        stop_grace_s=config.stop_grace,
        status_interval_s=config.status_interval,
        tee=config.tee,
    )
    supervisor = Supervisor(
        job.job_id,
        job.plan,
        server,
        job.ranks_by_host,
        settings,
        out,
        on_all_started=lambda: cleanup.remove_private_files(job.survey, config.job_root),
        on_first_step=report_plot.warm_up_plotting,
        rank_logs=RankLogs(job.job_dir / RANKS_DIR),
    )
    if metrics is not None:
        metrics.follow(lambda: supervisor.figures(restarts))
    supervisor.install_signal_handlers()
    spares = [job.survey.node_name(host) for host in job.survey.spares]
    status = StatusServer(job.job_dir, lambda: {**supervisor.snapshot(), "spares": spares})
    status.start()
    log.info(
        "job %s: %d ranks on %d nodes, started %s; launching: %s",
        job.job_id,
        job.world_size,
        len(job.ranks_by_host),
        job.survey.reached_by(),
        plan.log_line(job.plan),
    )
    if spares:
        write_lines(out, [f"job {job.job_id}: spares (idle, no ranks): {', '.join(spares)}"])
    started, launched_at = time.monotonic(), time.time()
    try:
        outcome = supervisor.run()
    finally:
        ended_at = time.time()
        server.close()
        status.close()
    if lost is not None:
        lost |= supervisor.lost_hosts
    try:
        if outcome.leaves_processes:
            cleanup.reap_everywhere(job.survey, config.job_root, config.ssh_port, supervisor.lost_hosts)
        else:
            out.write(
                f"gaudi-cluster: job {job.job_id} succeeded: {job.world_size} ranks on "
                f"{len(job.ranks_by_host)} nodes in {time.monotonic() - started:.1f}s\n"
            )
            out.flush()
        write_report(job, outcome, supervisor, launched_at, history, fabric_figures, (planned, ended_at))
    finally:
        job.survey.release()
    return outcome


def write_report(
    job: PreparedJob,
    outcome: JobOutcome,
    supervisor: Supervisor,
    launched_at: float,
    history: list[report.AttemptRecord] | None = None,
    fabric_figures: str | None = None,
    how: tuple[attempts.AttemptPlan | None, float] = (None, 0.0),
) -> None:
    """job_report.json and job_report.png next to the job's results (on this node); `history` (the
    attempts before this one) gets this attempt added, with the step rank 0 resumed from."""
    directory = Path(job.output_dir)
    events = report.read_events(job.job_dir / "events.jsonl", directory / "events.jsonl")
    points = {
        "container_start": report.container_start(),
        "master_start": report.process_start(),
        "launch": launched_at,
        **report.startup_points(events),
    }
    flagged = supervisor.view.watch.flagged
    if history is not None:
        survey, (planned, ended_at) = job.survey, how
        nodes, spares = ([survey.node_name(h) for h in hosts] for hosts in (survey.hosts, survey.spares))
        state, code = outcome.state.value, outcome.exit_code
        record = report.AttemptRecord.of(job.attempt, job.job_id, state, code, events, planned, history)
        history.append(
            dataclasses.replace(record, nodes=tuple(nodes), spares=tuple(spares), ended_at=ended_at)
        )
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
        attempts=history or (),
    )
    # Every rank's lines, whatever the console showed of them (rank 0's only, without --tee).
    rank_logs = str(job.job_dir / RANKS_DIR / "rank-<N>.log")
    built.update(rank_logs=rank_logs, reached_by=job.survey.reached_by())
    if fabric_figures is not None:  # the --fabric-check run before this job (view/fabric FabricResult)
        built["fabric"] = json.loads(fabric_figures)
    written = report.write(built, supervisor.server.work_histories(), set(flagged), directory)
    shown = ", ".join(str(path) for path in written)
    log.info("job report: %s; every rank's output: %s on this node", shown or "not written", rank_logs)


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

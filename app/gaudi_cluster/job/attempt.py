"""Master: one attempt of a job, from the survey to its outcome and its report.

prepare_attempt: survey the nodes (staging the attempt's private values on each), then prepare the
launch. run_attempt: the control server, the supervisor, the status socket; whatever the ranks leave
behind is reaped on every node; job_report.json/.png are written (write_report); an AttemptResult
comes back, with the attempt's record for the next one's report.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from gaudi_cluster.env.envfile import hide_secret_arguments, secret_arguments_warning
from gaudi_cluster.job.settings import AttemptSettings, JobSettings
from gaudi_cluster.launch import attempts, plan
from gaudi_cluster.launch.prepare import PreparedJob, prepare, staged_values
from gaudi_cluster.launch.program import DEFAULT_OUTPUT, output_dir, required_paths
from gaudi_cluster.nodes import cleanup, handover
from gaudi_cluster.nodes.find import FoundNodes
from gaudi_cluster.nodes.survey import NodeSurvey, survey_nodes
from gaudi_cluster.supervise.console import RANKS_DIR, RankLogs
from gaudi_cluster.supervise.control import ControlServer
from gaudi_cluster.supervise.metrics_serving import MetricsServer
from gaudi_cluster.supervise.outcome import JobOutcome
from gaudi_cluster.supervise.supervisor import Supervisor
from gaudi_cluster.view import report, report_plot
from gaudi_cluster.view.fabric import FabricResult
from gaudi_cluster.view.status import StatusServer

log = logging.getLogger("gaudi_cluster.master")


@dataclass(frozen=True)
class AttemptContext:
    """What an attempt is run with besides its prepared job: where it writes, what came before it."""

    settings: AttemptSettings
    out: TextIO
    metrics: MetricsServer | None = None
    history: tuple[report.AttemptRecord, ...] = ()  # the attempts before this one, for the report
    fabric: FabricResult | None = None  # the --fabric-check run before the job, for the report
    planned: attempts.AttemptPlan | None = None  # how this attempt's nodes came from the last one's
    newcomers: tuple[str, ...] = ()  # nodes that took lost ones' places: the checkpoint goes to them first


@dataclass(frozen=True)
class AttemptResult:
    """How one attempt ended: its outcome, the nodes lost in it (node names), its record for the report."""

    outcome: JobOutcome
    lost: frozenset[str]
    record: report.AttemptRecord


def survey_for(settings: JobSettings, program: Sequence[str], environ: Mapping[str, str]) -> NodeSurvey:
    """The survey phase for this program, without staging anything (the doctor's)."""
    return survey_nodes(
        settings.survey, required_paths(program, os.getcwd()), environ, None, job_output_dir(program, environ)
    )


def job_output_dir(program: Sequence[str], environ: Mapping[str, str]) -> str:
    return output_dir(program, environ, os.getcwd(), os.path.isdir(DEFAULT_OUTPUT))


def prepare_attempt(
    settings: JobSettings,
    program: Sequence[str],
    environ: Mapping[str, str],
    options: plan.LaunchOptions | None = None,
    attempt: int = 1,
    chosen: FoundNodes | None = None,
) -> PreparedJob:
    """Survey, then prepare: the attempt's values are staged by the survey, used by the preparation.
    `chosen`: a restart's nodes, as the master planned them (else they are found)."""
    # Token-like argument values travel in the private file; every launcher's argv holds placeholders.
    hidden = hide_secret_arguments(program)
    if warning := secret_arguments_warning(program):
        log.warning("warning: %s", warning)
    staged = staged_values(settings.env_pass, environ, hidden.values)
    paths = required_paths(program, os.getcwd())
    survey = survey_nodes(
        settings.survey, paths, environ, staged.payload, job_output_dir(program, environ), chosen
    )
    try:
        return prepare(settings.prepare, survey, staged, hidden.argv, environ, options, attempt)
    except BaseException:
        cleanup.remove_private_files(survey, settings.prepare.job_root)  # staged, never to be read now
        survey.release()
        raise


def all_in(survey: NodeSurvey, job_root: str, unstaged: frozenset[str]) -> None:
    """Every rank checked in (each agent has read its private file, each node's ranks speak through
    its relay): the private files go, each removed by its node's relay (over ssh or srun only where
    no relay was told: a spare, a node whose relay is gone), and so do the ssh connections the launch
    no longer needs."""
    cleanup.remove_private_files(survey, job_root, unstaged)
    survey.reach.release()


def run_attempt(job: PreparedJob, context: AttemptContext) -> AttemptResult:
    """Run one attempt under supervision; whatever it leaves behind is reaped on every node."""
    settings, out = context.settings, context.out
    if context.newcomers:  # before any rank starts
        lines = handover.deliver(job.survey, context.newcomers, job.output_dir, settings.job_root)
        out.write("".join(f"gaudi-cluster: {line}\n" for line in lines))
        out.flush()
    # Listen only where the ranks reach the master (loopback for a local job), not on every interface.
    server = ControlServer(
        job.control_addr,
        settings.control_port,
        job.job_id,
        settings.heartbeat_timeout,
        job.token,
        job.rank_hosts,
        nodes=job.rank_nodes,
        addresses=job.survey.addresses(),
    )
    server.start()
    supervisor = Supervisor(
        job.job_id,
        job.plan,
        server,
        job.ranks_by_host,
        settings.supervise,
        out,
        on_all_started=lambda: all_in(job.survey, settings.job_root, server.unstage_on_relays()),
        on_first_step=report_plot.warm_up_plotting,
        rank_logs=RankLogs(job.job_dir / RANKS_DIR),
    )
    if context.metrics is not None:
        restarts = len(context.history)
        context.metrics.follow(lambda: supervisor.figures(restarts))
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
        out.write(f"gaudi-cluster: job {job.job_id}: spares (idle, no ranks): {', '.join(spares)}\n")
        out.flush()
    started, launched_at = time.monotonic(), time.time()
    reaped: frozenset[str] = frozenset()
    try:
        outcome = supervisor.run()
        if outcome.leaves_processes:  # each relay reaps its node after the stop
            reaped = server.reaped_by_relays(cleanup.REAP_TIMEOUT_S)
    finally:
        ended_at = time.time()
        server.close()
        status.close()
    lost = frozenset(supervisor.lost_hosts) | ({outcome.lost_host} if outcome.lost_host else set())
    cleaned: cleanup.Cleanup | None = None
    try:
        if outcome.leaves_processes:
            cleaned = cleanup.reap_everywhere(job.survey, settings.job_root, supervisor.lost_hosts, reaped)
        else:
            out.write(
                f"gaudi-cluster: job {job.job_id} succeeded: {job.world_size} ranks on "
                f"{len(job.ranks_by_host)} nodes in {time.monotonic() - started:.1f}s\n"
            )
            out.flush()
        record = write_report(job, outcome, supervisor, launched_at, ended_at, context, cleaned)
    finally:
        job.survey.release()
    return AttemptResult(outcome, lost, record)


def write_report(
    job: PreparedJob,
    outcome: JobOutcome,
    supervisor: Supervisor,
    launched_at: float,
    ended_at: float,
    context: AttemptContext,
    cleaned: cleanup.Cleanup | None = None,
) -> report.AttemptRecord:
    """job_report.json and job_report.png next to the job's results (on this node), listing the
    attempts before this one and this one, and how a stopped attempt's nodes were cleaned up;
    returns this attempt's record."""
    directory = Path(job.output_dir)
    events = report.read_events(job.job_dir / "events.jsonl", directory / "events.jsonl")
    points = {
        "container_start": report.container_start(),
        "master_start": report.process_start(),
        "launch": launched_at,
        **report.startup_points(events),
    }
    flagged = supervisor.view.watch.flagged
    survey, history = job.survey, context.history
    state, code = outcome.state.value, outcome.exit_code
    record = report.AttemptRecord.of(job.attempt, job.job_id, state, code, events, context.planned, history)
    record = dataclasses.replace(
        record,
        nodes=tuple(survey.node_name(host) for host in survey.hosts),
        spares=tuple(survey.node_name(host) for host in survey.spares),
        ended_at=ended_at,
    )
    built = report.build(
        job_id=job.job_id,
        state=state,
        exit_code=code,
        reports=survey.reports,
        ranks_by_host=job.ranks_by_host,
        rank_hosts=job.rank_hosts,
        preset_names=[name for name, _ in job.env.items],
        private_names=[name for name, _ in job.env.private],
        points=points,
        events=events,
        stragglers=[s.line() for s in flagged.values()],
        failure=outcome.failure.summary(job.job_id) if outcome.failure else None,
        attempts=(*history, record),
    )
    # Every rank's lines, whatever the console showed of them (rank 0's only, without --tee).
    rank_logs = str(job.job_dir / RANKS_DIR / "rank-<N>.log")
    built.update(rank_logs=rank_logs, reached_by=survey.reached_by())
    if context.fabric is not None:  # the --fabric-check run before this job
        built["fabric"] = context.fabric.to_dict()
    if cleaned is not None:
        built["cleanup"] = cleaned.to_dict()
    written = report.write(built, supervisor.server.work_histories(), set(flagged), directory)
    shown = ", ".join(str(path) for path in written)
    log.info("job report: %s; every rank's output: %s on this node", shown or "not written", rank_logs)
    return record

"""Master: the fabric check, run: ranks started on every node the way the job's are (the same survey,
preparation, launcher, environment and preset: job/attempt), running train/fabric_check.py; its
figures and verdict are view/fabric's (a FabricResult).

`gaudi-cluster doctor --fabric-check` prints them; `master --fabric-check` runs it before the job and stops
the launch when a node is slow or silent.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import shutil
import sys
import tempfile
from collections.abc import Mapping

from gaudi_cluster.job.attempt import AttemptContext, prepare_attempt, run_attempt
from gaudi_cluster.job.settings import JobSettings
from gaudi_cluster.launch import plan
from gaudi_cluster.supervise.console import RANKS_DIR
from gaudi_cluster.view import fabric
from gaudi_cluster.view.fabric import FabricResult, render_table

__all__ = ["FabricResult", "render_table", "run_check", "stop_line"]

log = logging.getLogger("gaudi_cluster.fabric")
PROGRAM_MODULE = "train.fabric_check"
SIZES = (4096, 1 << 20, 8 << 20)  # latency, a middle size, a bandwidth-bound size (bytes)


def check_program(python: str, timeout_s: float, output_dir: str, backend: str = "auto") -> list[str]:
    sizes = ",".join(map(str, SIZES))
    return [
        python,
        "-u",
        "-m",
        PROGRAM_MODULE,
        "--sizes",
        sizes,
        "--timeout",
        f"{timeout_s:g}",
        "--backend",
        backend,
        "--output_dir",
        output_dir,
    ]


def check_settings(settings: JobSettings) -> JobSettings:
    """The check is one short attempt: never a dry run, no restart, rank 0's lines only, and a stuck
    limit that leaves its collectives their own limits."""
    limit = settings.fabric.timeout_s
    attempt = settings.attempt
    supervise = dataclasses.replace(
        attempt.supervise, tee=False, stuck_timeout_s=max(attempt.supervise.stuck_timeout_s, 8 * limit)
    )
    return dataclasses.replace(
        settings,
        survey=dataclasses.replace(settings.survey, dry_run=False),
        prepare=dataclasses.replace(settings.prepare, dry_run=False),
        attempt=dataclasses.replace(attempt, supervise=supervise),
        fabric=dataclasses.replace(settings.fabric, enabled=False),
        max_restarts=0,
        dry_run=False,
    )


def run_check(
    settings: JobSettings, environ: Mapping[str, str], options: plan.LaunchOptions | None = None
) -> FabricResult:
    """One check on the nodes the job would use; its table is logged under the check's job id."""
    settings = check_settings(settings)
    limit = settings.fabric.timeout_s
    output_dir = tempfile.mkdtemp(prefix="gaudi-cluster-fabric-")
    program = check_program(sys.executable, limit, output_dir)
    job = prepare_attempt(settings, program, environ, options)
    hosts = list(dict.fromkeys(job.rank_hosts[r] for r in sorted(job.rank_hosts)))
    console = io.StringIO()  # the check's own lines stay in its rank logs; the table is the output
    try:
        outcome = run_attempt(job, AttemptContext(settings.attempt, console)).outcome
    finally:
        shutil.rmtree(output_dir, ignore_errors=True)  # its job report: the figures are returned instead
    rank0 = job.job_dir / RANKS_DIR / "rank-0.log"
    lines = rank0.read_text(errors="replace").splitlines() if rank0.exists() else []
    report = fabric.report_line(lines)
    if report is None:
        why = outcome.failure.summary(job.job_id) if outcome.failure else f"exit code {outcome.exit_code}"
        log.info("fabric check %s output:\n%s", job.job_id, console.getvalue()[-4000:])
        result = fabric.no_report(hosts, limit, why)
    else:
        # ranks_by_host is in hostfile order and ranks are numbered node by node: the first rank of each.
        firsts, rank = {}, 0
        for host, count in job.ranks_by_host.items():
            firsts[job.rank_hosts[rank]] = host
            rank += count
        result = fabric.figures(report, job.rank_hosts, firsts)
    log.info("fabric check %s:\n%s", job.job_id, render_table(result))
    return result


def stop_line(result: FabricResult) -> str:
    """The one line that stops a launch."""
    return f"gaudi-cluster: fabric check failed: {result.problems[0]}"

"""The fabric check, run: ranks started on every node the way the job's are (the same survey, preparation,
launcher, environment and preset: master.prepare_attempt + master.run_prepared), running
train/allreduce_check.py; its figures and verdict are view/fabric's.

`gaudi-cluster doctor --fabric-check` prints them; `master --fabric-check` runs it before the job and
stops the launch when a node is slow or silent.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from typing import TextIO

from gaudi_cluster.launch import plan
from gaudi_cluster.launch.prepare import PreparedJob
from gaudi_cluster.settings.config import ClusterConfig
from gaudi_cluster.supervise.console import RANKS_DIR
from gaudi_cluster.supervise.outcome import JobOutcome
from gaudi_cluster.view import fabric
from gaudi_cluster.view.fabric import render_table

__all__ = ["render_table", "run_check", "stop_line"]

log = logging.getLogger("gaudi_cluster.fabric")
PROGRAM_MODULE = "train.allreduce_check"
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


# master.prepare_attempt and master.run_prepared, handed in: the master imports this module.
Prepare = Callable[[ClusterConfig, list[str], Mapping[str, str], plan.LaunchOptions | None], PreparedJob]
RunPrepared = Callable[[PreparedJob, ClusterConfig, TextIO], JobOutcome]


def run_check(
    config: ClusterConfig,
    environ: Mapping[str, str],
    prepare: Prepare,
    run_prepared: RunPrepared,
    options: plan.LaunchOptions | None = None,
) -> tuple[fabric.FabricResult, str]:
    """One check on the nodes the job would use; returns the verdict and the check's job id."""
    # The check is one short attempt: no restart, no recursion, its own report away from the job's.
    limit = config.fabric_timeout
    config = dataclasses.replace(
        config,
        fabric_check=False,
        max_restarts=0,
        dry_run=False,
        tee=False,
        stuck_timeout=max(config.stuck_timeout, 8 * limit),
    )
    output_dir = tempfile.mkdtemp(prefix="gaudi-cluster-fabric-")
    program = check_program(sys.executable, limit, output_dir)
    job = prepare(config, program, environ, options)
    hosts = list(dict.fromkeys(job.rank_hosts[r] for r in sorted(job.rank_hosts)))
    console = io.StringIO()  # the check's own lines stay in its rank logs; the table is the output
    try:
        outcome = run_prepared(job, config, console)
    finally:
        shutil.rmtree(output_dir, ignore_errors=True)  # its job report: the figures are returned instead
    rank0 = job.job_dir / RANKS_DIR / "rank-0.log"
    lines = rank0.read_text(errors="replace").splitlines() if rank0.exists() else []
    report = fabric.report_line(lines)
    if report is None:
        why = outcome.failure.summary(job.job_id) if outcome.failure else f"exit code {outcome.exit_code}"
        log.info("fabric check %s output:\n%s", job.job_id, console.getvalue()[-4000:])
        return fabric.no_report(hosts, limit, why), job.job_id
    # ranks_by_host is in hostfile order and ranks are numbered node by node: the first rank of each.
    firsts, rank = {}, 0
    for host, count in job.ranks_by_host.items():
        firsts[job.rank_hosts[rank]] = host
        rank += count
    return fabric.figures(report, job.rank_hosts, firsts), job.job_id


def stop_line(result: fabric.FabricResult) -> str:
    """The one line that stops a launch."""
    return f"gaudi-cluster: fabric check failed: {result.problems[0]}"

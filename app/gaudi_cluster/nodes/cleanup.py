"""Clean-up on every node, all at once: the staged private files, and whatever an attempt left."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Set
from pathlib import Path

from gaudi_cluster.nodes import srun_steps, ssh
from gaudi_cluster.nodes.survey import NodeSurvey
from gaudi_cluster.rank import jobdir
from gaudi_cluster.rank.reap import reap_job

log = logging.getLogger("gaudi_cluster.nodes.cleanup")


def remove_private_files(survey: NodeSurvey, job_root: str) -> None:
    """Delete the private file the survey staged on every node: once every agent read it (all ranks
    checked in), or at once when the attempt ends before its launch."""
    if survey.local:
        (survey.job_dir / jobdir.PRIVATE_FILE).unlink(missing_ok=True)
        return
    path = str(jobdir.job_dir(job_root, survey.job_id) / jobdir.PRIVATE_FILE)
    hosts = (*survey.hosts, *survey.spares)  # a spare's probe staged one too, though it runs no rank
    if survey.srun is not None:
        failed = set(srun_steps.run_everywhere(survey.srun, hosts, ["rm", "-f", path], "gc-unstage", 10))
    elif survey.ssh_config is not None:
        results = ssh.run_on_hosts(hosts, ["rm", "-f", path], survey.ssh_config, timeout_s=10)
        failed = {host for host, result in results.items() if not result.ok}
    else:
        return
    for host in sorted(failed):
        log.warning(
            "could not remove the private file of job %s on %s (reap removes it)", survey.job_id, host
        )


def reap_everywhere(
    survey: NodeSurvey, job_root: str, ssh_port: int, lost_hosts: Set[str] = frozenset()
) -> None:
    """Kill whatever is left of this job (by its pid files) on every node still reachable.

    Nodes whose agents were lost are skipped: dead, or cut off, where those agents end their ranks
    themselves once the master's heartbeats stop; waiting on them would only delay the exit."""
    if survey.local:
        reap_job(Path(job_root), survey.job_id)
        return
    if survey.ssh_config is None and survey.srun is None:
        return
    cmd = [
        sys.executable,  # the image's Python: the same path on every node
        "-m",
        "gaudi_cluster",
        "reap",
        "--job-id",
        survey.job_id,
        "--job-root",
        job_root,
    ]
    # A dead or cut-off node must not hold the master's exit: its own agents end its ranks anyway.
    names = {host: survey.node_name(host) for host in survey.hosts}
    reachable = [host for host, name in names.items() if name not in lost_hosts]
    began = time.monotonic()
    if survey.srun is not None:
        # One step on every node still reachable; scancel's SIGTERM may have ended the job, and srun
        # then refuses the step at once (Slurm reaps the job's processes itself).
        failed = srun_steps.run_everywhere(survey.srun, reachable, cmd, "gc-reap", timeout_s=20)
        for host, why in failed.items():
            log.warning("could not clean up job %s on %s: %s", survey.job_id, host, why)
        log.debug("reaped job %s through srun in %.2fs", survey.job_id, time.monotonic() - began)
        return
    assert survey.ssh_config is not None
    results = ssh.run_on_hosts(reachable, cmd, survey.ssh_config, timeout_s=3, connect_timeout_s=1)
    log.debug("reaped job %s on %s in %.2fs", survey.job_id, ", ".join(reachable), time.monotonic() - began)
    for host, result in results.items():
        if not result.ok:
            why = ssh.explain_ssh_failure(result, ssh_port)
            log.warning("could not clean up job %s on %s: %s", survey.job_id, host, why)

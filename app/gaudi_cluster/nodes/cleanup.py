"""Master: clean-up on every node, all at once (through the survey's Reach): the staged private
files, and whatever an attempt left."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Set
from dataclasses import dataclass

from gaudi_cluster.nodes.reach import failures
from gaudi_cluster.nodes.survey import NodeSurvey
from gaudi_cluster.rank import jobdir

log = logging.getLogger("gaudi_cluster.nodes.cleanup")
# A node that does not answer must not hold the master's exit (over ssh: 3 s to connect, nodes/reach).
REAP_TIMEOUT_S = 10.0


def remove_private_files(survey: NodeSurvey, job_root: str, unstaged: Set[str] = frozenset()) -> None:
    """Delete the private file the survey staged on every node but those whose relay removed it
    (`unstaged`: their names in the plan, the survey's hosts): once every agent read it (all ranks
    checked in), or at once when the attempt ends before its launch."""
    path = str(jobdir.job_dir(job_root, survey.job_id) / jobdir.PRIVATE_FILE)
    # A spare's probe staged one too, though it runs no rank (and has no relay).
    hosts = [host for host in (*survey.hosts, *survey.spares) if host not in unstaged]
    if not hosts:
        return
    replies = survey.reach.run(hosts, ["rm", "-f", path], timeout_s=10, label="gc-unstage")
    for host in sorted(failures(replies)):
        log.warning(
            "could not remove the private file of job %s on %s (reap removes it)", survey.job_id, host
        )


@dataclass(frozen=True)
class Cleanup:
    """How an attempt that stopped was cleaned up, node by node (names as the report shows nodes)."""

    by_relay: tuple[str, ...] = ()  # the node's relay reaped it after the stop (or left it clean)
    by_master: tuple[str, ...] = ()  # the master ran `reap` there (over ssh or srun)
    skipped: tuple[str, ...] = ()  # lost (dead or cut off): its own agents end their ranks

    def to_dict(self) -> dict[str, list[str]]:
        return {
            "by_relay": list(self.by_relay),
            "by_master": list(self.by_master),
            "skipped": list(self.skipped),
        }


def reap_everywhere(
    survey: NodeSurvey, job_root: str, lost_hosts: Set[str] = frozenset(), reaped: Set[str] = frozenset()
) -> Cleanup:
    """Kill whatever is left of this job (by its pid files) on every node still reachable whose relay
    has not reaped it (`reaped`: the survey's hosts whose relay said so after the stop).

    Nodes whose agents were lost are skipped: dead, or cut off, where those agents end their ranks
    themselves once the master's heartbeats stop; waiting on them would only delay the exit. Under
    srun, scancel's SIGTERM may have ended the job, and srun then refuses the step at once (Slurm
    reaps the job's processes itself)."""
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
    by_relay: list[str] = []
    reachable: list[str] = []
    skipped: list[str] = []
    for host, name in names.items():
        (skipped if name in lost_hosts else by_relay if host in reaped else reachable).append(host)
    done = Cleanup(*(tuple(names[host] for host in hosts) for hosts in (by_relay, reachable, skipped)))
    if not reachable:
        return done
    began = time.monotonic()
    replies = survey.reach.run(reachable, cmd, timeout_s=REAP_TIMEOUT_S, label="gc-reap")
    log.debug("reaped job %s %s in %.2fs", survey.job_id, survey.reached_by(), time.monotonic() - began)
    for host, why in failures(replies).items():
        log.warning("could not clean up job %s on %s: %s", survey.job_id, host, why)
    return done

"""Master: where a job stands between its attempts, and the next attempt from the last one's result.

A JobRun is a value: `after` records an attempt's result (its record for the report, the nodes it
lost), `next` plans the following attempt from the survey the last one used (launch/restart); the
master's loop holds one JobRun and nothing else of the job's past.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gaudi_cluster.job.attempt import AttemptResult
from gaudi_cluster.launch import attempts, restart
from gaudi_cluster.launch.prepare import PreparedJob
from gaudi_cluster.nodes.find import FoundNodes
from gaudi_cluster.view.report import AttemptRecord


@dataclass(frozen=True)
class JobRun:
    """The job so far: the next attempt's number, program and nodes, and what the attempts before it left."""

    program: tuple[str, ...]
    attempt: int = 1
    nodes: FoundNodes | None = None  # a restart's nodes, as planned (None: the survey finds them)
    planned: attempts.AttemptPlan | None = None  # how this attempt's nodes came from the last one's
    excluded: tuple[str, ...] = ()  # nodes out for the rest of the job
    newcomers: tuple[str, ...] = ()  # nodes that take a lost node's place and need its checkpoint
    lines: tuple[str, ...] = ()  # what the console is told of this attempt's plan
    history: tuple[AttemptRecord, ...] = ()  # every attempt so far, for the job report
    lost: frozenset[str] = frozenset()  # every node lost so far (node names): not released at the end

    def after(self, result: AttemptResult) -> JobRun:
        """This run with an attempt's result recorded."""
        return replace(self, history=(*self.history, result.record), lost=self.lost | result.lost)

    def next(self, result: AttemptResult, job: PreparedJob, settings: restart.RestartSettings) -> JobRun:
        """The attempt after `result`'s: its lost nodes out, spares in their places (ClusterNotReady when
        fewer than --min-nodes are left)."""
        plan = restart.next_attempt(
            settings, job.survey, job.ranks_by_host, self.excluded, result.lost, self.program
        )
        return replace(
            self,
            program=plan.program,
            attempt=self.attempt + 1,
            nodes=plan.nodes,
            planned=plan.shown,
            excluded=plan.planned.nodes.excluded,
            newcomers=plan.planned.newcomers,
            lines=plan.lines,
        )

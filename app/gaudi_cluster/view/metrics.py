"""The job's figures for Prometheus: `--metrics-port` serves them from the running master at /metrics.

Built on prometheus_client: one collector turns a JobFigures (view/figures) into metric families at
scrape time, so nothing runs and nothing is kept per rank between scrapes; the HTTP server is
supervise/metrics_serving (one selector thread, connections bounded). Names follow the
Prometheus conventions: the `gaudi_cluster_` prefix, base units in the name (`_seconds`), `_total`
for counters, a state set for the job's state. Labels come from bounded sets only (host and rank,
which the job fixes at launch; the state names), never from values such as steps or messages.
The server lives for the whole master run: restarts keep one endpoint, and after the job ends it
serves the final figures until the master exits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from gaudi_cluster.view.figures import JobFigures

PREFIX = "gaudi_cluster"
# Every family this module serves (the tests and docs/architecture.md list the same).
NAMES = (
    "gaudi_cluster_job_info",
    "gaudi_cluster_job_state",
    "gaudi_cluster_restarts_total",
    "gaudi_cluster_elapsed_seconds",
    "gaudi_cluster_step",
    "gaudi_cluster_max_steps",
    "gaudi_cluster_samples_per_second",
    "gaudi_cluster_ranks",
    "gaudi_cluster_stragglers",
    "gaudi_cluster_rank_step",
    "gaudi_cluster_rank_work_seconds",
    "gaudi_cluster_rank_heartbeat_age_seconds",
    "gaudi_cluster_rank_straggler",
)


class JobCollector:
    """A prometheus_client collector of the job that `figures` describes at the time of a scrape."""

    def __init__(self, figures: Callable[[], JobFigures | None], states: Sequence[str]) -> None:
        self.figures = figures
        self.states = tuple(states)

    def describe(self) -> list[Any]:
        return []  # names are known only once figures exist; registering must not call collect()

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            InfoMetricFamily,
            StateSetMetricFamily,
        )

        f = self.figures()
        if f is None:
            return
        yield InfoMetricFamily(f"{PREFIX}_job", "the job this master runs", value={"job_id": f.job_id})
        yield StateSetMetricFamily(
            f"{PREFIX}_job_state",
            "the current attempt's state",
            value={state: state == f.state for state in self.states},
        )
        yield CounterMetricFamily(
            f"{PREFIX}_restarts", "attempts restarted after a failure (--max-restarts)", value=f.restarts
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_elapsed_seconds", "seconds since the current attempt was launched", value=f.elapsed_s
        )
        for name, help_text, value in (
            ("step", "the cluster's optimizer step (the slowest rank's)", f.step),
            ("max_steps", "the job's total optimizer steps", f.max_steps),
            ("samples_per_second", "cluster training samples per second (last 30 s)", f.samples_per_second),
        ):
            if value is not None:
                yield GaugeMetricFamily(f"{PREFIX}_{name}", help_text, value=value)
        ranks = GaugeMetricFamily(
            f"{PREFIX}_ranks", "ranks whose agents are connected, by state", labels=["state"]
        )
        exited = sum(rank.exited for rank in f.ranks)
        ranks.add_metric(["running"], len(f.ranks) - exited)
        ranks.add_metric(["exited"], exited)
        yield ranks
        yield GaugeMetricFamily(
            f"{PREFIX}_stragglers", "ranks named as stragglers so far", value=f.stragglers
        )
        yield from self._per_rank(f, GaugeMetricFamily)

    @staticmethod
    def _per_rank(f: JobFigures, gauge: Any) -> Iterator[Any]:
        labels = ["host", "rank"]
        step = gauge(f"{PREFIX}_rank_step", "a rank's optimizer step", labels=labels)
        work = gauge(
            f"{PREFIX}_rank_work_seconds",
            "a rank's own work per step (median of its recent steps, waits for other ranks excluded)",
            labels=labels,
        )
        age = gauge(
            f"{PREFIX}_rank_heartbeat_age_seconds",
            "seconds since the master last heard from a rank's agent",
            labels=labels,
        )
        straggler = gauge(f"{PREFIX}_rank_straggler", "1 when the rank is named a straggler", labels=labels)
        for rank in f.ranks:
            key = [rank.host, str(rank.rank)]
            if rank.step is not None:
                step.add_metric(key, rank.step)
            if rank.work_s is not None:
                work.add_metric(key, rank.work_s)
            age.add_metric(key, rank.heartbeat_age_s)
            straggler.add_metric(key, 1.0 if rank.straggler else 0.0)
        yield from (step, work, age, straggler)

"""Master: the one place the cluster's settings are cut into the slices each phase reads.

No phase below the job receives the whole ClusterConfig: the survey gets SurveySettings, preparing a
launch PrepareSettings, the supervisor SupervisorSettings, a restart's planning RestartSettings, and
so on. A phase that needs a new setting gets it added to its slice here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypeVar

from gaudi_cluster.engines.nodewatch import ReleaseSettings
from gaudi_cluster.launch.prepare import PrepareSettings
from gaudi_cluster.launch.restart import RestartSettings
from gaudi_cluster.nodes.find import FindSettings
from gaudi_cluster.nodes.survey import SurveySettings
from gaudi_cluster.settings.config import ClusterConfig
from gaudi_cluster.supervise.supervisor import SupervisorSettings

Slice = TypeVar("Slice")


@dataclass(frozen=True)
class AttemptSettings:
    """What running one attempt reads: the supervisor's slice, the control channel, the clean-up."""

    supervise: SupervisorSettings
    control_port: int
    heartbeat_timeout: float
    job_root: str


@dataclass(frozen=True)
class FabricSettings:
    """Whether the all-reduce check runs before the job, and each of its collectives' limit."""

    enabled: bool
    timeout_s: float


@dataclass(frozen=True)
class MetricsSettings:
    """Where the Prometheus endpoint listens; port None: none."""

    addr: str
    port: int | None


@dataclass(frozen=True)
class JobSettings:
    """Every phase's slice, cut once by the master; nothing here is read twice."""

    survey: SurveySettings
    prepare: PrepareSettings
    attempt: AttemptSettings
    restart: RestartSettings
    release: ReleaseSettings
    fabric: FabricSettings
    metrics: MetricsSettings
    accelerator: str
    env_pass: tuple[str, ...]
    include: str | None
    exclude: str | None
    max_restarts: int
    dry_run: bool

    @classmethod
    def from_config(cls, config: ClusterConfig) -> JobSettings:
        supervise = SupervisorSettings(
            start_timeout_s=config.start_timeout,
            stuck_timeout_s=config.stuck_timeout,
            stop_grace_s=config.stop_grace,
            status_interval_s=config.status_interval,
            tee=config.tee,
        )
        values = vars(config)
        return cls(
            survey=_cut(SurveySettings, values, find=_cut(FindSettings, values)),
            prepare=_cut(PrepareSettings, values),
            attempt=_cut(AttemptSettings, values, supervise=supervise),
            restart=_cut(RestartSettings, values),
            release=_cut(ReleaseSettings, values),
            fabric=FabricSettings(config.fabric_check, config.fabric_timeout),
            metrics=MetricsSettings(config.metrics_addr, config.metrics_port),
            **{name: values[name] for name in _OWN},
        )


_OWN = ("accelerator", "env_pass", "include", "exclude", "max_restarts", "dry_run")


def _cut(kind: type[Slice], values: dict[str, Any], **given: Any) -> Slice:
    """A slice whose fields carry the settings' names, from the settings' values (`given` aside)."""
    names = [f.name for f in fields(kind) if f.name not in given]  # type: ignore[arg-type]
    return kind(**{name: values[name] for name in names}, **given)

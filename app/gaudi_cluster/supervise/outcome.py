"""How a job attempt ended, as an explicit value, and what the master does about it. Pure."""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass, field

from gaudi_cluster.view.diagnosis import explain


class JobState(enum.Enum):
    SUCCEEDED = "succeeded"  # every rank exited 0
    FAILED = "failed"  # a rank failed, a node was lost, a rank got stuck, the launcher broke
    STOPPED = "stopped"  # the master was told to stop (SIGTERM/SIGINT/SIGHUP): ranks saved and exited


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass(frozen=True)
class RankFailure:
    host: str
    rank: int | None
    what: str  # "exited with code 3", "was killed by SIGKILL", "lost contact: ...", ...
    exit_code: int
    tail: tuple[str, ...] = ()

    def summary(self, job_id: str) -> str:
        """One line: where, how, the rank's own error and a hint when the cause is a known one."""
        where = f"host {self.host}" + (f" rank {self.rank}" if self.rank is not None else "")
        why = explain(self.tail, "SIGKILL" if "SIGKILL" in self.what else None)
        last = " | ".join(line.strip() for line in self.tail[-3:] if line.strip())
        return f"job {job_id} failed: {where} {self.what}{why}" + (f"; last lines: {last}" if last else "")


@dataclass(frozen=True)
class JobOutcome:
    state: JobState
    exit_code: int
    failure: RankFailure | None = None
    stop_signal: int | None = None
    ranks_seen: dict[int, str] = field(default_factory=dict)

    @classmethod
    def succeeded(cls, ranks_seen: dict[int, str]) -> JobOutcome:
        return cls(JobState.SUCCEEDED, 0, ranks_seen=ranks_seen)

    @classmethod
    def failed(cls, failure: RankFailure, ranks_seen: dict[int, str]) -> JobOutcome:
        return cls(JobState.FAILED, failure.exit_code or 1, failure=failure, ranks_seen=ranks_seen)

    @classmethod
    def stopped(cls, signum: int, ranks_seen: dict[int, str]) -> JobOutcome:
        return cls(JobState.STOPPED, 128 + signum, stop_signal=signum, ranks_seen=ranks_seen)

    @property
    def leaves_processes(self) -> bool:
        """Whether ranks may outlive the attempt somewhere (then the master reaps every node)."""
        return self.state is not JobState.SUCCEEDED


def should_restart(outcome: JobOutcome, attempt: int, max_restarts: int) -> bool:
    """Only a failure is retried, and only while restarts remain; a stop is the user's decision."""
    return outcome.state is JobState.FAILED and attempt <= max_restarts

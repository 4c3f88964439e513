"""How a job attempt ended, as an explicit value, and what the master does about it. Pure."""

from __future__ import annotations

import enum
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field

from gaudi_cluster.errors import signal_exit_code
from gaudi_cluster.view.diagnosis import explain


class JobState(enum.Enum):
    SUCCEEDED = "succeeded"  # every rank exited 0
    FAILED = "failed"  # a rank failed, a node was lost, a rank got stuck, the launcher broke
    STOPPED = "stopped"  # the master was told to stop (SIGTERM/SIGINT/SIGHUP): ranks saved and exited


class FailureCause(enum.Enum):
    """Why an attempt failed: what the master acts on (the failure's text is for people)."""

    EXITED = "exited"  # a rank exited with a non-zero code
    SIGNALLED = "signalled"  # a rank was killed by a signal
    LOST_CONTACT = (
        "lost contact"  # a rank's connection closed or its heartbeats stopped: node gone or cut off
    )
    STUCK = "stuck"  # a rank made no progress for the stuck timeout
    NEVER_STARTED = "never started"  # ranks did not check in within the start timeout
    LAUNCHER = "launcher"  # the launcher ended without every rank reporting success


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass(frozen=True)
class RankFailure:
    host: str
    rank: int | None
    cause: FailureCause
    what: str  # "exited with code 3", "was killed by SIGKILL", "lost contact: ...", ...
    exit_code: int
    tail: tuple[str, ...] = ()
    signum: int | None = None  # the signal that killed the rank (SIGNALLED)

    @classmethod
    def exited(cls, host: str, rank: int, code: int, tail: Sequence[str] = ()) -> RankFailure:
        return cls(host, rank, FailureCause.EXITED, f"exited with code {code}", code, tuple(tail))

    @classmethod
    def signalled(cls, host: str, rank: int, signum: int, code: int, tail: Sequence[str] = ()) -> RankFailure:
        what = f"was killed by {signal_name(signum)}"
        return cls(host, rank, FailureCause.SIGNALLED, what, code, tuple(tail), signum)

    @classmethod
    def lost(cls, host: str, rank: int, reason: str) -> RankFailure:
        return cls(host, rank, FailureCause.LOST_CONTACT, f"lost contact: {reason}", 1)

    @classmethod
    def stuck(cls, host: str, rank: int, step: int | None, age_s: float, timeout_s: float) -> RankFailure:
        at = f" at step {step}" if step is not None else ""
        what = f"is stuck{at}: no progress for {age_s:.0f}s (GAUDI_CLUSTER_STUCK_TIMEOUT={timeout_s:.0f})"
        return cls(host, rank, FailureCause.STUCK, what, 1)

    @classmethod
    def never_started(
        cls, missing: str, checked_in: int, expected: int, timeout_s: float, tail: Sequence[str] = ()
    ) -> RankFailure:
        what = f"ranks never checked in within {timeout_s:.0f}s ({checked_in} of {expected} did)"
        return cls(missing, None, FailureCause.NEVER_STARTED, what, 1, tuple(tail))

    @classmethod
    def launcher_ended(
        cls, code: int | None, finished: int, expected: int, tail: Sequence[str] = ()
    ) -> RankFailure:
        what = (
            f"launcher exited with code {code} after {finished} of {expected} ranks finished"
            if code
            else f"launcher ended but only {finished} of {expected} ranks reported success"
        )
        return cls("master", None, FailureCause.LAUNCHER, what, code if code and code > 0 else 1, tuple(tail))

    @property
    def lost_contact(self) -> bool:
        """Whether the master lost the rank's node (dead or cut off): nothing more is asked of it."""
        return self.cause is FailureCause.LOST_CONTACT

    def summary(self, job_id: str) -> str:
        """One line: where, how, the rank's own error and a hint when the cause is a known one."""
        where = f"host {self.host}" + (f" rank {self.rank}" if self.rank is not None else "")
        why = explain(self.tail, None if self.signum is None else signal_name(self.signum))
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
        return cls(JobState.STOPPED, signal_exit_code(signum), stop_signal=signum, ranks_seen=ranks_seen)

    @property
    def leaves_processes(self) -> bool:
        """Whether ranks may outlive the attempt somewhere (then the master reaps every node)."""
        return self.state is not JobState.SUCCEEDED

    @property
    def lost_host(self) -> str | None:
        """The node whose loss ended the attempt: dead or cut off, so the master's last words
        (the Slurm release) skip it rather than wait on its ssh."""
        return self.failure.host if self.failure is not None and self.failure.lost_contact else None


def should_restart(outcome: JobOutcome, attempt: int, max_restarts: int) -> bool:
    """Only a failure is retried, and only while restarts remain; a stop is the user's decision."""
    return outcome.state is JobState.FAILED and attempt <= max_restarts

"""Runs in every control-plane process (master, node relay, rank agent): the control channel's
messages, typed. Pure.

One frozen dataclass per kind (`MessageType`, in wire/kinds; the handshake's kinds are in
wire/handshake, and named here too); a line becomes one only through `parse_line` / `parse` here,
which check every field, and one goes out only through `render`. Whatever bytes arrive, the result
is a message of a kind the reader expects or `BadMessage` with a one-line reason that quotes and
cuts what it names (`fields`): a reader drops the line and carries on. Which reader takes which
kinds is spelled out below (`FROM_...`): no reader compares a "type" string.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

from gaudi_cluster.wire import protocol
from gaudi_cluster.wire.fields import (
    MAX_INT,
    BadMessage,
    count,
    decode,
    optional_count,
    optional_number,
    rank_of,
    shown,
    text,
)
from gaudi_cluster.wire.handshake import Challenge, Hello, Proof, Refused, Welcome
from gaudi_cluster.wire.kinds import MessageType

# The line checks, as every reader meets them, and the handshake's kinds and the enum, as every reader
# names them (messages.Hello, messages.MessageType).
__all__ = ["BadMessage", "decode", "shown"]
__all__ += ["Challenge", "Hello", "MessageType", "Proof", "Refused", "Welcome"]


# --- the messages ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Join:
    """A rank's agent asks its relay (and the relay the master) for its seat."""

    host: str
    rank: int
    pid: int
    node: str
    local_rank: int = 0
    TYPE: ClassVar[MessageType] = MessageType.JOIN

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> Join:
        return cls(
            host=text(message, "host", 255),
            rank=count(message, "rank"),
            pid=count(message, "pid"),
            node=text(message, "node", 255),
            local_rank=count(message, "local_rank", 0),
        )


@dataclass(frozen=True, slots=True)
class Seated:
    rank: int
    TYPE: ClassVar[MessageType] = MessageType.SEATED

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> Seated:
        return cls(count(message, "rank"))


@dataclass(frozen=True, slots=True)
class Beat:
    """A sign of life. From an agent: its rank's progress (None: not known, or unchanged since the
    last one in a relay's beats, where `rank` names whose it is). From the master: no fields."""

    step: int | None = None
    max_steps: int | None = None
    samples_per_step: int | None = None
    progress_age: float | None = None
    work: tuple[tuple[int, float], ...] = ()  # (step, seconds of the rank's own work), each sent once
    last_line: str | None = None
    rank: int | None = None
    TYPE: ClassVar[MessageType] = MessageType.BEAT

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> Beat:
        work = message.get("work", [])
        if type(work) is not list or len(work) > protocol.WORK_PER_BEAT:
            raise BadMessage(f"work is not a list of at most {protocol.WORK_PER_BEAT} [step, seconds] pairs")
        pairs = []
        for pair in work:
            if type(pair) is not list or len(pair) != 2:
                raise BadMessage("work holds something other than [step, seconds] pairs")
            step, seconds = pair
            if type(step) is not int or type(seconds) not in (int, float) or not math.isfinite(seconds):
                raise BadMessage("work holds something other than [step, seconds] pairs")
            if not 0 <= step <= MAX_INT or not 0 <= seconds <= protocol.MAX_WORK_S:
                raise BadMessage(
                    f"work holds a step or seconds out of range (0 to {protocol.MAX_WORK_S:.0e})"
                )
            pairs.append((step, float(seconds)))
        line = message.get("last_line")
        if line is not None and (type(line) is not str or len(line) > protocol.LAST_LINE_CHARS):
            raise BadMessage(f"last_line is not a text of at most {protocol.LAST_LINE_CHARS} characters")
        return cls(
            step=optional_count(message, "step"),
            max_steps=optional_count(message, "max_steps"),
            samples_per_step=optional_count(message, "samples_per_step"),
            progress_age=optional_number(message, "progress_age"),
            work=tuple(pairs),
            last_line=line,
            rank=rank_of(message, required=False),
        )


@dataclass(frozen=True, slots=True)
class Summary:
    """A relay's word for every rank of its node, every 1–2 s (protocol.beat_every): one flat list per
    hot field (the master applies each by slice; None: not known, or unchanged), a rank's median work
    per step and its steady fields only when they changed, its work history in buckets every
    WORK_FLUSH_S.
    On the line every list is flat (a work entry is [rank, step, seconds, steps, step, ...]): a JSON
    list of numbers is what a parser reads fastest."""

    ranks: tuple[int, ...]  # the node's ranks, in the order of the lists below
    steps: tuple[int | None, ...]  # each rank's step
    ages: tuple[float | None, ...]  # seconds since each rank's progress, by its node's clock
    timed: tuple[int | None, ...]  # each rank's newest timed step: the straggler check's clock
    medians: tuple[float | None, ...] = ()  # work_window.window_median, where it changed; () none did
    steady: tuple[Beat, ...] = ()  # (rank and) max_steps, samples_per_step, last_line: changed
    work: tuple[tuple[int, tuple[tuple[int, float, int], ...]], ...] = ()  # rank, (step, sum s, steps)
    TYPE: ClassVar[MessageType] = MessageType.SUMMARY

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> Summary:
        ranks = _numbers(message, "ranks", None, int)
        size = len(ranks)
        if size > protocol.MAX_RANKS_PER_NODE:
            raise BadMessage(f"ranks is not a list of at most {protocol.MAX_RANKS_PER_NODE}")
        medians = _numbers(message, "medians", (0, size), float, nullable=True)
        steady = message.get("steady", [])
        if type(steady) is not list or len(steady) > size or not all(type(e) is dict for e in steady):
            raise BadMessage("steady is not a list of a beat's fields per rank")
        work = message.get("work", [])
        if type(work) is not list or len(work) > size:
            raise BadMessage("work is not a list of [rank, step, seconds, steps, ...] per rank")
        return cls(
            tuple(ranks), tuple(_numbers(message, "steps", (size,), int, nullable=True)),
            _floats(_numbers(message, "ages", (size,), float, nullable=True)),
            tuple(_numbers(message, "timed", (size,), int, nullable=True)), _floats(medians),
            tuple(_steady(entry) for entry in steady),
            tuple(_work(entry) for entry in work),
        )  # fmt: skip


_NONE = type(None)
_KINDS = {int: {int}, float: {int, float}}


def _numbers(
    message: Mapping[str, Any], name: str, sizes: tuple[int, ...] | None, kind: type, nullable: bool = False
) -> list[Any]:
    """A list of non-negative finite numbers of this kind (None too when nullable), its length one
    of sizes (any: None), checked at C speed where it can be: a summary is 500–1,000 lines a second."""
    value = message.get(name, [])
    if type(value) is not list or (sizes is not None and len(value) not in sizes):
        length = "" if sizes is None else f" of length {' or '.join(map(str, sizes))}"
        raise BadMessage(f"{name} is not a list{length}")
    kinds = set(map(type, value))
    if not kinds <= (_KINDS[kind] | {_NONE} if nullable else _KINDS[kind]):
        raise BadMessage(f"{name} holds a value of the wrong kind")
    known = [v for v in value if v is not None] if _NONE in kinds else value
    if known and (min(known) < 0 or max(known) > MAX_INT):  # past it: no float, or a sum not finite
        raise BadMessage(f"{name} holds a value of the wrong kind")
    return value


def _steady(entry: Mapping[str, Any]) -> Beat:
    rank_of(entry)  # a steady entry names its rank
    return Beat.parse(entry)


def _floats(values: list[int | float | None]) -> tuple[float | None, ...]:
    return tuple(None if v is None else float(v) for v in values)


def _work(entry: object) -> tuple[int, tuple[tuple[int, float, int], ...]]:
    """[rank, step, seconds, steps, step, ...] as (rank, ((step, seconds, steps), ...))."""
    flat = _numbers({"work": entry}, "work", None, float)
    if len(flat) % 3 != 1 or len(flat) > 1 + 3 * protocol.WORK_BUCKETS or type(flat[0]) is not int:
        raise BadMessage(f"work holds something other than [rank, up to {protocol.WORK_BUCKETS} buckets]")
    steps, counts = flat[1::3], flat[3::3]
    if not set(map(type, steps + counts)) <= {int} or 0 in counts:
        raise BadMessage("a work bucket is not step, seconds, steps")
    return flat[0], tuple(zip(steps, map(float, flat[2::3]), counts, strict=True))


@dataclass(frozen=True, slots=True)
class Output:
    """A rank's output lines, in order, as its agent read them (no prefix: the master knows whose they
    are). They take the relay's connection instead of the launch's ssh session, which can then end
    once the node's ranks are seated. `rank` is set by the relay."""

    lines: tuple[str, ...]
    rank: int | None = None
    TYPE: ClassVar[MessageType] = MessageType.OUTPUT

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> Output:
        lines = message.get("lines")
        if (
            type(lines) is not list
            or not 0 < len(lines) <= protocol.OUTPUT_MAX_LINES
            or not all(type(line) is str for line in lines)
        ):
            raise BadMessage(f"lines is not a list of 1 to {protocol.OUTPUT_MAX_LINES} texts")
        return cls(tuple(lines), rank_of(message, required=False))


def output_batches(lines: Sequence[str]) -> list[Output]:
    """Lines as the fewest `output` messages that each fit a line of the channel, in order; a line
    longer than a message can carry alone is cut to fit (the node's own rank log keeps it whole)."""
    batches: list[Output] = []
    batch: list[str] = []
    size = 0
    for whole in lines:
        line, cost = whole, len(json.dumps(whole)) + 1
        while cost > protocol.OUTPUT_BATCH_BYTES:  # escapes make a character cost 1 to 12 bytes
            line = line[: len(line) * protocol.OUTPUT_BATCH_BYTES // cost - 1]
            cost = len(json.dumps(line)) + 1
        if batch and (size + cost > protocol.OUTPUT_BATCH_BYTES or len(batch) == protocol.OUTPUT_MAX_LINES):
            batches.append(Output(tuple(batch)))
            batch, size = [], 0
        batch.append(line)
        size += cost
    if batch:
        batches.append(Output(tuple(batch)))
    return batches


@dataclass(frozen=True, slots=True)
class Exit:
    """A rank ended: its exit code, the signal that ended it, its last lines, why it was stopped.
    `rank` is set by the relay (an agent's own link names its rank already)."""

    code: int
    signal: int | None = None
    tail: tuple[str, ...] = ()
    stop_reason: str | None = None
    rank: int | None = None
    TYPE: ClassVar[MessageType] = MessageType.EXIT

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> Exit:
        code = message.get("code")
        if type(code) is not int or not -(2**31) <= code < 2**31:
            raise BadMessage("code is not an integer")
        signal = message.get("signal")
        if signal is not None and (type(signal) is not int or not 0 < signal < 128):
            raise BadMessage("signal is not a signal number")
        tail = message.get("tail", [])
        if (
            type(tail) is not list
            or len(tail) > protocol.TAIL_MAX_LINES
            or not all(type(line) is str for line in tail)
        ):
            raise BadMessage(f"tail is not a list of at most {protocol.TAIL_MAX_LINES} texts")
        reason = message.get("stop_reason")
        if reason is not None and (type(reason) is not str or len(reason) > 1024):
            raise BadMessage("stop_reason is not a short text")
        return cls(code, signal, tuple(tail), reason, rank_of(message, required=False))


def fitted_exit(exit: Exit, room: int) -> Exit:
    """This exit with as many of its newest tail lines (each cut to TAIL_MAX_CHARS) as keep its JSON
    within `room` bytes. A rank's last lines are whatever it printed (a line of 60 KB, or of bytes
    escaped six times over): its exit code must reach the master all the same, and a relay's line
    over MAX_LINE would cost the node's connection."""
    tail = protocol.trimmed_tail(exit.tail)
    used = len(json.dumps(render(replace(exit, tail=("",))), separators=(",", ":")))
    kept: list[str] = []
    for line in reversed(tail):
        used += len(json.dumps(line)) + 1  # quoted and escaped as the line carries it, and a comma
        if used > room:
            break
        kept.append(line)
    return replace(exit, tail=tuple(reversed(kept)))


@dataclass(frozen=True, slots=True)
class Gone:
    rank: int
    reason: str
    TYPE: ClassVar[MessageType] = MessageType.GONE

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> Gone:
        return cls(count(message, "rank"), text(message, "reason", 1024))


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop the rank, with grace_s to save (None: the agent's default)."""

    grace: float | None = None
    reason: str | None = None
    TYPE: ClassVar[MessageType] = MessageType.STOP

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> Stop:
        reason = message.get("reason")
        if reason is not None and type(reason) is not str:
            raise BadMessage("reason is not text")
        return cls(optional_number(message, "grace"), reason[:1024] if reason else None)


@dataclass(frozen=True, slots=True)
class Unstage:
    """Every rank of the attempt has checked in, so every agent has read the node's private file: the
    relay removes it (the master's ssh or srun no longer has to)."""

    TYPE: ClassVar[MessageType] = MessageType.UNSTAGE

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> Unstage:
        return cls()


@dataclass(frozen=True, slots=True)
class Reaped:
    """The relay's last word after a stop: its node's agents have left (or were killed at the stop's
    deadline), whatever their pid files still named is killed (`killed`: how many pids), and the
    private file is gone. A relay that ends before any stop says it too (`killed` 0) where its
    agents all exited and left no pid file. The master reaches the node for clean-up only without
    this word."""

    killed: int = 0
    TYPE: ClassVar[MessageType] = MessageType.REAPED

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> Reaped:
        return cls(count(message, "killed", 0))


Message = (
    Challenge
    | Hello
    | Welcome
    | Proof
    | Refused
    | Join
    | Seated
    | Beat
    | Summary
    | Output
    | Exit
    | Gone
    | Stop
    | Unstage
    | Reaped
)
_MESSAGE_KINDS = (
    Challenge,
    Hello,
    Welcome,
    Proof,
    Refused,
    Join,
    Seated,
    Beat,
    Summary,
    Output,
    Exit,
    Gone,
    Stop,
    Unstage,
    Reaped,
)
_PARSERS: dict[str, Callable[[Mapping[str, Any]], Message]] = {
    kind.TYPE.value: kind.parse for kind in _MESSAGE_KINDS
}

# Which kinds each reader takes (anything else is dropped as unexpected).
TO_MASTER_HANDSHAKE = frozenset({MessageType.HELLO, MessageType.PROOF})
FROM_AGENT_SESSION = frozenset({MessageType.BEAT, MessageType.EXIT})  # an agent's own connection
FROM_RELAY_SESSION = frozenset(
    {
        MessageType.JOIN,
        MessageType.SUMMARY,
        MessageType.OUTPUT,
        MessageType.EXIT,
        MessageType.GONE,
        MessageType.REAPED,
    }
)
FROM_MASTER_HANDSHAKE = frozenset({MessageType.CHALLENGE, MessageType.WELCOME, MessageType.REFUSED})
FROM_MASTER = frozenset({MessageType.SEATED, MessageType.REFUSED, MessageType.STOP, MessageType.BEAT})
TO_RELAY = FROM_MASTER | {MessageType.UNSTAGE}  # what a relay takes from the master (never forwarded)
# at the relay's socket
FROM_AGENT = frozenset({MessageType.JOIN, MessageType.BEAT, MessageType.OUTPUT, MessageType.EXIT})
ANY = frozenset(MessageType)


@dataclass(frozen=True, slots=True)
class Dropped:
    """What a reader got instead of a message: a line that was no message for it, and why."""

    reason: str


def parse(message: Mapping[str, Any], allowed: Collection[MessageType] = ANY) -> Message:
    """A decoded line as its typed message; BadMessage when it is none of the allowed kinds."""
    kind = message.get("type")
    parser = _PARSERS.get(kind) if type(kind) is str else None
    if parser is None:
        raise BadMessage(f"unknown message type {shown(kind)}")
    if MessageType(kind) not in allowed:
        raise BadMessage(f"a {kind} message is not expected here")
    return parser(message)


def parse_line(line: bytes, allowed: Collection[MessageType] = ANY) -> Message:
    return parse(decode(line), allowed)


def render(message: Message) -> dict[str, Any]:
    """A message's fields as its line carries them: what is None or empty is left out (a relay's
    summary keeps its lists, even empty)."""
    out: dict[str, Any] = {"type": message.TYPE.value}
    for each in fields(message):
        value = getattr(message, each.name)
        if value is not None and value != ():
            out[each.name] = value
    if isinstance(message, Summary):
        out.update(ranks=message.ranks, steps=message.steps, ages=message.ages, timed=message.timed)
        if message.work:
            out["work"] = [
                [rank, *(x for bucket in buckets for x in bucket)] for rank, buckets in message.work
            ]
        out.pop("steady", None)
        if message.steady:
            out["steady"] = [{k: v for k, v in render(e).items() if k != "type"} for e in message.steady]
    return out

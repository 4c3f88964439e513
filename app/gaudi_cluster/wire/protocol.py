"""The control channel's protocol, pure: keys, the handshake's MACs, sealed messages, and what each
message may contain.

Keys: the master holds the attempt's secret; each node holds only its node key, HMAC(secret, node),
staged over ssh stdin into a 0600 file, so a node can answer only as itself.
Handshake (the master proves itself before the agent proves anything):
  master -> challenge(N1)          agent -> hello(node, host, rank, N2)
  master -> welcome(MAC_k(N1, N2, ...))        agent -> proof(MAC_k(N1, N2, ...))
where k is the node's key. Both then derive a session key from k and both nonces, and every later
message carries a sequence number and a MAC under it (`Session`): a peer on the path can neither
inject a stop or a fake exit nor replay one. Every message is one JSON line of at most MAX_LINE
bytes, and every field is type-checked before use.

A node relay (`rank.relay`) holds its node's one connection for all its ranks: its hello says role
"node" and carries no rank (the MACs name rank NODE_RANK), and its session then carries `join` (a rank
asks for its seat, answered `seated` or `refused`), one `beats` a second for every rank of the node
(fields unchanged since the last one left out), each rank's `exit`, and `gone` (an agent that left
without one). A stop or a beat from the master is for every rank of the node.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import secrets
from collections.abc import Mapping
from typing import Any

MAX_LINE = 64 * 1024
BEAT_INTERVAL_S = 1.0  # both ends send a beat every second
HANDSHAKE_TIMEOUT_S = 5.0
TAIL_MAX_LINES = 30
TAIL_MAX_CHARS = 2048
WORK_PER_BEAT = 16  # a beat stays well under 1 KB
LAST_LINE_CHARS = 160
NODE_RANK = -1  # the rank a node relay's handshake MACs name: it speaks for all of its node's ranks
MAX_RANKS_PER_NODE = 64  # entries of one `beats` (a Gaudi server has 8 cards)
_HEX64 = re.compile(r"[0-9a-f]{64}")
_NUMBERS = (int, float)  # exact types: a bool is not a number here


def new_token() -> str:
    """The per-attempt job secret: 256 random bits."""
    return secrets.token_hex(32)


def new_nonce() -> str:
    return secrets.token_hex(32)


def _mac(token: str, *parts: object) -> str:
    message = "\x1f".join(str(part) for part in parts).encode()
    return hmac.new(bytes.fromhex(token), message, hashlib.sha256).hexdigest()


def node_key(secret: str, node: str) -> str:
    """The key a node's agents hold: derived from the attempt's secret and the node's name in the plan."""
    return _mac(secret, "node", node)


def welcome_mac(
    key: str, master_nonce: str, agent_nonce: str, job: str, node: str, host: str, rank: int
) -> str:
    return _mac(key, "welcome", master_nonce, agent_nonce, job, node, host, rank)


def proof_mac(
    key: str, master_nonce: str, agent_nonce: str, job: str, node: str, host: str, rank: int
) -> str:
    return _mac(key, "proof", master_nonce, agent_nonce, job, node, host, rank)


def session_key(key: str, master_nonce: str, agent_nonce: str, job: str, rank: int) -> str:
    return _mac(key, "session", master_nonce, agent_nonce, job, rank)


def _canonical(message: Mapping[str, Any]) -> str:
    return json.dumps({k: v for k, v in message.items() if k != "mac"}, sort_keys=True, separators=(",", ":"))


class Session:
    """One direction-aware MAC session of an admitted connection: every message sealed with the next
    sequence number, every message received checked for its MAC and for coming next (no replay)."""

    def __init__(self, key: str, role: str) -> None:
        self._key, self._sending, self._receiving = key, role, "agent" if role == "master" else "master"
        self._sent = self._received = 0

    def seal(self, message: Mapping[str, Any]) -> dict[str, Any]:
        self._sent += 1
        sealed = {**message, "seq": self._sent}
        return {**sealed, "mac": _mac(self._key, self._sending, _canonical(sealed))}

    def open(self, message: object) -> str | None:
        """Why this received message must be dropped (None: authentic and next in order)."""
        if not isinstance(message, dict):
            return "not a JSON object"
        seq = message.get("seq")
        if not _is_int(seq) or not same_mac(
            _mac(self._key, self._receiving, _canonical(message)), message.get("mac")
        ):
            return "no valid session MAC"
        if seq != self._received + 1:
            return f"sequence {seq} where {self._received + 1} was due (a replay or a lost message)"
        self._received = seq
        return None


def same_mac(expected: str, given: object) -> bool:
    return isinstance(given, str) and hmac.compare_digest(expected, given)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _short_text(value: Any, limit: int) -> bool:
    return isinstance(value, str) and len(value) <= limit


def is_node_hello(message: Mapping[str, Any]) -> bool:
    return message.get("role") == "node"


def _check_hello(message: Mapping[str, Any]) -> str | None:
    if not _short_text(message.get("job"), 128):
        return "job is not a string"
    role = message.get("role", "rank")
    if role not in ("rank", "node"):
        return "role is neither rank nor node"
    if role == "node" and message.get("rank", NODE_RANK) != NODE_RANK:
        return f"a node's hello names rank {NODE_RANK} or none"
    return _check_member(message, rank_required=role == "rank") or _hex_fields(message, "nonce")


def _check_member(message: Mapping[str, Any], rank_required: bool = True) -> str | None:
    """The fields naming one rank's agent: host, rank, pid, local_rank, node."""
    if not _short_text(message.get("host"), 255) or not message.get("host"):
        return "host is not a host name"
    if rank_required and (not _is_int(message.get("rank")) or message["rank"] < 0):
        return "rank is not a non-negative integer"
    if not _is_int(message.get("pid")) or message["pid"] < 0:
        return "pid is not a non-negative integer"
    local_rank = message.get("local_rank", 0)
    if not _is_int(local_rank) or local_rank < 0:
        return "local_rank is not a non-negative integer"
    if not _short_text(message.get("node"), 255) or not message.get("node"):
        return "node is not a node name"
    return None


def _hex_fields(message: Mapping[str, Any], *fields: str) -> str | None:
    for field in fields:
        if not isinstance(message.get(field), str) or not _HEX64.fullmatch(message[field]):
            return f"{field} is not 64 hex digits"
    return None


def _check_proof(message: Mapping[str, Any]) -> str | None:
    return _hex_fields(message, "mac")


def _check_beat(message: Mapping[str, Any]) -> str | None:
    # Thousands of these a second at scale (one per rank per beat): plain type() tests, no helpers.
    for field in ("step", "max_steps", "samples_per_step"):
        value = message.get(field)
        if value is not None and (type(value) is not int or value < 0):
            return f"{field} is not a non-negative integer"
    age = message.get("progress_age")
    if age is not None and (type(age) not in _NUMBERS or not 0 <= age < math.inf):
        return "progress_age is not a non-negative number"
    work = message.get("work", [])
    if type(work) is not list or len(work) > WORK_PER_BEAT:
        return f"work is not a list of at most {WORK_PER_BEAT} [step, seconds] pairs"
    for pair in work:
        if type(pair) is not list or len(pair) != 2:
            return "work holds something other than [step, seconds] pairs"
        step, seconds = pair
        if type(step) is not int or type(seconds) not in _NUMBERS or not math.isfinite(seconds):
            return "work holds something other than [step, seconds] pairs"
        if step < 0 or seconds < 0:
            return "work holds a negative step or duration"
    line = message.get("last_line")
    if line is not None and not _short_text(line, LAST_LINE_CHARS):
        return f"last_line is not a string of at most {LAST_LINE_CHARS} characters"
    return None


def beat(
    progress: Mapping[str, Any] | None, sent_upto: int, output_age: float, now: float, last_line: str | None
) -> tuple[dict[str, Any], int]:
    """An agent's beat from its rank's progress file (None: the rank writes none) and (the message,
    the last step whose work time it carries): each step's work time is sent once."""
    message: dict[str, Any] = {"type": "beat", "step": None, "progress_age": round(max(0.0, output_age), 3)}
    if last_line is not None:
        message["last_line"] = last_line[:LAST_LINE_CHARS]
    try:
        step, stamp = int(progress["step"]), float(progress["t"])  # type: ignore[index]
    except (TypeError, KeyError, ValueError):
        return message, sent_upto
    message.update(step=step, progress_age=round(max(0.0, now - stamp), 3))
    for field in ("max_steps", "samples_per_step"):
        if _is_int(progress.get(field)):  # type: ignore[union-attr]
            message[field] = progress[field]  # type: ignore[index]
    fresh = [
        [int(s), float(w)]
        for s, w in progress.get("work", [])  # type: ignore[union-attr]
        if _is_int(s) and _is_number(w) and s > sent_upto
    ][-WORK_PER_BEAT:]
    message["work"] = fresh
    return message, max([sent_upto, *(s for s, _ in fresh)])


def _check_exit(message: Mapping[str, Any]) -> str | None:
    if not _is_int(message.get("code")):
        return "code is not an integer"
    signal = message.get("signal")
    if signal is not None and (not _is_int(signal) or not 0 < signal < 128):
        return "signal is not a signal number"
    tail = message.get("tail", [])
    if not isinstance(tail, list) or len(tail) > TAIL_MAX_LINES or not all(isinstance(t, str) for t in tail):
        return f"tail is not a list of at most {TAIL_MAX_LINES} strings"
    reason = message.get("stop_reason")
    if reason is not None and not _short_text(reason, 1024):
        return "stop_reason is not a short string"
    return None


def _rank_of(message: Mapping[str, Any]) -> str | None:
    if not _is_int(message.get("rank")) or message["rank"] < 0:
        return "rank is not a non-negative integer"
    return None


def _check_join(message: Mapping[str, Any]) -> str | None:
    return _check_member(message)


def _check_beats(message: Mapping[str, Any]) -> str | None:
    ranks = message.get("ranks")
    if not isinstance(ranks, list) or len(ranks) > MAX_RANKS_PER_NODE:
        return f"ranks is not a list of at most {MAX_RANKS_PER_NODE} beats"
    for entry in ranks:
        if not isinstance(entry, dict):
            return "ranks holds something other than beats"
        why = _rank_of(entry) or _check_beat(entry)
        if why is not None:
            return why
    return None


def _check_rank_exit(message: Mapping[str, Any]) -> str | None:
    return _rank_of(message) or _check_exit(message)


def _check_gone(message: Mapping[str, Any]) -> str | None:
    return _rank_of(message) or (None if _short_text(message.get("reason"), 1024) else "reason is not text")


AGENT_MESSAGES = {"hello": _check_hello, "proof": _check_proof, "beat": _check_beat, "exit": _check_exit}
# What an admitted agent may send (the session's seq and mac are checked by the Session).
SESSION_MESSAGES = {"beat": _check_beat, "exit": _check_exit}
# What an admitted node relay may send, for the ranks of its node.
NODE_SESSION_MESSAGES = {
    "join": _check_join,
    "beats": _check_beats,
    "exit": _check_rank_exit,
    "gone": _check_gone,
}


def problem(message: Any, allowed: Mapping[str, Any] = AGENT_MESSAGES) -> str | None:
    """Why an agent's message must be dropped, or None when it is well-formed."""
    if not isinstance(message, dict) or not message:
        return "not a JSON object"  # {}: the channel's word for a line that does not parse
    kind = message.get("type")
    if kind not in allowed:
        return f"unknown message type {str(kind)[:40]!r}"
    return allowed[kind](message)


def trimmed_tail(tail: list[str]) -> tuple[str, ...]:
    """A rank's last lines, each cut to TAIL_MAX_CHARS (a report is one line, not a dump)."""
    return tuple(line[:TAIL_MAX_CHARS] for line in tail[-TAIL_MAX_LINES:])

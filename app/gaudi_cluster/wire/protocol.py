"""The control channel's protocol, pure: keys, the handshake's MACs and sealed lines (the messages
themselves are typed in `messages`).

Keys: the master holds the attempt's secret; each node holds only its node key, HMAC(secret, node),
staged over ssh stdin into a 0600 file, so a node can answer only as itself.
Handshake (the master proves itself before the agent proves anything):
  master -> challenge(N1)          agent -> hello(node, host, rank, N2)
  master -> welcome(MAC_k(N1, N2, ...))        agent -> proof(MAC_k(N1, N2, ...))
where k is the node's key. Both then derive a session key from k and both nonces, and every later
message carries a sequence number and a MAC under it (`Session`): a peer on the path can neither
inject a stop or a fake exit nor replay one. Every message is one JSON line of at most MAX_LINE
bytes; what each may contain is checked in `messages`.

A node relay (`rank.relay`) holds its node's one connection for all its ranks: its hello says role
"node" and carries no rank (the MACs name rank NODE_RANK), and its session then carries `join` (a rank
asks for its seat, answered `seated` or `refused`), one `summary` every beat_every s for every rank of the
node (flat lists of steps, progress ages and newest timed steps; a rank's median work per step and its
steady fields only when they changed; work-history buckets every WORK_FLUSH_S), the direct launcher's
ranks' `output` lines, each rank's `exit`, and `gone` (an agent that left without one). A stop or a
beat from the master is for every rank of the node.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass
from typing import Any

# hashlib, hmac and secrets are imported where they are used: a rank agent (its link to the node's
# relay is a Unix socket, unsealed) uses none of them, and would load OpenSSL at every start for nothing.

MAX_LINE = 64 * 1024
BEAT_INTERVAL_S = 1.0  # an agent beats every second; the master checks for silence as often
# After the master's stop and its grace: what an agent has not ended by then, its node's relay kills
# (as `gaudi-cluster reap` would) and says so, so the master need not reach the node for it. The
# master waits this long and a little more for that word before it reaps a node itself.
RELAY_STOP_MARGIN_S = 2.0
# Both ends of a node's connection beat every few seconds (its relay the node's summary, the master its
# beat), always at least four times within the heartbeat timeout (see beat_every): one sealed line a
# second each way with 1,000 nodes was most of the master's CPU.
BEAT_MAX_S = 2
HANDSHAKE_TIMEOUT_S = 5.0
TAIL_MAX_LINES = 30
TAIL_MAX_CHARS = 2048
# A rank's output travels in `output` messages of at most this many lines, each sealed line under
# OUTPUT_BATCH_BYTES of JSON (room for the seal within MAX_LINE); a longer line is cut there.
OUTPUT_MAX_LINES = 256
OUTPUT_BATCH_BYTES = 48 * 1024
WORK_PER_BEAT = 16  # a beat stays well under 1 KB
MAX_WORK_S = 1e9  # a step's work time past 30 years is garbage; below it a relay's sums stay small
LAST_LINE_CHARS = 160
NODE_RANK = -1  # the rank a node relay's handshake MACs name: it speaks for all of its node's ranks
MAX_RANKS_PER_NODE = 64  # ranks of one `summary` (a Gaudi server has 8 cards)
# A relay sends its ranks' work times for the report every WORK_FLUSH_S, merged into at most
# WORK_BUCKETS aligned buckets a rank (fewer when a node has many ranks: a summary stays under
# MAX_LINE): the report keeps 256 points a rank anyway, and each pair parsed costs the master.
WORK_FLUSH_S = 30.0
WORK_BUCKETS = 16
WORK_BUCKETS_PER_NODE = 512


def beat_every(heartbeat_timeout_s: float) -> int:
    """Whole seconds between a relay's summaries, and between the master's beats to each node: at most
    a quarter of the heartbeat timeout, so either end hears four before it would call the other lost;
    between 1 and BEAT_MAX_S."""
    return max(1, min(BEAT_MAX_S, int(heartbeat_timeout_s / 4)))


def new_token() -> str:
    """The per-attempt job secret: 256 random bits."""
    import secrets

    return secrets.token_hex(32)


def new_nonce() -> str:
    import secrets

    return secrets.token_hex(32)


def _mac(token: str, *parts: object) -> str:
    import hashlib
    import hmac

    message = "\x1f".join(str(part) for part in parts).encode()
    return hmac.new(bytes.fromhex(token), message, hashlib.sha256).hexdigest()


def node_key(secret: str, node: str) -> str:
    """The key a node's agents hold: derived from the attempt's secret and the node's name in the plan."""
    return _mac(secret, "node", node)


@dataclass(frozen=True, slots=True)
class Transcript:
    """What both handshake MACs bind: both nonces and who the agent says it is (a node relay names
    rank NODE_RANK)."""

    master_nonce: str
    agent_nonce: str
    job: str
    node: str
    host: str
    rank: int


def welcome_mac(key: str, transcript: Transcript) -> str:
    return _mac(key, "welcome", *astuple(transcript))


def proof_mac(key: str, transcript: Transcript) -> str:
    return _mac(key, "proof", *astuple(transcript))


def session_key(key: str, master_nonce: str, agent_nonce: str, job: str, rank: int) -> str:
    return _mac(key, "session", master_nonce, agent_nonce, job, rank)


# What sealing adds to a message's JSON (its closing brace replaced): the longest seq, the MAC, "}\n".
SEAL_BYTES = len(b',"seq":') + 18 + len(b',"mac":""}\n') + 64 - 1
MAX_SEALED_BODY = MAX_LINE - SEAL_BYTES  # the longest JSON a session may carry
_SEALED_END = re.compile(rb',"seq":([1-9][0-9]{0,17}),"mac":"([0-9a-f]{64})"\}\r?\n?\Z')


class Unsealed(ValueError):
    """A received line without this session's MAC, or out of order: the one-line reason to log."""


class Session:
    """One direction-aware MAC session of an admitted connection: every line sent sealed with the
    next sequence number, every line received checked for its MAC and for coming next (no replay).

    The MAC covers the line's own bytes (the sender's JSON up to and with its seq), so a line is
    authenticated before it is parsed, and nothing is re-encoded to check it:
        {"type":"beat",...,"seq":7,"mac":"<HMAC(session key, role + 0x1f + the bytes before ,"mac")>"}
    """

    def __init__(self, key: str, role: str) -> None:
        self._key = bytes.fromhex(key)
        self._sending = role.encode() + b"\x1f"
        self._receiving = (b"agent" if role == "master" else b"master") + b"\x1f"
        self._sent = self._received = 0

    def seal(self, message: Mapping[str, Any]) -> bytes:
        """The line carrying this message (a JSON object with a "type"), sealed."""
        return self.seal_line(json.dumps(message, separators=(",", ":")).encode())

    def seal_line(self, body: bytes) -> bytes:
        """The line carrying these bytes (a JSON object's, as `seal` makes them; a test sealing
        garbage, as a node holding the key could, gives any bytes ending in a brace), sealed."""
        import hmac

        assert body.endswith(b"}") and len(body) > 2, body[:40]
        self._sent += 1
        signed = body[:-1] + b',"seq":%d' % self._sent
        mac = hmac.digest(self._key, self._sending + signed, "sha256").hex().encode()  # one C call
        return signed + b',"mac":"' + mac + b'"}\n'

    def open(self, line: bytes) -> bytes:
        """This received line's JSON, its seq kept and its mac left out, once it proved authentic and
        next in order; Unsealed otherwise."""
        import hmac

        found = _SEALED_END.search(line)
        if found is None:
            raise Unsealed("no valid session MAC")
        signed = line[: found.start() + len(b',"seq":') + len(found[1])]
        expected = hmac.digest(self._key, self._receiving + signed, "sha256").hex().encode()
        if not hmac.compare_digest(expected, found[2]):
            raise Unsealed("no valid session MAC")
        seq = int(found[1])
        if seq != self._received + 1:
            raise Unsealed(f"sequence {seq} where {self._received + 1} was due (a replay or a lost message)")
        self._received = seq
        return signed + b"}"


def same_mac(expected: str, given: object) -> bool:
    """Whether a received MAC is the expected one: any text compares (as its UTF-8 bytes), in
    constant time, and nothing else is one."""
    import hmac

    return isinstance(given, str) and hmac.compare_digest(expected.encode(), given.encode(errors="replace"))


def trimmed_tail(tail: Sequence[str]) -> tuple[str, ...]:
    """A rank's last lines, each cut to TAIL_MAX_CHARS (a report is one line, not a dump)."""
    return tuple(line[:TAIL_MAX_CHARS] for line in tail[-TAIL_MAX_LINES:])

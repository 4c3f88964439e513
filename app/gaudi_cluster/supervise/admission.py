"""Who may take a seat on the control channel: slots before the handshake, the master's side of it.

Before the handshake a connection holds one of a bounded set of slots: each planned node's address
has room for its own ranks (plus spares), strangers share a small pool, so a flood from elsewhere
never shuts the job's agents out. The handshake (`protocol`) admits only the (rank, host, node)
seats this attempt launched, from that node's addresses, with that node's key. Refusals are logged
once per (peer, reason), attacker text quoted and cut, the record bounded.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from gaudi_cluster.wire import messages, protocol
from gaudi_cluster.wire.channel import Channel

log = logging.getLogger("gaudi_cluster.supervise.control")

SPARE_CONNECTIONS = 8  # beyond one per expected rank and address: reconnects, retries
STRANGER_POOL = 16  # unauthenticated connections all addresses outside the plan may hold together
PER_STRANGER = 2  # ... and one such address alone
MAX_LOGGED_REFUSALS = 256  # distinct (peer, reason) pairs logged; the rest are counted


class Refused(Exception):
    """A connection the master turns away (logged once per peer and reason)."""


@dataclass(frozen=True)
class Seat:
    """An admitted agent: who it is, and the session that seals its connection from now on."""

    rank: int  # protocol.NODE_RANK for a node relay's seat
    host: str
    pid: int
    local_rank: int
    session: protocol.Session
    node: str = ""

    @property
    def is_node(self) -> bool:
        return self.rank == protocol.NODE_RANK


class Gate:
    def __init__(
        self,
        job_id: str,
        secret: str,
        expected: Mapping[int, str],
        nodes: Mapping[int, str] | None,
        addresses: Mapping[str, Collection[str]] | None,
    ) -> None:
        """expected: rank -> the host name its node reported; nodes: rank -> its node's name in the
        plan (whose key its agent holds; default the host name); addresses: node -> the addresses its
        connections may come from (None: not checked, every address shares one pool)."""
        self.job_id = job_id
        self._secret = secret
        self._expected = dict(expected)
        self._nodes = dict(nodes) if nodes is not None else dict(expected)
        self._addresses = {node: frozenset(found) for node, found in (addresses or {}).items()}
        self._checks_addresses = addresses is not None
        self._room = _room_per_address(self._nodes, self._addresses)
        self._node_hosts: dict[str, set[str]] = collections.defaultdict(set)
        for rank, node in self._nodes.items():
            self._node_hosts[node].add(self._expected.get(rank, ""))
        self.max_connections = len(self._expected) + SPARE_CONNECTIONS
        self._unauthenticated: collections.Counter[str] = collections.Counter()  # per peer address
        self._logged: set[tuple[str, str]] = set()
        self._unlogged = 0
        self._lock = threading.Lock()

    # --- slots ----------------------------------------------------------------------------------

    def take_slot(self, peer: str, admitted: int) -> bool:
        """Room for one more unauthenticated connection from this address?"""
        with self._lock:
            if not self._checks_addresses:
                allowed = sum(self._unauthenticated.values()) + admitted < self.max_connections
            elif peer in self._room:
                allowed = self._unauthenticated[peer] < self._room[peer]
            else:
                strangers = sum(n for p, n in self._unauthenticated.items() if p not in self._room)
                allowed = strangers < STRANGER_POOL and self._unauthenticated[peer] < PER_STRANGER
            if allowed:
                self._unauthenticated[peer] += 1
            return allowed

    def give_slot(self, peer: str) -> None:
        with self._lock:
            self._unauthenticated[peer] -= 1
            if self._unauthenticated[peer] <= 0:
                del self._unauthenticated[peer]

    # --- refusals -------------------------------------------------------------------------------

    def refuse(self, peer: str, reason: str) -> None:
        """Log once per (peer, reason), at most MAX_LOGGED_REFUSALS of them: a flood of bad hellos
        can neither fill the log nor grow this record without bound."""
        key = (peer[:80], reason[:300])
        with self._lock:
            first = key not in self._logged and len(self._logged) < MAX_LOGGED_REFUSALS
            if first:
                self._logged.add(key)
            else:
                self._unlogged += 1
            capped = not first and self._unlogged == 1 and len(self._logged) >= MAX_LOGGED_REFUSALS
        if first:
            log.warning("control channel: refused %s: %s", *key)
        elif capped:
            log.warning(
                "control channel: %d kinds of refusal logged; further ones are counted only",
                len(self._logged),
            )

    def refusals_not_logged(self) -> int:
        with self._lock:
            return self._unlogged

    def check_join(self, node: str, rank: int, host: str) -> str | None:
        """Why a node relay may not seat this rank (None: it may): only the ranks planned on its node."""
        if self._expected.get(rank) != host or self._nodes.get(rank) != node:
            return f"rank {rank} on host {host[:64]!r} was not launched on node {node[:64]!r} by this job"
        return None

    # --- the handshake --------------------------------------------------------------------------

    def handshake(self, peer: str, seated: Callable[[int | str], bool]) -> Handshake:
        """The master's side of one connection's handshake, to be driven by the lines it receives."""
        return Handshake(self, peer, seated)

    def admit(self, channel: Channel, peer: str, seated: Callable[[int | str], bool]) -> Seat:
        """The same handshake on a blocking channel (a master of one agent, as in tests)."""
        handshake = self.handshake(peer, seated)
        channel.settimeout(protocol.HANDSHAKE_TIMEOUT_S)
        channel.send(handshake.challenge)
        while True:
            message = channel.receive(messages.TO_MASTER_HANDSHAKE)
            if message is None:
                raise handshake.ended(channel.close_reason)
            answer = handshake.receive(message)
            if isinstance(answer, Seat):
                return answer
            channel.send(answer)


class Handshake:
    """One connection's way in, step by step: the challenge is sent at once; then each line the peer
    sends is answered (its hello with the welcome) until its proof makes it a Seat. Every misstep
    raises Refused: the caller answers it with a refusal and closes the connection."""

    def __init__(self, gate: Gate, peer: str, seated: Callable[[int | str], bool]) -> None:
        """seated: whether a rank (int) or a node's relay (its name) holds a seat already."""
        self._gate, self._peer, self._seated = gate, peer, seated
        self._nonce = protocol.new_nonce()
        self.challenge = messages.Challenge(self._nonce, gate.job_id)
        self.due = messages.MessageType.HELLO
        self._hello: messages.Hello | None = None
        self._key = ""

    def ended(self, why: str) -> Refused:
        """What to log of a connection that ended (or ran out of time) before its handshake did."""
        return Refused(f"no {self.due.value} within {protocol.HANDSHAKE_TIMEOUT_S:.0f}s ({why})")

    def receive_line(self, line: bytes) -> messages.Welcome | Seat:
        """The next line of the peer, as the master's loop reads it."""
        try:
            message: messages.Message | messages.Dropped = messages.parse_line(
                line, messages.TO_MASTER_HANDSHAKE
            )
        except messages.BadMessage as error:
            message = messages.Dropped(str(error))
        return self.receive(message)

    def receive(self, message: messages.Message | messages.Dropped) -> messages.Welcome | Seat:
        if isinstance(message, messages.Dropped):
            raise Refused(message.reason)
        if message.TYPE is not self.due:
            raise Refused(f"{message.TYPE.value} where a {self.due.value} was due")
        if isinstance(message, messages.Hello):
            welcome = self._welcome(message)
            self._hello, self.due = message, messages.MessageType.PROOF
            return welcome
        assert isinstance(message, messages.Proof)
        return self._seat(message)

    def _transcript(self, hello: messages.Hello) -> protocol.Transcript:
        return protocol.Transcript(
            self._nonce, hello.nonce, self._gate.job_id, hello.node, hello.host, hello.rank
        )

    def _welcome(self, hello: messages.Hello) -> messages.Welcome:
        gate = self._gate
        if hello.job != gate.job_id:
            raise Refused(f"hello for another job ({messages.shown(hello.job, 40)})")
        host, node = hello.host, hello.node
        if hello.is_node:
            who = f"the relay of node {node[:64]!r}"
            if host not in gate._node_hosts.get(node, ()):
                raise Refused(f"{who} on host {host[:64]!r}: no rank of this job was launched there")
        else:
            who = f"rank {hello.rank}"
            if gate._expected.get(hello.rank) != host or gate._nodes.get(hello.rank) != node:
                raise Refused(
                    f"{who} on host {host[:64]!r} (node {node[:64]!r}) was not launched by this job"
                )
        if gate._checks_addresses and self._peer not in gate._addresses.get(node, ()):
            raise Refused(f"{who} claims node {node[:64]!r} but connects from {self._peer}, not its address")
        # Said before the welcome: the agent learns it while it still listens.
        if self._seated(node if hello.is_node else hello.rank):
            raise Refused(f"{who} is already connected")
        self._key = protocol.node_key(gate._secret, node)
        return messages.Welcome(protocol.welcome_mac(self._key, self._transcript(hello)))

    def _seat(self, proof: messages.Proof) -> Seat:
        hello = self._hello
        assert hello is not None
        if not protocol.same_mac(protocol.proof_mac(self._key, self._transcript(hello)), proof.mac):
            raise Refused(f"wrong key for node {hello.node[:64]!r} (rank {hello.rank})")
        session = protocol.Session(
            protocol.session_key(self._key, self._nonce, hello.nonce, self._gate.job_id, hello.rank),
            "master",
        )
        return Seat(hello.rank, hello.host, hello.pid, hello.local_rank, session, hello.node)


def _room_per_address(nodes: Mapping[int, str], addresses: Mapping[str, frozenset[str]]) -> dict[str, int]:
    """Unauthenticated connections each planned address may hold: its nodes' ranks, plus spares."""
    ranks_per_node = collections.Counter(nodes.values())
    room: dict[str, int] = {}
    for node, found in addresses.items():
        for address in found:
            room[address] = room.get(address, SPARE_CONNECTIONS) + ranks_per_node.get(node, 0)
    return room

"""Runs in every control-plane process (master, node relay, rank agent): the handshake's messages.

A connection proves it holds its node's key before it is seated: the master's `challenge`, the
peer's `hello` (who it is: a rank's agent or a node's relay), the master's `welcome` (the master
proves the key first), the peer's `proof`; or `refused`, with why (also a relay's answer to one
rank's join). wire/messages parses and renders them with every other kind; protocol and channel do
the sealing and the MACs. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from gaudi_cluster.wire import protocol
from gaudi_cluster.wire.fields import BadMessage, count, hex64, rank_of, text
from gaudi_cluster.wire.kinds import MessageType


@dataclass(frozen=True, slots=True)
class Challenge:
    nonce: str
    job: str
    TYPE: ClassVar[MessageType] = MessageType.CHALLENGE

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> Challenge:
        return cls(hex64(message, "nonce"), text(message, "job", 128))


@dataclass(frozen=True, slots=True)
class Hello:
    """A rank's agent (role "rank") or a node's relay (role "node": its rank is protocol.NODE_RANK)."""

    job: str
    node: str
    host: str
    rank: int
    pid: int
    nonce: str
    local_rank: int = 0
    role: str = "rank"
    TYPE: ClassVar[MessageType] = MessageType.HELLO

    @property
    def is_node(self) -> bool:
        return self.role == "node"

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> Hello:
        role = message.get("role", "rank")
        if role not in ("rank", "node"):
            raise BadMessage("role is neither rank nor node")
        if role == "node":
            if message.get("rank", protocol.NODE_RANK) != protocol.NODE_RANK:
                raise BadMessage(f"a node's hello names rank {protocol.NODE_RANK} or none")
            rank = protocol.NODE_RANK
        else:
            rank = count(message, "rank")
        return cls(
            job=text(message, "job", 128),
            node=text(message, "node", 255),
            host=text(message, "host", 255),
            rank=rank,
            pid=count(message, "pid"),
            nonce=hex64(message, "nonce"),
            local_rank=count(message, "local_rank", 0),
            role=role,
        )


@dataclass(frozen=True, slots=True)
class Welcome:
    mac: str
    TYPE: ClassVar[MessageType] = MessageType.WELCOME

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> Welcome:
        return cls(hex64(message, "mac"))


@dataclass(frozen=True, slots=True)
class Proof:
    mac: str
    TYPE: ClassVar[MessageType] = MessageType.PROOF

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> Proof:
        return cls(hex64(message, "mac"))


@dataclass(frozen=True, slots=True)
class Refused:
    """Turned away: a connection in its handshake (no rank), or one rank a relay asked to seat."""

    reason: str
    rank: int | None = None
    TYPE: ClassVar[MessageType] = MessageType.REFUSED

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> Refused:
        reason = message.get("reason")
        if type(reason) is not str:
            raise BadMessage("reason is not text")
        return cls(reason[:1024], rank_of(message, required=False))

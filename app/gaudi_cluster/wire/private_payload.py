"""What the master stages in a node's 0600 private file, typed: the one hand-off that carries secrets.

The master writes it to the stdin of `gaudi-cluster probe --stage` on every node (or to the file
itself on a single node); each rank agent there reads it before it starts its rank. It carries this
node's key of the attempt (never the attempt's secret), the node's name in the master's plan and the
variables delivered privately (--env-pass, secrets of the user's .deepspeed_env). `repr` shows none
of the values, so a traceback or a debug line cannot print them. Pure: imports nothing of ours.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

SCHEMA_VERSION = 1


class PrivatePayloadError(ValueError):
    """A private file or stdin that is not one this version of gaudi-cluster writes."""


@dataclass(frozen=True)
class PrivatePayload:
    node: str  # the node's name in the master's plan (what its agents claim in their hello)
    token: str = field(repr=False)  # this node's key: protocol.node_key(attempt secret, node)
    env: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", MappingProxyType({str(k): str(v) for k, v in self.env.items()}))

    def to_json(self) -> str:
        return json.dumps(
            {"schema": SCHEMA_VERSION, "node": self.node, "token": self.token, "env": dict(self.env)}
        )

    @classmethod
    def from_json(cls, text: str) -> PrivatePayload:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            raise PrivatePayloadError("private payload: not JSON") from None  # never echo the text: secrets
        if not isinstance(data, dict) or data.get("schema") != SCHEMA_VERSION:
            raise PrivatePayloadError(
                f"private payload: not schema {SCHEMA_VERSION} (the master and this node run different "
                "gaudi-cluster images: run the same image on every node)"
            )
        node, token, env = data.get("node"), data.get("token"), data.get("env")
        if not isinstance(node, str) or not node or not isinstance(token, str) or not token:
            raise PrivatePayloadError("private payload: fields 'node' and 'token' must be non-empty strings")
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise PrivatePayloadError("private payload: field 'env' must map names to strings")
        return cls(node=node, token=token, env=env)


@dataclass(frozen=True)
class PayloadBundle:
    """Every node's payload, by host, for the one srun step that stages them all (nodes/srun: each
    task keeps its own entry and writes nothing of the others). `repr` shows the hosts only."""

    payloads: Mapping[str, PrivatePayload] = field(repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "payloads", MappingProxyType(dict(self.payloads)))

    def to_json(self) -> str:
        return json.dumps(
            {
                "schema": SCHEMA_VERSION,
                "nodes": {host: json.loads(payload.to_json()) for host, payload in self.payloads.items()},
            }
        )

    @classmethod
    def from_json(cls, text: str) -> PayloadBundle:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            raise PrivatePayloadError("payload bundle: not JSON") from None  # never echo the text: secrets
        if not isinstance(data, dict) or data.get("schema") != SCHEMA_VERSION:
            raise PrivatePayloadError(
                f"payload bundle: not schema {SCHEMA_VERSION} (run one gaudi-cluster image on every node)"
            )
        nodes = data.get("nodes")
        if not isinstance(nodes, dict) or not nodes:
            raise PrivatePayloadError("payload bundle: field 'nodes' must map hosts to payloads")
        return cls({str(host): PrivatePayload.from_json(json.dumps(one)) for host, one in nodes.items()})

"""What the direct launcher hands its processes: the fanout's launch and each node's spec, typed.

The master writes a `FanoutSpec` to the stdin of `python -m gaudi_cluster.launch.fanout`, which
writes each node's `NodeSpec` to the stdin of `python -m gaudi_cluster.launch.node` there; inside
Slurm the master writes the `FanoutSpec` to its srun launch step instead, whose task on each node
takes its own entry. Both ends
parse with `from_json`, which checks every field, so a bad spec fails in one line naming the field
rather than as a KeyError deep in the node process. Also the entry modules' names, written once:
the launchers start them, and a worker scans /proc for the agent's. Pure: imports nothing of ours.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any

AGENT_MODULE = "gaudi_cluster.rank.agent"
FANOUT_MODULE = "gaudi_cluster.launch.fanout"
NODE_MODULE = "gaudi_cluster.launch.node"
ZYGOTE_MODULE = "gaudi_cluster.rank.zygote"

# Changes whenever a field changes meaning, so that a node running another image says so at once.
SCHEMA_VERSION = 6


class NodeSpecError(ValueError):
    """A launch or node spec that is not one gaudi-cluster of this version writes."""


@dataclass(frozen=True)
class NodeRelaySpec:
    """What a node process needs to run its node's relay itself (rank/relay, in-process): set where the
    node process lives as long as its ranks (an srun task, the master's own node), so that the node
    starts one interpreter fewer than when its first agent starts the relay."""

    job_id: str
    job_root: str
    control: str  # HOST:PORT of the master's control channel
    heartbeat_timeout_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> NodeRelaySpec:
        fields = _fields(data, "node relay", set(cls.__dataclass_fields__), versioned=False)
        return cls(
            job_id=_text(fields, "job_id"),
            job_root=_text(fields, "job_root"),
            control=_text(fields, "control"),
            heartbeat_timeout_s=_seconds(fields, "heartbeat_timeout_s"),
        )


@dataclass(frozen=True)
class NodeSpec:
    """One node's share of the job: which global ranks it runs, and what every one of them gets."""

    node_rank: int
    nnodes: int
    first_rank: int  # the global rank of this node's first local rank
    slots: tuple[int, ...]  # device ids, one per local rank
    world_size: int
    master_addr: str
    master_port: int
    cwd: str
    env: Mapping[str, str]
    python: str
    agent_args: tuple[str, ...]  # everything after `-m gaudi_cluster.rank.agent`
    preimport: bool = True  # start the ranks from a pre-imported zygote where safe (rank/zygote)
    # How long the node's zygote stays warm once idle, for the next attempt or job (0: it leaves with them).
    preimport_keep_s: float = 0.0
    # Once every rank is seated the node process exits and the ranks live on under the node relay
    # (their output goes there too): set for a node reached over ssh, so its session ends.
    hand_over: bool = False
    # The node process runs the node's relay itself (never with hand_over: it ends before its ranks).
    relay: NodeRelaySpec | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "slots", tuple(self.slots))
        object.__setattr__(self, "agent_args", tuple(self.agent_args))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "node_rank": self.node_rank,
            "nnodes": self.nnodes,
            "first_rank": self.first_rank,
            "slots": list(self.slots),
            "world_size": self.world_size,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "cwd": self.cwd,
            "env": dict(self.env),
            "python": self.python,
            "agent_args": list(self.agent_args),
            "preimport": self.preimport,
            "preimport_keep_s": self.preimport_keep_s,
            "hand_over": self.hand_over,
            "relay": None if self.relay is None else self.relay.to_dict(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: object) -> NodeSpec:
        fields = _fields(data, "node spec", set(cls.__dataclass_fields__))
        spec = cls(
            node_rank=_count(fields, "node_rank"),
            nnodes=_count(fields, "nnodes", minimum=1),
            first_rank=_count(fields, "first_rank"),
            slots=_counts(fields, "slots"),
            world_size=_count(fields, "world_size", minimum=1),
            master_addr=_text(fields, "master_addr"),
            master_port=_count(fields, "master_port", minimum=1, maximum=65535),
            cwd=_text(fields, "cwd"),
            env=_text_map(fields, "env"),
            python=_text(fields, "python"),
            agent_args=_texts(fields, "agent_args"),
            preimport=_flag(fields, "preimport"),
            preimport_keep_s=_seconds(fields, "preimport_keep_s"),
            hand_over=_flag(fields, "hand_over"),
            relay=None if fields["relay"] is None else NodeRelaySpec.from_dict(fields["relay"]),
        )
        if spec.hand_over and spec.relay is not None:
            raise NodeSpecError("node spec: a node process that hands its ranks over cannot run their relay")
        if spec.node_rank >= spec.nnodes:
            raise NodeSpecError(f"node spec: node_rank {spec.node_rank} is not below nnodes {spec.nnodes}")
        if spec.first_rank + len(spec.slots) > spec.world_size:
            raise NodeSpecError(
                f"node spec: ranks {spec.first_rank}..{spec.first_rank + len(spec.slots) - 1} "
                f"exceed world_size {spec.world_size}"
            )
        return spec

    @classmethod
    def from_json(cls, text: str) -> NodeSpec:
        return cls.from_dict(_parse(text, "node spec"))


@dataclass(frozen=True)
class NodeEntry:
    """Where one node's spec goes: this machine (no ssh at all) or a host reached over ssh."""

    host: str
    here: bool
    spec: NodeSpec

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "here": self.here, "spec": self.spec.to_dict()}

    @classmethod
    def from_dict(cls, data: object) -> NodeEntry:
        fields = _fields(data, "node entry", set(cls.__dataclass_fields__), versioned=False)
        here = fields["here"]
        if not isinstance(here, bool):
            raise NodeSpecError(f"node entry: field 'here' must be true or false, got {here!r:.80}")
        return cls(host=_text(fields, "host"), here=here, spec=NodeSpec.from_dict(fields["spec"]))


@dataclass(frozen=True)
class FanoutSpec:
    """The whole direct launch: the Python the node processes run under, the ssh config, the nodes."""

    python: str
    ssh_config: str  # a dry run's spec names a placeholder: no ssh config is written then
    nodes: tuple[NodeEntry, ...]
    # Inside a Slurm allocation: the srun step (argv up to the command) that starts every node's
    # process at once, each task taking its own entry of this spec from stdin. Empty: ssh.
    srun: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "srun", tuple(self.srun))

    def entry(self, host: str) -> NodeEntry:
        """The node entry of `host`; NodeSpecError when the launch has none."""
        for node in self.nodes:
            if node.host == host:
                return node
        raise NodeSpecError(f"launch: no node entry for {host!r:.80}")

    def hosts(self) -> tuple[str, ...]:
        return tuple(node.host for node in self.nodes)

    def to_dict(self) -> dict[str, Any]:
        nodes = [node.to_dict() for node in self.nodes]
        return {
            "schema": SCHEMA_VERSION,
            "python": self.python,
            "ssh_config": self.ssh_config,
            "nodes": nodes,
            "srun": list(self.srun),
        }

    def to_json(self) -> str:
        # Indented: a dry run prints it as the launcher's here-document.
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data: object) -> FanoutSpec:
        fields = _fields(data, "launch", set(cls.__dataclass_fields__))
        nodes = fields["nodes"]
        if not isinstance(nodes, list) or not nodes:
            raise NodeSpecError(f"launch: field 'nodes' must be a non-empty list, got {nodes!r:.80}")
        entries = tuple(NodeEntry.from_dict(node) for node in nodes)
        return cls(
            python=_text(fields, "python"),
            ssh_config=_text(fields, "ssh_config"),
            nodes=entries,
            srun=_texts(fields, "srun"),
        )

    @classmethod
    def from_json(cls, text: str) -> FanoutSpec:
        return cls.from_dict(_parse(text, "launch"))


def _parse(text: str, what: str) -> object:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise NodeSpecError(f"{what}: not JSON: {text[:200]!r}") from None


def _fields(data: object, what: str, names: set[str], versioned: bool = True) -> Mapping[str, object]:
    """The object's fields, once it has every one of `names`, no other, and (if versioned) our schema."""
    if not isinstance(data, dict):
        raise NodeSpecError(f"{what}: expected a JSON object, got {type(data).__name__}")
    schema = data.get("schema")
    if versioned and schema != SCHEMA_VERSION:
        raise NodeSpecError(
            f"{what}: schema {schema!r:.20}, this end reads {SCHEMA_VERSION}: the two ends run different "
            "gaudi-cluster images (run the same image on every node)"
        )
    known = names | {"schema"} if versioned else names
    missing = sorted(names - set(data))
    if missing:
        raise NodeSpecError(f"{what}: missing field(s) {', '.join(missing)}")
    unknown = sorted(set(data) - known)
    if unknown:
        raise NodeSpecError(f"{what}: unknown field(s) {', '.join(unknown)}")
    return data


def _flag(fields: Mapping[str, object], name: str) -> bool:
    value = fields[name]
    if not isinstance(value, bool):
        raise NodeSpecError(f"field '{name}' must be true or false, got {value!r:.80}")
    return value


def _seconds(fields: Mapping[str, object], name: str) -> float:
    value = fields[name]
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value < float("inf"):
        raise NodeSpecError(f"field '{name}' must be a number of seconds of at least 0, got {value!r:.80}")
    return float(value)


def _count(fields: Mapping[str, object], name: str, minimum: int = 0, maximum: int | None = None) -> int:
    value = fields[name]
    # bool is an int to Python, never to the spec's writer.
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise NodeSpecError(f"field '{name}' must be an integer of at least {minimum}, got {value!r:.80}")
    if maximum is not None and value > maximum:
        raise NodeSpecError(f"field '{name}' must be at most {maximum}, got {value}")
    return value


def _counts(fields: Mapping[str, object], name: str) -> tuple[int, ...]:
    values = fields[name]
    if not isinstance(values, list) or not values:
        raise NodeSpecError(f"field '{name}' must be a non-empty list of integers, got {values!r:.80}")
    return tuple(_count({name: value}, name) for value in values)


def _text(fields: Mapping[str, object], name: str) -> str:
    value = fields[name]
    if not isinstance(value, str) or not value:
        raise NodeSpecError(f"field '{name}' must be a non-empty string, got {value!r:.80}")
    return value


def _texts(fields: Mapping[str, object], name: str) -> tuple[str, ...]:
    values = fields[name]
    if not isinstance(values, list) or not all(isinstance(value, str) for value in values):
        raise NodeSpecError(f"field '{name}' must be a list of strings, got {values!r:.80}")
    return tuple(values)


def _text_map(fields: Mapping[str, object], name: str) -> dict[str, str]:
    values = fields[name]
    if not isinstance(values, dict) or not all(isinstance(value, str) for value in values.values()):
        raise NodeSpecError(f"field '{name}' must map names to strings, got {values!r:.80}")
    return dict(values)

"""The difference between the cluster a spec describes and what carries its tag. Pure: `up` creates
exactly what the Diff lists, so a second `up` finds nothing to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from gaudi_cluster.aws.spec import (
    ALL_TO_INTERNET,
    ClusterSpec,
    NodeSpec,
    Rule,
    wanted_egress,
    wanted_ingress,
)
from gaudi_cluster.errors import ConfigError


@dataclass(frozen=True)
class ExistingNode:
    index: int
    role: str
    instance_id: str
    state: str
    instance_type: str = ""
    private_ip: str | None = None
    public_ip: str | None = None
    launch_time: datetime | None = None
    primary_interface: str | None = None
    subnet_id: str | None = None


@dataclass(frozen=True)
class Existing:
    """The cluster's resources as found by its tag (a fresh cluster: all empty)."""

    security_group_id: str | None = None
    ingress: frozenset[Rule] = frozenset()
    egress: frozenset[Rule] = frozenset()
    placement_group: str | None = None
    nodes: Mapping[int, ExistingNode] = field(default_factory=dict)
    address_allocation: str | None = None
    address_public_ip: str | None = None
    address_interface: str | None = None
    parameters: tuple[str, ...] = ()


@dataclass(frozen=True)
class Diff:
    """What `up` must do to make the cluster match the spec (empty when it already does)."""

    create_parameters: bool
    create_security_group: bool
    authorize_ingress: tuple[Rule, ...]
    revoke_ingress: tuple[Rule, ...]
    authorize_egress: tuple[Rule, ...]
    revoke_egress: tuple[Rule, ...]
    create_placement_group: bool
    launch: tuple[NodeSpec, ...]
    start: tuple[ExistingNode, ...]
    allocate_address: bool
    associate_address: bool

    @property
    def empty(self) -> bool:
        return not (
            self.create_parameters
            or self.create_security_group
            or self.authorize_ingress
            or self.revoke_ingress
            or self.authorize_egress
            or self.revoke_egress
            or self.create_placement_group
            or self.launch
            or self.start
            or self.allocate_address
            or self.associate_address
        )


def diff(spec: ClusterSpec, existing: Existing) -> Diff:
    surplus = sorted(i for i in existing.nodes if i >= spec.request.nodes)
    if surplus:
        raise ConfigError(
            f"cluster {spec.cluster_id} already has {len(existing.nodes)} nodes and --nodes "
            f"{spec.request.nodes} would leave node {surplus[0]} behind; fix: --nodes {len(existing.nodes)}, "
            f"or gaudi-cluster aws down {spec.cluster_id} and up again"
        )
    wrong_type = [
        n for n in existing.nodes.values() if n.instance_type and n.instance_type != spec.facts.name
    ]
    if wrong_type:
        raise ConfigError(
            f"cluster {spec.cluster_id} runs {wrong_type[0].instance_type}, not {spec.facts.name}; "
            f"fix: --instance-type {wrong_type[0].instance_type}"
        )
    elsewhere = [n for n in existing.nodes.values() if n.subnet_id and n.subnet_id != spec.subnet_id]
    if elsewhere:
        raise ConfigError(
            f"cluster {spec.cluster_id} runs in subnet {elsewhere[0].subnet_id}, not {spec.subnet_id}; "
            f"fix: --subnet-id {elsewhere[0].subnet_id} (or the --az it is in)"
        )
    has_group = existing.security_group_id is not None
    ingress, egress = wanted_ingress(spec.request.ssh_cidr), wanted_egress()
    # A new group comes with AWS's default egress rule (all traffic to anywhere) already in it.
    present_egress = existing.egress if has_group else frozenset({ALL_TO_INTERNET})
    master = existing.nodes.get(0)
    launch = tuple(n for n in spec.nodes if n.index not in existing.nodes)
    # The association follows the master's primary interface (a replaced master gets the address back).
    associated = (
        existing.address_allocation is not None
        and master is not None
        and existing.address_interface is not None
        and existing.address_interface == master.primary_interface
    )
    return Diff(
        # Only new nodes fetch keys at boot, and `up` deletes the parameters once they have: stored again
        # when nodes are launched, unless an unfinished delivery left them.
        create_parameters=bool(launch) and not set(spec.parameter_names.values()) <= set(existing.parameters),
        create_security_group=not has_group,
        authorize_ingress=tuple(sorted(ingress - existing.ingress)),
        revoke_ingress=tuple(sorted(existing.ingress - ingress)) if has_group else (),
        authorize_egress=tuple(sorted(egress - present_egress)),
        revoke_egress=tuple(sorted(present_egress - egress)) if has_group else (),
        create_placement_group=spec.placement_group_name is not None and existing.placement_group is None,
        launch=launch,
        start=tuple(n for _, n in sorted(existing.nodes.items()) if n.state == "stopped"),
        allocate_address=existing.address_allocation is None,
        associate_address=not associated,
    )

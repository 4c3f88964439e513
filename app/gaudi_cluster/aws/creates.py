"""Creating a cluster in dependency order; every id goes to the run's journal the moment it exists,
and every resource is tagged in the call that creates it (TagSpecifications), so an interrupted
`up` never leaves anything `down` cannot find.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gaudi_cluster.aws import calls
from gaudi_cluster.aws.calls import (
    AwsCallFailed,
    CloudBase,
    Resources,
    calling,
    node_from,
)
from gaudi_cluster.aws.diff import Diff, Existing, ExistingNode
from gaudi_cluster.aws.spec import (
    ClusterSpec,
    NodeSpec,
    launch_parameters,
    permission,
    tag_specifications,
)
from gaudi_cluster.aws.userdata import worker_peers
from gaudi_cluster.errors import ClusterNotReady

log = logging.getLogger("gaudi_cluster.aws")


@dataclass(frozen=True)
class Converged:
    nodes: tuple[ExistingNode, ...]
    public_ip: str | None


class Creates(CloudBase):
    """create_* / launch / converge: what `up` does once every check has passed."""

    def create_security_group(self, spec: ClusterSpec, journal: Resources) -> str:
        with calling("CreateSecurityGroup"):
            answer = self.ec2.create_security_group(
                GroupName=spec.security_group_name,
                Description=f"gaudi-cluster {spec.cluster_id}: all traffic within the group (EFA), ssh in",
                VpcId=spec.vpc_id,
                TagSpecifications=tag_specifications(
                    ("security-group",), spec.cluster_id, Name=spec.security_group_name
                ),
            )
        group_id = str(answer["GroupId"])
        journal.security_groups.append(group_id)
        log.info("created security group %s (%s)", spec.security_group_name, group_id)
        return group_id

    def apply_rules(self, group_id: str, changes: Diff) -> None:
        for rule in changes.revoke_ingress:
            with calling("RevokeSecurityGroupIngress"):
                self.ec2.revoke_security_group_ingress(
                    GroupId=group_id, IpPermissions=[permission(rule, group_id)]
                )
        for rule in changes.revoke_egress:
            with calling("RevokeSecurityGroupEgress"):
                self.ec2.revoke_security_group_egress(
                    GroupId=group_id, IpPermissions=[permission(rule, group_id)]
                )
        if changes.authorize_ingress:
            with calling("AuthorizeSecurityGroupIngress"):
                self.ec2.authorize_security_group_ingress(
                    GroupId=group_id,
                    IpPermissions=[permission(r, group_id) for r in changes.authorize_ingress],
                )
        if changes.authorize_egress:
            with calling("AuthorizeSecurityGroupEgress"):
                self.ec2.authorize_security_group_egress(
                    GroupId=group_id,
                    IpPermissions=[permission(r, group_id) for r in changes.authorize_egress],
                )

    def create_placement_group(self, spec: ClusterSpec, journal: Resources) -> str:
        name = spec.placement_group_name
        assert name is not None
        with calling("CreatePlacementGroup"):
            self.ec2.create_placement_group(
                GroupName=name,
                Strategy="cluster",
                TagSpecifications=tag_specifications(("placement-group",), spec.cluster_id, Name=name),
            )
        journal.placement_groups.append(name)
        log.info("created placement group %s (strategy cluster)", name)
        return name

    def launch(
        self, spec: ClusterSpec, node: NodeSpec, group_id: str, user_data: str, journal: Resources
    ) -> ExistingNode:
        with calling(
            f"RunInstances for {node.name}",
            fix="retry later, try another --az, or --placement-group none (cluster placement needs "
            "capacity in one spot)",
        ):
            answer = self.ec2.run_instances(**launch_parameters(spec, node, group_id, user_data))
        launched = node_from(answer["Instances"][0])
        journal.instances.append(launched.instance_id)
        log.info("launched %s (%s) as %s", node.name, node.role, launched.instance_id)
        return launched

    def start(self, nodes: Sequence[ExistingNode]) -> None:
        with calling("StartInstances"):
            self.ec2.start_instances(InstanceIds=[n.instance_id for n in nodes])

    def wait_running(self, instance_ids: Sequence[str], deadline: float) -> dict[str, ExistingNode]:
        """Poll until every instance runs; an instance that dies on the way fails the wait at once."""
        while True:
            try:
                reservations = self._pages(
                    self.ec2, "describe_instances", "Reservations", InstanceIds=list(instance_ids)
                )
            except AwsCallFailed as error:
                # Fresh instances can be invisible to Describe for a moment (eventual consistency).
                if error.code != "InvalidInstanceID.NotFound":
                    raise
                reservations = []
            found = {n.instance_id: n for r in reservations for n in map(node_from, r.get("Instances", []))}
            dead = [n for n in found.values() if n.state in ("shutting-down", "terminated")]
            if dead:
                raise ClusterNotReady(
                    f"{dead[0].instance_id} went {dead[0].state} while starting; fix: see aws ec2 "
                    f"describe-instances --instance-ids {dead[0].instance_id} (StateReason), "
                    "then run up again"
                )
            waiting = [i for i in instance_ids if i not in found or found[i].state != "running"]
            if not waiting:
                return found
            if time.monotonic() >= deadline:
                raise ClusterNotReady(
                    f"{len(waiting)} instance(s) not running at the deadline ({', '.join(waiting)}); "
                    "fix: --wait-timeout longer, or run up again (it converges)"
                )
            time.sleep(calls.POLL_INTERVAL_S)

    def ensure_address(
        self, spec: ClusterSpec, existing: Existing, master: ExistingNode, journal: Resources
    ) -> str | None:
        allocation, public_ip = existing.address_allocation, existing.address_public_ip
        if allocation is None:
            with calling("AllocateAddress", fix="release an unused Elastic IP or ask for a higher limit"):
                answer = self.ec2.allocate_address(
                    Domain="vpc",
                    TagSpecifications=tag_specifications(
                        ("elastic-ip",), spec.cluster_id, Name=f"{spec.cluster_id}-master"
                    ),
                )
            allocation, public_ip = str(answer["AllocationId"]), answer.get("PublicIp")
            journal.addresses.append(allocation)
            log.info("allocated Elastic IP %s", public_ip)
        if existing.address_interface is None or existing.address_interface != master.primary_interface:
            if master.primary_interface is None:
                raise ClusterNotReady(
                    f"{master.instance_id} has no primary network interface yet; fix: run up again"
                )
            # More than one interface: the address goes to the primary interface, not "the instance".
            with calling("AssociateAddress"):
                self.ec2.associate_address(
                    AllocationId=allocation,
                    NetworkInterfaceId=master.primary_interface,
                    AllowReassociation=True,
                )
            log.info("Elastic IP %s -> %s (%s)", public_ip, master.instance_id, master.primary_interface)
        return public_ip

    def converge(
        self,
        spec: ClusterSpec,
        existing: Existing,
        changes: Diff,
        user_data_for: Callable[[NodeSpec, tuple[str, ...]], str],
        put_parameters: Callable[[Resources], None],
        journal: Resources,
        deadline: float,
    ) -> Converged:
        """Create what `changes` lists, in dependency order; every id goes to `journal` as it is made."""
        if changes.create_parameters:
            put_parameters(journal)
        group_id = existing.security_group_id or self.create_security_group(spec, journal)
        self.apply_rules(group_id, changes)
        if changes.create_placement_group:
            self.create_placement_group(spec, journal)
        if changes.start:
            self.start(changes.start)
        nodes = dict(existing.nodes)
        # Workers first: the master boots with their private IPs as its peers.
        for node in sorted(changes.launch, key=lambda n: (n.index == 0, n.index)):
            peers: tuple[str, ...] = ()
            if node.index == 0:
                peers = worker_peers([nodes[i].private_ip for i in sorted(nodes) if i != 0])
            nodes[node.index] = self.launch(spec, node, group_id, user_data_for(node, peers), journal)
        running = self.wait_running([n.instance_id for n in nodes.values()], deadline)
        final = tuple(running[nodes[i].instance_id] for i in sorted(nodes))
        public_ip = self.ensure_address(spec, existing, final[0], journal)
        return Converged(final, public_ip)

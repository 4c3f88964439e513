"""Deleting in dependency order (instances, Elastic IPs, interfaces, placement group, security group,
key parameter) and checking what is left. Repeating any of it is harmless.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from gaudi_cluster.aws import calls
from gaudi_cluster.aws.calls import (
    AwsCallFailed,
    Resources,
    calling,
    node_from,
    tag_filter,
    tolerating_gone,
)
from gaudi_cluster.aws.facts import (
    LIVE_STATES,
)
from gaudi_cluster.aws.reads import Reads
from gaudi_cluster.errors import ClusterNotReady

log = logging.getLogger("gaudi_cluster.aws")


class Deletes(Reads):
    """find_tagged / teardown / remaining: what `down` and a rollback do."""

    def find_tagged(self, cluster_id: str) -> Resources:
        found = Resources()
        found.instances = [
            n.instance_id for n in self._instances(cluster_id, (*LIVE_STATES, "shutting-down"))
        ]
        found.addresses = [str(a["AllocationId"]) for a in self._addresses(cluster_id)]
        groups = self._pages(
            self.ec2, "describe_security_groups", "SecurityGroups", Filters=[tag_filter(cluster_id)]
        )
        found.security_groups = [str(g["GroupId"]) for g in groups]
        found.interfaces = self._interfaces(cluster_id, found.security_groups)
        found.placement_groups = self._placement_groups(cluster_id)
        found.parameters = self._parameters(cluster_id)
        return found

    def _interfaces(self, cluster_id: str | None, group_ids: Sequence[str]) -> list[str]:
        ids: set[str] = set()
        if cluster_id is not None:
            tagged = self._pages(
                self.ec2, "describe_network_interfaces", "NetworkInterfaces", Filters=[tag_filter(cluster_id)]
            )
            ids.update(str(i["NetworkInterfaceId"]) for i in tagged)
        if group_ids:
            # Interfaces in the cluster's security group block its deletion, tagged or not.
            grouped = self._pages(
                self.ec2,
                "describe_network_interfaces",
                "NetworkInterfaces",
                Filters=[{"Name": "group-id", "Values": list(group_ids)}],
            )
            ids.update(str(i["NetworkInterfaceId"]) for i in grouped)
        return sorted(ids)

    def remaining(self, resources: Resources) -> Resources:
        """Which of these ids still exist (terminated instances count as gone)."""
        left = Resources()
        if resources.instances:
            left.instances = [
                n.instance_id
                for r in self._pages(
                    self.ec2,
                    "describe_instances",
                    "Reservations",
                    Filters=[{"Name": "instance-id", "Values": resources.instances}],
                )
                for n in map(node_from, r.get("Instances", []))
                if n.state != "terminated"
            ]
        if resources.addresses:
            left.addresses = [
                str(a["AllocationId"])
                for a in self._pages(
                    self.ec2,
                    "describe_addresses",
                    "Addresses",
                    Filters=[{"Name": "allocation-id", "Values": resources.addresses}],
                )
            ]
        if resources.interfaces:
            left.interfaces = [
                str(i["NetworkInterfaceId"])
                for i in self._pages(
                    self.ec2,
                    "describe_network_interfaces",
                    "NetworkInterfaces",
                    Filters=[{"Name": "network-interface-id", "Values": resources.interfaces}],
                )
            ]
        if resources.placement_groups:
            groups = self._pages(
                self.ec2,
                "describe_placement_groups",
                "PlacementGroups",
                Filters=[{"Name": "group-name", "Values": resources.placement_groups}],
            )
            left.placement_groups = [
                str(g["GroupName"]) for g in groups if g.get("State") not in ("deleting", "deleted")
            ]
        if resources.security_groups:
            left.security_groups = [
                str(g["GroupId"])
                for g in self._pages(
                    self.ec2,
                    "describe_security_groups",
                    "SecurityGroups",
                    Filters=[{"Name": "group-id", "Values": resources.security_groups}],
                )
            ]
        if resources.parameters:
            left.parameters = [
                str(p["Name"])
                for p in self._pages(
                    self.ssm,
                    "describe_parameters",
                    "Parameters",
                    ParameterFilters=[{"Key": "Name", "Option": "Equals", "Values": resources.parameters}],
                )
            ]
        return left

    def teardown(self, resources: Resources, deadline: float, cluster_id: str | None = None) -> None:
        """Delete in dependency order: instances (and wait), Elastic IPs, interfaces, placement group,
        security group, key parameter. Repeating it is harmless."""
        if resources.instances:
            with tolerating_gone(), calling("TerminateInstances"):
                self.ec2.terminate_instances(InstanceIds=resources.instances)
            log.info("terminating %s", ", ".join(resources.instances))
            self._wait_gone(
                lambda: self.remaining(Resources(instances=resources.instances)).instances,
                "terminated",
                deadline,
            )
        for allocation in resources.addresses:
            addresses = self._pages(
                self.ec2,
                "describe_addresses",
                "Addresses",
                Filters=[{"Name": "allocation-id", "Values": [allocation]}],
            )
            for address in addresses:
                if address.get("AssociationId"):
                    with tolerating_gone(), calling("DisassociateAddress"):
                        self.ec2.disassociate_address(AssociationId=address["AssociationId"])
            with tolerating_gone(), calling("ReleaseAddress"):
                self.ec2.release_address(AllocationId=allocation)
            log.info("released Elastic IP %s", allocation)
        interfaces = sorted(
            set(resources.interfaces) | set(self._interfaces(cluster_id, resources.security_groups))
        )
        for interface in interfaces:
            self._retry_until(
                deadline,
                f"DeleteNetworkInterface {interface}",
                lambda i=interface: self.ec2.delete_network_interface(NetworkInterfaceId=i),
                retry_codes=("InvalidNetworkInterface.InUse",),
            )
        for name in resources.placement_groups:
            with tolerating_gone(), calling("DeletePlacementGroup"):
                self.ec2.delete_placement_group(GroupName=name)
            log.info("deleted placement group %s", name)
        for group_id in resources.security_groups:
            # Interfaces of terminated instances can hold the group for a little while.
            self._retry_until(
                deadline,
                f"DeleteSecurityGroup {group_id}",
                lambda g=group_id: self.ec2.delete_security_group(GroupId=g),
                retry_codes=("DependencyViolation",),
            )
            log.info("deleted security group %s", group_id)
        for name in resources.parameters:
            with tolerating_gone(), calling("DeleteParameter"):
                self.ssm.delete_parameter(Name=name)
            log.info("deleted SSM parameter %s", name)

    def _retry_until(
        self, deadline: float, action: str, call: Callable[[], object], retry_codes: Sequence[str]
    ) -> None:
        while True:
            try:
                with tolerating_gone(), calling(action):
                    call()
                return
            except AwsCallFailed as error:
                if error.code not in retry_codes or time.monotonic() >= deadline:
                    raise
            time.sleep(calls.POLL_INTERVAL_S)

    def _wait_gone(self, still_there: Callable[[], list[str]], what: str, deadline: float) -> None:
        while True:
            left = still_there()
            if not left:
                return
            if time.monotonic() >= deadline:
                raise ClusterNotReady(
                    f"{', '.join(left)} not {what} at the deadline; fix: run gaudi-cluster aws down again"
                )
            time.sleep(calls.POLL_INTERVAL_S)

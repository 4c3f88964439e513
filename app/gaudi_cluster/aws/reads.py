"""Reading a region and a cluster: instance-type facts, zones, subnet, AMI, key pair, quota, and
every resource that carries the cluster's tag. Creates nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gaudi_cluster.aws.calls import (
    AwsCallFailed,
    CloudBase,
    calling,
    node_from,
    tag_filter,
)
from gaudi_cluster.aws.diff import Existing, ExistingNode
from gaudi_cluster.aws.facts import (
    DEFAULT_INSTANCE_TYPE,
    DL1_REGIONS,
    LIVE_STATES,
    TAG_CLUSTER,
    GaudiType,
    InstanceTypeFacts,
    QuotaCheck,
)
from gaudi_cluster.aws.request import Request
from gaudi_cluster.aws.spec import (
    Ami,
    newest_image,
    rules_from_permissions,
)
from gaudi_cluster.errors import ClusterNotReady, ConfigError

# The "Running On-Demand DL instances" quota counts the vCPUs of every DL instance (dl1, dl2q) running.
QUOTA_FAMILY_PREFIX = "dl"


@dataclass(frozen=True)
class Network:
    """Where the nodes go: the VPC, its subnet and that subnet's availability zone."""

    vpc_id: str
    subnet_id: str
    az: str


class Reads(CloudBase):
    """Describe calls only: what the region offers, and what carries a cluster's tag."""

    def instance_type_facts(self, name: str) -> InstanceTypeFacts:
        try:
            with calling("DescribeInstanceTypes"):
                answer = self.ec2.describe_instance_types(InstanceTypes=[name])
        except AwsCallFailed as error:
            if error.code in ("InvalidInstanceType", "InvalidParameterValue"):
                raise ConfigError(
                    f"--instance-type {name} is not an EC2 instance type in {self.region}; "
                    f"fix: {self._elsewhere(name)}"
                ) from None
            raise
        types = answer.get("InstanceTypes") or []
        if not types:
            raise ConfigError(
                f"--instance-type {name} is not offered in {self.region}; fix: {self._elsewhere(name)}"
            )
        info = types[0]
        network = info.get("NetworkInfo") or {}
        return InstanceTypeFacts(
            name=str(info["InstanceType"]),
            vcpus=int((info.get("VCpuInfo") or {}).get("DefaultVCpus", 0)),
            network_cards=int(network.get("MaximumNetworkCards", 1)),
            max_network_interfaces=int(network.get("MaximumNetworkInterfaces", 1)),
            efa_supported=bool(network.get("EfaSupported", False)),
            max_efa_interfaces=int((network.get("EfaInfo") or {}).get("MaximumEfaInterfaces", 0)),
        )

    def _elsewhere(self, name: str) -> str:
        """What to change when this region lacks `name`: the region when it is DL1's own type (asking
        for the same type again would not help), else the type."""
        if name != DEFAULT_INSTANCE_TYPE:
            return f"--instance-type {DEFAULT_INSTANCE_TYPE}"
        regions = [region for region in DL1_REGIONS if region != self.region] or list(DL1_REGIONS)
        return f"--region {' or '.join(regions)} (where EC2 offers {name})"

    def offered_zones(self, instance_type: str) -> list[str]:
        offerings = self._pages(
            self.ec2,
            "describe_instance_type_offerings",
            "InstanceTypeOfferings",
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": [instance_type]}],
        )
        return sorted({str(o["Location"]) for o in offerings})

    def network(self, request: Request, az: str | None, offered: Sequence[str]) -> Network:
        """The given subnet, else the default VPC's default subnet in `az`."""
        if request.subnet_id is not None:
            subnets = self._pages(
                self.ec2,
                "describe_subnets",
                "Subnets",
                Filters=[{"Name": "subnet-id", "Values": [request.subnet_id]}],
            )
            if not subnets:
                raise ConfigError(
                    f"--subnet-id {request.subnet_id} does not exist in {self.region}; "
                    "fix: aws ec2 describe-subnets"
                )
            subnet = subnets[0]
            zone = str(subnet["AvailabilityZone"])
            if zone not in offered:
                raise ConfigError(
                    f"--subnet-id {request.subnet_id} is in {zone}, which offers no {request.instance_type}; "
                    f"fix: a subnet in {', '.join(offered) or 'another region'}"
                )
            if request.az is not None and request.az != zone:
                raise ConfigError(
                    f"--subnet-id {request.subnet_id} is in {zone}, not --az {request.az}; fix: --az {zone}"
                )
            return Network(str(subnet["VpcId"]), request.subnet_id, zone)
        assert az is not None
        vpcs = self._pages(
            self.ec2, "describe_vpcs", "Vpcs", Filters=[{"Name": "is-default", "Values": ["true"]}]
        )
        if not vpcs:
            raise ConfigError(
                f"{self.region} has no default VPC; fix: --subnet-id subnet-… (a subnet in {az})"
            )
        vpc_id = str(vpcs[0]["VpcId"])
        subnets = self._pages(
            self.ec2,
            "describe_subnets",
            "Subnets",
            Filters=[
                {"Name": "vpc-id", "Values": [vpc_id]},
                {"Name": "availability-zone", "Values": [az]},
                {"Name": "default-for-az", "Values": ["true"]},
            ],
        )
        if not subnets:
            raise ConfigError(
                f"the default VPC {vpc_id} has no subnet in {az}; fix: --subnet-id subnet-… (one in {az})"
            )
        return Network(vpc_id, str(subnets[0]["SubnetId"]), az)

    def resolve_ami(self, request: Request) -> Ami:
        if request.ami is not None:
            try:
                with calling("DescribeImages"):
                    images = self.ec2.describe_images(ImageIds=[request.ami]).get("Images", [])
            except AwsCallFailed as error:
                if not error.code.startswith("InvalidAMIID"):
                    raise
                images = []
            found = newest_image(images)
            if found is None:
                raise ConfigError(
                    f"--ami {request.ami} does not exist in {self.region}; "
                    f"fix: an AMI id of {self.region}, or leave --ami out"
                )
            return found
        pattern = request.ami_name_pattern
        images = self._pages(
            self.ec2,
            "describe_images",
            "Images",
            Owners=[request.ami_owner],
            Filters=[
                {"Name": "name", "Values": [pattern]},
                {"Name": "state", "Values": ["available"]},
                {"Name": "architecture", "Values": ["x86_64"]},
            ],
        )
        found = newest_image(images)
        if found is None:
            raise ClusterNotReady(
                f"no Habana Deep Learning Base AMI for SynapseAI {request.synapse} in {self.region} "
                f"(owner {request.ami_owner}, name {pattern!r}); fix: --ami ami-… (a DL1 AMI whose "
                "driver matches the image's Synapse release), or --ami-name PATTERN"
            )
        return found

    def check_key_pair(self, name: str) -> None:
        try:
            with calling("DescribeKeyPairs"):
                self.ec2.describe_key_pairs(KeyNames=[name])
        except AwsCallFailed as error:
            if error.code != "InvalidKeyPair.NotFound":
                raise
            raise ConfigError(
                f"--key-name {name}: no such EC2 key pair in {self.region}; fix: aws ec2 import-key-pair "
                f"--key-name {name} --public-key-material fileb://~/.ssh/id_ed25519.pub "
                f"--region {self.region}"
            ) from None

    def quota(self, gaudi: GaudiType, new_nodes: int) -> QuotaCheck:
        needed = new_nodes * gaudi.facts.vcpus
        # Filter values with wildcards are not honoured everywhere; the family is checked here instead.
        running = self._pages(
            self.ec2,
            "describe_instances",
            "Reservations",
            Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}],
        )
        in_use = 0
        for reservation in running:
            for instance in reservation.get("Instances", []):
                if not str(instance.get("InstanceType", "")).startswith(QUOTA_FAMILY_PREFIX):
                    continue
                cpu = instance.get("CpuOptions") or {}
                in_use += (
                    int(cpu.get("CoreCount", 0)) * int(cpu.get("ThreadsPerCore", 1)) or gaudi.facts.vcpus
                )
        limit: float | None = None
        reason = None
        try:
            with calling("GetServiceQuota"):
                try:
                    answer = self.quotas.get_service_quota(ServiceCode="ec2", QuotaCode=gaudi.quota_code)
                except self.quotas.exceptions.NoSuchResourceException:
                    # Never adjusted in this account: the default applies.
                    answer = self.quotas.get_aws_default_service_quota(
                        ServiceCode="ec2", QuotaCode=gaudi.quota_code
                    )
            limit = float(answer["Quota"]["Value"])
        except AwsCallFailed as error:
            if error.exit_code != ConfigError.exit_code:
                raise
            reason = f"{error.code}: no servicequotas:GetServiceQuota permission"
        return QuotaCheck(gaudi.quota_code, gaudi.quota_name, limit, in_use, needed, reason)

    def existing(self, cluster_id: str) -> Existing:
        groups = self._pages(
            self.ec2, "describe_security_groups", "SecurityGroups", Filters=[tag_filter(cluster_id)]
        )
        group = groups[0] if groups else None
        group_id = str(group["GroupId"]) if group else None
        placement = self._placement_groups(cluster_id)
        nodes: dict[int, ExistingNode] = {}
        for node in self._instances(cluster_id, LIVE_STATES):
            if node.index >= 0:  # an instance someone tagged by hand without a node index is not ours
                nodes.setdefault(node.index, node)
        addresses = self._addresses(cluster_id)
        address = addresses[0] if addresses else {}
        parameters = self._parameters(cluster_id)
        return Existing(
            security_group_id=group_id,
            ingress=rules_from_permissions(group.get("IpPermissions", []), group_id)
            if group and group_id
            else frozenset(),
            egress=rules_from_permissions(group.get("IpPermissionsEgress", []), group_id)
            if group and group_id
            else frozenset(),
            placement_group=placement[0] if placement else None,
            nodes=nodes,
            address_allocation=address.get("AllocationId"),
            address_public_ip=address.get("PublicIp"),
            address_interface=address.get("NetworkInterfaceId"),
            parameters=tuple(parameters),
        )

    def _instances(self, cluster_id: str, states: Sequence[str]) -> list[ExistingNode]:
        reservations = self._pages(
            self.ec2,
            "describe_instances",
            "Reservations",
            Filters=[tag_filter(cluster_id), {"Name": "instance-state-name", "Values": list(states)}],
        )
        return [node_from(i) for r in reservations for i in r.get("Instances", [])]

    def _placement_groups(self, cluster_id: str) -> list[str]:
        groups = self._pages(
            self.ec2, "describe_placement_groups", "PlacementGroups", Filters=[tag_filter(cluster_id)]
        )
        return [str(g["GroupName"]) for g in groups if g.get("State") not in ("deleting", "deleted")]

    def _addresses(self, cluster_id: str) -> list[dict[str, Any]]:
        return self._pages(self.ec2, "describe_addresses", "Addresses", Filters=[tag_filter(cluster_id)])

    def _parameters(self, cluster_id: str) -> list[str]:
        found = self._pages(
            self.ssm,
            "describe_parameters",
            "Parameters",
            ParameterFilters=[{"Key": f"tag:{TAG_CLUSTER}", "Values": [cluster_id]}],
        )
        return [str(p["Name"]) for p in found]

    def console_output(self, instance_id: str) -> str:
        """What the instance printed on its console, newest first-hand (Latest: Nitro instances, as DL1)."""
        with calling("GetConsoleOutput"):
            answer = self.ec2.get_console_output(InstanceId=instance_id, Latest=True)
        # botocore has already decoded the API's base64; absent until the instance printed anything.
        return str(answer.get("Output") or "")

    def status(self, cluster_id: str) -> tuple[list[ExistingNode], str | None]:
        nodes = self._instances(cluster_id, (*LIVE_STATES, "shutting-down"))
        addresses = self._addresses(cluster_id)
        return nodes, (addresses[0].get("PublicIp") if addresses else None)

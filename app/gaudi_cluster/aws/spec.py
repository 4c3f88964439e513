"""What a DL1 cluster is made of, decided from the validated inputs and what the region offers:
the nodes, the security-group rules, the EFA interfaces, RunInstances' parameters. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gaudi_cluster.aws.facts import (
    DEFAULT_INSTANCE_TYPE,
    DL1_REGIONS,
    GAUDI_TYPES,
    MASTER,
    TAG_CLUSTER,
    TAG_NODE,
    TAG_ROLE,
    WORKER,
    GaudiType,
    InstanceTypeFacts,
)
from gaudi_cluster.aws.request import Request, parameter_names, resource_name
from gaudi_cluster.errors import ConfigError


def gaudi_type(facts: InstanceTypeFacts, region: str) -> GaudiType:
    """The live facts checked against what a Gaudi node needs: EFA, and a type this tool knows."""
    if not facts.efa_supported or facts.efa_interfaces < 1:
        raise ConfigError(
            f"{facts.name} has no EFA (Elastic Fabric Adapter) in {region}; "
            f"fix: --instance-type {DEFAULT_INSTANCE_TYPE}"
        )
    known = GAUDI_TYPES.get(facts.name)
    if known is None:
        raise ConfigError(
            f"{facts.name} has EFA but no Gaudi accelerators gaudi-cluster knows; "
            f"fix: --instance-type {' or '.join(GAUDI_TYPES)}"
        )
    return GaudiType(facts, known.accelerators, known.quota_code, known.quota_name)


def choose_az(instance_type: str, region: str, requested: str | None, offered: Iterable[str]) -> str:
    """The AZ to use: the requested one if it offers the type, else the first that does."""
    zones = sorted(set(offered))
    if not zones:
        elsewhere = " or ".join(r for r in DL1_REGIONS if r != region) or DL1_REGIONS[0]
        raise ConfigError(f"region {region} offers no {instance_type}; fix: --region {elsewhere}")
    if requested is None:
        return zones[0]
    if requested not in zones:
        raise ConfigError(
            f"{instance_type} is not offered in {requested} (it is in {', '.join(zones)}); "
            f"fix: --az {zones[0]}"
        )
    return requested


@dataclass(frozen=True)
class Ami:
    image_id: str
    name: str
    created: str


def newest_image(images: Iterable[Mapping[str, object]]) -> Ami | None:
    """The newest available image of a DescribeImages answer (ISO dates sort as text)."""
    candidates = [i for i in images if i.get("State", "available") == "available"]
    if not candidates:
        return None
    best = max(candidates, key=lambda i: (str(i.get("CreationDate", "")), str(i.get("ImageId"))))
    return Ami(str(best["ImageId"]), str(best.get("Name", "")), str(best.get("CreationDate", "")))


@dataclass(frozen=True)
class NodeSpec:
    index: int
    role: str
    name: str


@dataclass(frozen=True)
class ClusterSpec:
    """Everything `up` creates, resolved against one region: the subnet, the AMI, the type's facts."""

    request: Request
    gaudi: GaudiType
    az: str
    vpc_id: str
    subnet_id: str
    ami: Ami

    @property
    def cluster_id(self) -> str:
        return self.request.cluster_id

    @property
    def facts(self) -> InstanceTypeFacts:
        return self.gaudi.facts

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        # Node 0 is the master: it holds the Elastic IP and is started last, once its peers' IPs exist.
        return tuple(
            NodeSpec(i, MASTER if i == 0 else WORKER, f"{self.cluster_id}-node-{i}")
            for i in range(self.request.nodes)
        )

    @property
    def security_group_name(self) -> str:
        return resource_name(self.cluster_id)

    @property
    def placement_group_name(self) -> str | None:
        return resource_name(self.cluster_id) if self.request.placement_group else None

    @property
    def parameter_names(self) -> dict[str, str]:
        """The SSM parameters of the secret key files, by file name (none unless --key-delivery ssm)."""
        return parameter_names(self.cluster_id) if self.request.key_delivery == "ssm" else {}


def tags(cluster_id: str, **extra: str) -> list[dict[str, str]]:
    pairs = {TAG_CLUSTER: cluster_id, **extra}
    return [{"Key": k, "Value": v} for k, v in pairs.items()]


def tag_specifications(
    resource_types: Sequence[str], cluster_id: str, **extra: str
) -> list[dict[str, object]]:
    return [{"ResourceType": kind, "Tags": tags(cluster_id, **extra)} for kind in resource_types]


def node_tags(spec: ClusterSpec, node: NodeSpec) -> dict[str, str]:
    return {"Name": node.name, TAG_NODE: str(node.index), TAG_ROLE: node.role}


# -- security group rules -------------------------------------------------------------------------------

SELF = "self"


@dataclass(frozen=True, order=True)
class Rule:
    """One security-group rule: protocol ('-1' is all traffic), ports, and the peer (SELF or a CIDR)."""

    protocol: str
    from_port: int | None
    to_port: int | None
    peer: str


ALL_FROM_SELF = Rule("-1", None, None, SELF)
# Nodes pull the image and reach SSM over the internet; EFA needs the self rules on top of that.
ALL_TO_INTERNET = Rule("-1", None, None, "0.0.0.0/0")


def wanted_ingress(ssh_cidr: str | None) -> frozenset[Rule]:
    rules = {ALL_FROM_SELF}
    if ssh_cidr is not None:
        rules.add(Rule("tcp", 22, 22, ssh_cidr))
    return frozenset(rules)


def wanted_egress() -> frozenset[Rule]:
    return frozenset({ALL_FROM_SELF, ALL_TO_INTERNET})


def rules_from_permissions(permissions: Iterable[Mapping[str, object]], group_id: str) -> frozenset[Rule]:
    """Flatten DescribeSecurityGroups' IpPermissions(Egress) into rules (one per peer)."""
    rules: set[Rule] = set()
    for permission in permissions:
        protocol = str(permission.get("IpProtocol"))
        if protocol == "-1":
            from_port = to_port = None
        else:
            from_port = _port(permission.get("FromPort"))
            to_port = _port(permission.get("ToPort"))
        for pair in _dicts(permission.get("UserIdGroupPairs")):
            peer = SELF if pair.get("GroupId") == group_id else f"sg:{pair.get('GroupId')}"
            rules.add(Rule(protocol, from_port, to_port, peer))
        for cidr in _dicts(permission.get("IpRanges")):
            rules.add(Rule(protocol, from_port, to_port, str(cidr.get("CidrIp"))))
        for cidr in _dicts(permission.get("Ipv6Ranges")):
            rules.add(Rule(protocol, from_port, to_port, str(cidr.get("CidrIpv6"))))
        for prefix_list in _dicts(permission.get("PrefixListIds")):
            rules.add(Rule(protocol, from_port, to_port, f"pl:{prefix_list.get('PrefixListId')}"))
    return frozenset(rules)


def permission(rule: Rule, group_id: str) -> dict[str, object]:
    """The IpPermissions entry that authorizes or revokes exactly this rule."""
    entry: dict[str, object] = {"IpProtocol": rule.protocol}
    if rule.from_port is not None:
        entry["FromPort"] = rule.from_port
        entry["ToPort"] = rule.to_port
    if rule.peer == SELF:
        entry["UserIdGroupPairs"] = [{"GroupId": group_id}]
    elif rule.peer.startswith("sg:"):
        entry["UserIdGroupPairs"] = [{"GroupId": rule.peer[3:]}]
    elif rule.peer.startswith("pl:"):
        entry["PrefixListIds"] = [{"PrefixListId": rule.peer[3:]}]
    elif ":" in rule.peer:
        entry["Ipv6Ranges"] = [{"CidrIpv6": rule.peer}]
    else:
        entry["IpRanges"] = [{"CidrIp": rule.peer}]
    return entry


def describe_rule(rule: Rule) -> str:
    what = "all traffic" if rule.protocol == "-1" else f"{rule.protocol} {rule.from_port}"
    peer = "the group itself" if rule.peer == SELF else rule.peer
    return f"{what} with {peer}"


def _port(value: object) -> int | None:
    return int(value) if isinstance(value, int) else None


def _dicts(value: object) -> list[Mapping[str, object]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


# -- instances --------------------------------------------------------------------------------------------


def network_interfaces(facts: InstanceTypeFacts, subnet_id: str, group_id: str) -> list[dict[str, object]]:
    """One EFA interface per network card: card 0 device 0 carries the primary IP (EFA with ENA); the
    other cards get EFA-only interfaces (no IP of their own). More than one interface rules out an
    automatic public IP, hence the Elastic IP on the master."""
    interfaces: list[dict[str, object]] = []
    for card in range(facts.efa_interfaces):
        interfaces.append(
            {
                "NetworkCardIndex": card,
                "DeviceIndex": 0,
                "InterfaceType": "efa" if card == 0 else "efa-only",
                "SubnetId": subnet_id,
                "Groups": [group_id],
                "DeleteOnTermination": True,
            }
        )
    return interfaces


def launch_parameters(spec: ClusterSpec, node: NodeSpec, group_id: str, user_data: str) -> dict[str, object]:
    """RunInstances' parameters for one node (one call per node, so a failure names the node)."""
    params: dict[str, object] = {
        "ImageId": spec.ami.image_id,
        "InstanceType": spec.facts.name,
        "MinCount": 1,
        "MaxCount": 1,
        "NetworkInterfaces": network_interfaces(spec.facts, spec.subnet_id, group_id),
        "UserData": user_data,
        # IMDSv2 only; user data holds no secret anyway (see userdata.py).
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        "TagSpecifications": tag_specifications(
            ("instance", "network-interface", "volume"), spec.cluster_id, **node_tags(spec, node)
        ),
    }
    if spec.request.key_name is not None:
        params["KeyName"] = spec.request.key_name
    if spec.placement_group_name is not None:
        params["Placement"] = {"GroupName": spec.placement_group_name}
    if spec.request.instance_profile is not None:
        params["IamInstanceProfile"] = {"Name": spec.request.instance_profile}
    return params

"""What the moto end-to-end tests read back from the emulated account, and how they run the CLI."""

from __future__ import annotations

import base64
import io
import tarfile
from typing import Any

from botocore.exceptions import ClientError
from gaudi_cluster.aws import ec2
from gaudi_cluster.aws.facts import TAG_CLUSTER, TAG_NODE

CIDR = "203.0.113.7/32"
FLAGS = ["--placement-group", "none", "--ssh-cidr", CIDR, "--key-name", "me"]


def up_args(aws, nodes: int = 2, *extra: str) -> list[str]:
    return ["up", "--nodes", str(nodes), *FLAGS, "--keys", str(aws.keys_dir), *extra]


def tags_of(resource: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource.get("Tags", [])}


def instances(aws, cluster: str = "gaudi") -> list[dict[str, Any]]:
    pages = aws.client("ec2").describe_instances(
        Filters=[
            {"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]},
            {
                "Name": "instance-state-name",
                "Values": ["pending", "running", "stopping", "stopped", "shutting-down"],
            },
        ]
    )
    return sorted(
        (i for r in pages["Reservations"] for i in r["Instances"]), key=lambda i: tags_of(i)[TAG_NODE]
    )


def left_over(aws, cluster: str = "gaudi") -> dict[str, list[str]]:
    """Everything that still carries the cluster's tag (or sits in its security group)."""
    client = aws.client("ec2")
    tag = [{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]}]
    groups = [g["GroupId"] for g in client.describe_security_groups(Filters=tag)["SecurityGroups"]]
    interfaces = {
        i["NetworkInterfaceId"] for i in client.describe_network_interfaces(Filters=tag)["NetworkInterfaces"]
    }
    if groups:
        grouped = client.describe_network_interfaces(Filters=[{"Name": "group-id", "Values": groups}])
        interfaces |= {i["NetworkInterfaceId"] for i in grouped["NetworkInterfaces"]}
    parameters = aws.client("ssm").describe_parameters(
        ParameterFilters=[{"Key": f"tag:{TAG_CLUSTER}", "Values": [cluster]}]
    )["Parameters"]
    found = {
        "instances": [i["InstanceId"] for i in instances(aws, cluster)],
        "security groups": groups,
        "addresses": [a["AllocationId"] for a in client.describe_addresses(Filters=tag)["Addresses"]],
        "interfaces": sorted(interfaces),
        "parameters": [p["Name"] for p in parameters],
    }
    return {kind: ids for kind, ids in found.items() if ids}


def rules(permissions: list[dict[str, Any]], group_id: str) -> set[tuple]:
    flat = set()
    for p in permissions:
        ports = (p.get("FromPort"), p.get("ToPort")) if p["IpProtocol"] != "-1" else (None, None)
        for pair in p.get("UserIdGroupPairs", []):
            flat.add((p["IpProtocol"], *ports, "self" if pair["GroupId"] == group_id else pair["GroupId"]))
        for cidr in p.get("IpRanges", []):
            flat.add((p["IpProtocol"], *ports, cidr["CidrIp"]))
        for cidr in p.get("Ipv6Ranges", []):
            flat.add((p["IpProtocol"], *ports, cidr["CidrIpv6"]))
    return flat


def user_data(aws, instance_id: str) -> str:
    value = aws.client("ec2").describe_instance_attribute(InstanceId=instance_id, Attribute="userData")[
        "UserData"
    ]["Value"]
    return base64.b64decode(value).decode()


def fail_run_instances(monkeypatch, call: int, error: BaseException) -> None:
    """Make the `call`-th RunInstances of each command raise `error` (botocore event, before sending)."""
    real = ec2.new_session

    def session(region: str):
        made = real(region)
        seen = {"calls": 0}

        def before_call(**_):
            seen["calls"] += 1
            if seen["calls"] == call:
                raise error

        made.events.register("before-call.ec2.RunInstances", before_call)
        return made

    monkeypatch.setattr(ec2, "new_session", session)


def capacity_error() -> ClientError:
    return ClientError(
        {
            "Error": {
                "Code": "InsufficientInstanceCapacity",
                "Message": "We currently do not have sufficient dl1.24xlarge capacity.",
            }
        },
        "RunInstances",
    )


def unpack(payload: bytes) -> dict[str, bytes]:
    """The files of a key bundle sent on ssh's standard input."""
    with tarfile.open(fileobj=io.BytesIO(payload)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]

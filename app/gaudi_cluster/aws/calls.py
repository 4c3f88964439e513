"""How every AWS call is made: one-line errors with an exit code, pagination, tags, id lists.

Every AWS error becomes one line: the call, AWS's code and message, and a fix. botocore is imported
inside `calling` only, so importing this module needs no boto3.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any

from gaudi_cluster.aws.diff import ExistingNode
from gaudi_cluster.aws.facts import TAG_CLUSTER, TAG_NODE, TAG_ROLE
from gaudi_cluster.errors import ClusterNotReady, ConfigError, GaudiClusterError

POLL_INTERVAL_S = 5.0
NO_CREDENTIALS = (
    "no AWS credentials found; fix: aws configure (or set AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY)"
)
# AWS error codes that mean "the cloud cannot give this now" (exit 3) or "these credentials may not" (exit 2).
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
        "AddressLimitExceeded",
        "MaxSpotInstanceCountExceeded",
    }
)
AUTH_CODES = frozenset(
    {
        "AuthFailure",
        "UnauthorizedOperation",
        "AccessDenied",
        "AccessDeniedException",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "ExpiredToken",
        "RequestExpired",
        "SignatureDoesNotMatch",
    }
)
GONE_CODES = frozenset(
    {
        "InvalidInstanceID.NotFound",
        "InvalidAllocationID.NotFound",
        "InvalidAssociationID.NotFound",
        "InvalidNetworkInterfaceID.NotFound",
        "InvalidPlacementGroup.Unknown",
        "InvalidGroup.NotFound",
        "ParameterNotFound",
    }
)


class AwsCallFailed(GaudiClusterError):
    """An AWS API call failed; `code` is AWS's error code ("" for a transport error)."""

    def __init__(self, message: str, code: str = "", exit_code: int = 1) -> None:
        super().__init__(message)
        self.code = code
        self.exit_code = exit_code


@contextmanager
def calling(action: str, fix: str = "") -> Iterator[None]:
    """Turn botocore's exceptions from one call into one-line errors with an exit code."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    try:
        yield
    except ClientError as error:
        code = str(error.response.get("Error", {}).get("Code", "")) or "Unknown"
        message = one_line(str(error.response.get("Error", {}).get("Message", "")))
        head = f"{action} failed: {code}: {message}"
        if code in AUTH_CODES:
            raise AwsCallFailed(
                f"{head}; fix: use credentials allowed to call {action} "
                "(aws sts get-caller-identity shows whose)",
                code,
                ConfigError.exit_code,
            ) from None
        if code in CAPACITY_CODES:
            raise AwsCallFailed(
                f"{head}; fix: {fix or 'retry later, try another --az, or --placement-group none'}",
                code,
                ClusterNotReady.exit_code,
            ) from None
        raise AwsCallFailed(
            f"{head}; fix: {fix or 'see the message above, then run the command again'}", code
        ) from None
    except NoCredentialsError:
        raise ConfigError(NO_CREDENTIALS) from None
    except BotoCoreError as error:
        if isinstance(error, AssertionError):  # botocore's Stubber reporting a request mismatch
            raise
        raise AwsCallFailed(
            f"{action} failed: {one_line(str(error))}; fix: check the network and --region, then run again",
            exit_code=ClusterNotReady.exit_code,
        ) from None


@contextmanager
def tolerating_gone() -> Iterator[None]:
    """For deletes: a resource that is already gone is what we wanted."""
    try:
        yield
    except AwsCallFailed as error:
        if error.code not in GONE_CODES:
            raise


def one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _tag(resource: Mapping[str, Any], key: str) -> str | None:
    for pair in resource.get("Tags") or []:
        if pair.get("Key") == key:
            return str(pair.get("Value"))
    return None


def tag_filter(cluster_id: str) -> dict[str, Any]:
    return {"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster_id]}


@dataclass
class Resources:
    """Resource ids by kind: what a run created (its journal), or what carries a cluster's tag."""

    instances: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)
    placement_groups: list[str] = field(default_factory=list)
    security_groups: list[str] = field(default_factory=list)
    parameters: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return sum(len(getattr(self, f.name)) for f in fields(self))

    def describe(self) -> str:
        parts = []
        for f in fields(self):
            ids = getattr(self, f.name)
            if ids:
                parts.append(f"{f.name.replace('_', ' ')}: {', '.join(ids)}")
        return "; ".join(parts) or "nothing"


def node_from(instance: Mapping[str, Any]) -> ExistingNode:
    primary = None
    for interface in instance.get("NetworkInterfaces") or []:
        attachment = interface.get("Attachment") or {}
        if attachment.get("DeviceIndex", 0) == 0 and attachment.get("NetworkCardIndex", 0) == 0:
            primary = interface.get("NetworkInterfaceId")
    index = _tag(instance, TAG_NODE)
    return ExistingNode(
        index=int(index) if index is not None and index.isdigit() else -1,
        role=_tag(instance, TAG_ROLE) or "?",
        instance_id=str(instance["InstanceId"]),
        state=str((instance.get("State") or {}).get("Name", "unknown")),
        instance_type=str(instance.get("InstanceType", "")),
        private_ip=instance.get("PrivateIpAddress"),
        public_ip=instance.get("PublicIpAddress"),
        launch_time=instance.get("LaunchTime"),
        primary_interface=primary,
        subnet_id=instance.get("SubnetId"),
    )


class CloudBase:
    """One region's EC2, SSM and Service Quotas clients (the operations live in reads/creates/deletes)."""

    def __init__(self, ec2: Any, ssm: Any, quotas: Any, region: str) -> None:
        self.ec2, self.ssm, self.quotas, self.region = ec2, ssm, quotas, region

    def _pages(self, client: Any, operation: str, key: str, **params: Any) -> list[dict[str, Any]]:
        api_name = client.meta.method_to_api_mapping.get(operation, operation)
        with calling(api_name):
            if client.can_paginate(operation):
                return [
                    item
                    for page in client.get_paginator(operation).paginate(**params)
                    for item in page.get(key, [])
                ]
            return list(getattr(client, operation)(**params).get(key, []))

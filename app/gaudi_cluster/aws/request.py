"""The user's inputs for plan/up, validated before anything reaches AWS. Pure."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, replace
from pathlib import Path

from gaudi_cluster.aws.facts import (
    AMI_OWNER,
    DEFAULT_CLUSTER_ID,
    DEFAULT_IMAGE,
    DEFAULT_INSTANCE_TYPE,
    DEFAULT_SSH_USER,
    DEFAULT_WAIT_TIMEOUT_S,
    MAX_NODES,
    SSM_SECRETS_OF_ROLE,
    SYNAPSE_PROFILE,
    WIDEST_SSH_PREFIX,
)
from gaudi_cluster.errors import ConfigError

_CLUSTER_ID = re.compile(r"^[a-z][a-z0-9-]{0,30}[a-z0-9]$")
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d{1,2}$")
_AZ = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d{1,2}[a-z]$")
_INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")
_SUBNET = re.compile(r"^subnet-[0-9a-f]{8,17}$")
_AMI = re.compile(r"^ami-[0-9a-f]{8,17}$")
_SYNAPSE = re.compile(r"^\d+\.\d+$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$")
_S3_URL = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/[!-~]+$")
_ECR = re.compile(r"^\d{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com/")
_PROFILE = re.compile(r"^[\w+=,.@-]{1,128}$")
_KEY_NAME = re.compile(r"^[ -~]{1,255}$")


@dataclass(frozen=True)
class Request:
    """The user's inputs for plan/up, validated (see validate_request)."""

    nodes: int
    region: str
    cluster_id: str = DEFAULT_CLUSTER_ID
    az: str | None = None
    subnet_id: str | None = None
    instance_type: str = DEFAULT_INSTANCE_TYPE
    key_name: str | None = None
    ssh_cidr: str | None = None
    allow_wide_ssh_source: bool = False
    ssh_user: str = DEFAULT_SSH_USER
    placement_group: bool = True
    image: str = DEFAULT_IMAGE
    image_s3: str | None = None
    ami: str | None = None
    ami_name: str | None = None
    ami_owner: str = AMI_OWNER
    synapse: str = SYNAPSE_PROFILE
    key_delivery: str = "ssh"
    instance_profile: str | None = None
    wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S
    on_failure: str = "rollback"
    keys_dir: Path = Path(".keys")

    @property
    def ami_name_pattern(self) -> str:
        return self.ami_name or ami_name_pattern(self.synapse)


def ami_name_pattern(synapse: str) -> str:
    """DescribeImages name filter for the Habana Deep Learning Base AMI of one SynapseAI release."""
    return f"Deep Learning Base*Habana*Synapse*{synapse}.*"


def resource_name(cluster_id: str) -> str:
    return f"gaudi-cluster-{cluster_id}"


def parameter_names(cluster_id: str) -> dict[str, str]:
    """SSM Parameter Store names (SecureString) of the cluster's secret key files, by file name."""
    files = sorted({name for names in SSM_SECRETS_OF_ROLE.values() for name in names})
    return {name: f"/gaudi-cluster/{cluster_id}/{name}" for name in files}


def validate_cluster_id(cluster_id: str) -> str:
    if not _CLUSTER_ID.match(cluster_id):
        raise ConfigError(
            f"cluster id {cluster_id!r} must be 2-32 lowercase letters, digits or '-', starting with a "
            "letter; fix: --cluster-id demo"
        )
    return cluster_id


def validate_region(region: str) -> str:
    if not _REGION.match(region):
        raise ConfigError(f"--region {region!r} is not an AWS region name; fix: --region us-east-1")
    return region


def normalize_cidr(text: str, allow_wide: bool = False) -> str:
    """The caller's CIDR for ssh ingress: never the whole internet, and nothing wider than a /16 (IPv6:
    /48) unless the user says so with --allow-wide-ssh-source."""
    try:
        network = ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise ConfigError(
            f"--ssh-cidr {text!r} is not an IP network; fix: --ssh-cidr 203.0.113.7/32 (your own address)"
        ) from None
    if network.prefixlen == 0:
        raise ConfigError(
            f"--ssh-cidr {text} would open ssh to the whole internet; fix: --ssh-cidr YOUR.IP.ADDR.ESS/32"
        )
    widest = WIDEST_SSH_PREFIX[network.version]
    if network.prefixlen < widest and not allow_wide:
        raise ConfigError(
            f"--ssh-cidr {text} is wider than /{widest} ({network.num_addresses:,} addresses could try "
            f"port 22); fix: --ssh-cidr YOUR.IP.ADDR.ESS/32, or --allow-wide-ssh-source if that is meant"
        )
    return str(network)


def validate_request(request: Request) -> Request:
    """Raise ConfigError (one line: culprit and fix) for the first bad input; nothing is created before."""
    if request.nodes < 1:
        raise ConfigError(f"--nodes {request.nodes}: a cluster needs at least one node; fix: --nodes 2")
    if request.nodes > MAX_NODES:
        raise ConfigError(
            f"--nodes {request.nodes} is more than {MAX_NODES}; fix: --nodes {MAX_NODES} or fewer "
            "(larger fleets want a capacity reservation and their own tooling)"
        )
    validate_cluster_id(request.cluster_id)
    validate_region(request.region)
    if request.az is not None and not (_AZ.match(request.az) and request.az.startswith(request.region)):
        raise ConfigError(
            f"--az {request.az!r} is not an availability zone of {request.region}; "
            f"fix: --az {request.region}a, or leave --az out to pick one that offers {request.instance_type}"
        )
    if request.subnet_id is not None and not _SUBNET.match(request.subnet_id):
        raise ConfigError(
            f"--subnet-id {request.subnet_id!r} is not a subnet id; fix: --subnet-id subnet-0abc…"
        )
    if not _INSTANCE_TYPE.match(request.instance_type):
        raise ConfigError(
            f"--instance-type {request.instance_type!r} is not an instance type name; "
            f"fix: --instance-type {DEFAULT_INSTANCE_TYPE}"
        )
    if request.ami is not None and not _AMI.match(request.ami):
        raise ConfigError(f"--ami {request.ami!r} is not an AMI id; fix: --ami ami-0abc… or leave it out")
    if not _SYNAPSE.match(request.synapse):
        raise ConfigError(
            f"--synapse {request.synapse!r} must be MAJOR.MINOR; fix: --synapse {SYNAPSE_PROFILE}"
        )
    if not _IMAGE.match(request.image):
        raise ConfigError(
            f"--image {request.image!r} is not an image reference; fix: --image {DEFAULT_IMAGE}"
        )
    if request.image_s3 is not None and not _S3_URL.match(request.image_s3):
        raise ConfigError(
            f"--image-s3 {request.image_s3!r} is not an s3:// URL; fix: --image-s3 s3://bucket/gaudi-cluster.tar"
        )
    if request.key_name is not None and not _KEY_NAME.match(request.key_name):
        raise ConfigError(
            f"--key-name {request.key_name!r} is not an EC2 key pair name; fix: --key-name my-key"
        )
    if request.instance_profile is not None and not _PROFILE.match(request.instance_profile):
        raise ConfigError(
            f"--instance-profile {request.instance_profile!r} is not an instance profile name; "
            "fix: --instance-profile gaudi-node"
        )
    if request.ssh_cidr is not None:
        request = replace(request, ssh_cidr=normalize_cidr(request.ssh_cidr, request.allow_wide_ssh_source))
    if not request.wait_timeout_s > 0:
        raise ConfigError(
            f"--wait-timeout {request.wait_timeout_s:g} must be positive; fix: --wait-timeout 900"
        )
    if request.key_delivery not in ("ssh", "ssm"):
        raise ConfigError(f"--key-delivery {request.key_delivery!r}; fix: --key-delivery ssh or ssm")
    if request.on_failure not in ("rollback", "keep"):
        raise ConfigError(f"--on-failure {request.on_failure!r}; fix: --on-failure rollback or keep")
    if request.key_delivery == "ssh":
        if request.ssh_cidr is None:
            raise ConfigError(
                "--key-delivery ssh needs ssh ingress from your address; fix: --ssh-cidr YOUR.IP/32 "
                "(or --key-delivery ssm --instance-profile NAME)"
            )
        if request.key_name is None:
            raise ConfigError(
                "--key-delivery ssh logs in with an EC2 key pair; "
                "fix: --key-name NAME (or --key-delivery ssm)"
            )
    reads_aws = [
        flag
        for flag, needed in (
            ("--key-delivery ssm", request.key_delivery == "ssm"),
            ("--image-s3", request.image_s3 is not None),
            ("--image on ECR", _ECR.match(request.image) is not None),
        )
        if needed
    ]
    if reads_aws and request.instance_profile is None:
        raise ConfigError(
            f"{reads_aws[0]} reads from AWS on the nodes, which needs an instance profile; "
            "fix: --instance-profile NAME (a role allowed ssm:GetParameter / s3:GetObject / ECR pulls)"
        )
    return request

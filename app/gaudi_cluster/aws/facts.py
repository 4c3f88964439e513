"""Facts gaudi-cluster relies on: the tag, defaults, DL1's published figures, prices and the quota.

Pure data and arithmetic; `up` re-reads the instance-type facts from DescribeInstanceTypes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gaudi_cluster.errors import ClusterNotReady
from gaudi_cluster.settings import profiles

# Every resource of a cluster carries this tag; `down` and `status` find the cluster by it alone.
TAG_CLUSTER = "gaudi-cluster:cluster-id"
TAG_NODE = "gaudi-cluster:node"
TAG_ROLE = "gaudi-cluster:role"

MASTER, WORKER = "master", "worker"
# Nodes run Ubuntu from the Habana Deep Learning Base AMI; its login user.
DEFAULT_SSH_USER = "ubuntu"
# DL1 is first-gen Gaudi: its image and AMI come from the dl1 profile
# (app/gaudi_cluster/settings/profiles.json), whose Synapse release is the last that supports it;
# the host driver in the AMI must match it.
DL1_PROFILE = profiles.load().profile("dl1")
DEFAULT_IMAGE = f"gaudi-cluster:{DL1_PROFILE.name}"
DEFAULT_INSTANCE_TYPE = "dl1.24xlarge"
DEFAULT_CLUSTER_ID = "gaudi"
DEFAULT_WAIT_TIMEOUT_S = 900.0
# Peers travel in user data (16 KiB) and one cluster placement group; far beyond any DL1 fleet we expect.
MAX_NODES = 64
# SynapseAI release (major.minor) of the node image and of the AMI searched for.
SYNAPSE_PROFILE = DL1_PROFILE.synapse_release
AMI_OWNER = "amazon"
# Where the nodes keep the cluster key and the scripts that start them.
NODE_HOME = "/opt/gaudi-cluster"
NODE_KEYS_DIR = f"{NODE_HOME}/keys"
# The key files of the container's key directory: the client key pair of `make keys`, for the master
# alone, the public key of its host CA, and each node's own host key with its certificate (made by `up`
# for that node, certified by the CA for the node's name and private IP: no two nodes share one).
CLIENT_KEY = "id_ed25519"
HOST_KEY = "ssh_host_ed25519_key"
HOST_CA = "host_ca.pub"
# The secret files each role waits for after boot, delivered over ssh (the public halves, the host CA and
# the node's certificate arrive before them, so each node finds its files complete).
SECRETS_OF_ROLE: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"master": (CLIENT_KEY, HOST_KEY), "worker": (HOST_KEY,)}
)
# Through SSM Parameter Store the client key alone (to the master): a host key stored there before the
# nodes launch could be certified for no node's address, and one for all would be every node's. Each
# node's container makes its own host key at start instead, pinned at first contact.
SSM_SECRETS_OF_ROLE: Mapping[str, tuple[str, ...]] = MappingProxyType({"master": (CLIENT_KEY,), "worker": ()})
# The widest --ssh-cidr accepted without --allow-wide-ssh-source: a /16 is a campus or a VPN pool; for
# IPv6 a /48 is one site's allocation.
WIDEST_SSH_PREFIX = {4: 16, 6: 48}

LIVE_STATES = ("pending", "running", "stopping", "stopped")
# States AWS bills the instance hours for (stopped instances cost their volumes only).
BILLED_STATES = frozenset({"pending", "running", "stopping", "shutting-down"})


@dataclass(frozen=True)
class InstanceTypeFacts:
    """What the plan relies on about an instance type: the answer of DescribeInstanceTypes."""

    name: str
    vcpus: int
    network_cards: int
    max_network_interfaces: int
    efa_supported: bool
    max_efa_interfaces: int

    @property
    def efa_interfaces(self) -> int:
        """One EFA interface per network card, as many as the type allows."""
        return min(self.network_cards, self.max_efa_interfaces) if self.efa_supported else 0


@dataclass(frozen=True)
class GaudiType:
    """An instance type gaudi-cluster knows how to run: its accelerators and the quota it draws on."""

    facts: InstanceTypeFacts
    accelerators: int
    quota_code: str
    quota_name: str


# Published facts of dl1.24xlarge (8 Gaudi, 96 vCPUs, 4 x 100 Gbps network cards each with one EFA,
# 60 network interfaces); `plan` prints these when the region's live answer is not at hand, and
# `up` always re-reads them from DescribeInstanceTypes.
GAUDI_TYPES: Mapping[str, GaudiType] = MappingProxyType(
    {
        "dl1.24xlarge": GaudiType(
            facts=InstanceTypeFacts(
                name="dl1.24xlarge",
                vcpus=96,
                network_cards=4,
                max_network_interfaces=60,
                efa_supported=True,
                max_efa_interfaces=4,
            ),
            accelerators=8,
            quota_code="L-6E869C2A",
            quota_name="Running On-Demand DL instances",
        )
    }
)

# On-demand Linux price in USD per instance hour, as AWS published it for DL1 at launch (2021-10-26);
# it was unchanged when this table was written. Check https://aws.amazon.com/ec2/pricing/on-demand/.
PRICES_AS_OF = "2021-10-26"
ON_DEMAND_USD_PER_HOUR: Mapping[tuple[str, str], float] = MappingProxyType(
    {
        ("dl1.24xlarge", "us-east-1"): 13.10904,
        ("dl1.24xlarge", "us-west-2"): 13.10904,
    }
)
DL1_REGIONS = ("us-east-1", "us-west-2")


@dataclass(frozen=True)
class QuotaCheck:
    code: str
    name: str
    limit_vcpus: float | None  # None: the quota could not be read (unknown_reason says why)
    in_use_vcpus: int
    needed_vcpus: int
    unknown_reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.limit_vcpus is None or self.in_use_vcpus + self.needed_vcpus <= self.limit_vcpus

    def line(self) -> str:
        head = f"{self.name} ({self.code}): needs {self.needed_vcpus} more vCPUs, {self.in_use_vcpus} in use"
        if self.limit_vcpus is None:
            return f"{head}, limit unknown ({self.unknown_reason}): not checked"
        return f"{head}, limit {self.limit_vcpus:g}: {'ok' if self.ok else 'TOO LOW'}"


def check_quota(quota: QuotaCheck, region: str) -> None:
    if not quota.ok:
        wanted = quota.in_use_vcpus + quota.needed_vcpus
        raise ClusterNotReady(
            f"quota {quota.name} ({quota.code}) in {region} is {quota.limit_vcpus:g} vCPUs, the cluster "
            f"needs {wanted}; fix: ask for {wanted} (aws service-quotas request-service-quota-increase "
            f"--service-code ec2 --quota-code {quota.code} --desired-value {wanted} --region {region})"
        )


def hourly_price(instance_type: str, region: str) -> float | None:
    return ON_DEMAND_USD_PER_HOUR.get((instance_type, region))


def price_line(instance_type: str, region: str, nodes: int) -> str:
    price = hourly_price(instance_type, region)
    if price is None:
        return (
            f"price: {instance_type} in {region} is not in gaudi-cluster's price table (as of {PRICES_AS_OF})"
        )
    return (
        f"price: ${price:.5f}/h per node, ${price * nodes:.2f}/h for {nodes} "
        f"(on-demand Linux, {region}, price table as of {PRICES_AS_OF})"
    )

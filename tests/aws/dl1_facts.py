"""The DL1 answers AWS gives and moto lacks, written once for the Stubber tests and the moto fixture.

Figures: AWS's published dl1.24xlarge specification (96 vCPUs, 768 GiB, 8 Gaudi, 4 x 100 Gbps network
cards, one EFA per card, 60 network interfaces), in DescribeInstanceTypes' own shape.
"""

from __future__ import annotations

DL1 = "dl1.24xlarge"
ACCOUNT = "123456789012"
# Habana Deep Learning Base AMIs as moto serves them (owner alias "amazon"): two releases of the dl1
# image's SynapseAI (1.21) and a newer one of another release (1.22, no first-gen Gaudi); the newest
# matching one must win.
HABANA_AMIS = [
    {
        "ami_id": "ami-0a1b2c3d4e5f60001",
        "name": "Deep Learning Base AMI Habana SynapseAI 1.21.0 (Ubuntu 22.04) 20250601",
        "creation_date": "2025-06-01T00:00:00.000Z",
    },
    {
        "ami_id": "ami-0a1b2c3d4e5f60002",
        "name": "Deep Learning Base AMI Habana SynapseAI 1.21.1 (Ubuntu 22.04) 20250801",
        "creation_date": "2025-08-01T00:00:00.000Z",
    },
    {
        "ami_id": "ami-0a1b2c3d4e5f60003",
        "name": "Deep Learning Base AMI Habana SynapseAI 1.22.0 (Ubuntu 22.04) 20250901",
        "creation_date": "2025-09-01T00:00:00.000Z",
    },
]
NEWEST_MATCHING_AMI = "ami-0a1b2c3d4e5f60002"


def moto_amis() -> list[dict[str, object]]:
    common = {
        "description": "Habana Deep Learning Base AMI",
        "owner_id": "898082745236",
        "public": True,
        "virtualization_type": "hvm",
        "architecture": "x86_64",
        "state": "available",
        "platform": None,
        "image_type": "machine",
        "hypervisor": "xen",
        "root_device_name": "/dev/sda1",
        "root_device_type": "ebs",
        "sriov": "simple",
    }
    return [{**common, **ami} for ami in HABANA_AMIS]


DL1_INSTANCE_TYPE: dict[str, object] = {
    "InstanceType": DL1,
    "CurrentGeneration": True,
    "SupportedUsageClasses": ["on-demand", "spot"],
    "SupportedRootDeviceTypes": ["ebs"],
    "SupportedVirtualizationTypes": ["hvm"],
    "BareMetal": False,
    "Hypervisor": "nitro",
    "ProcessorInfo": {"SupportedArchitectures": ["x86_64"], "SustainedClockSpeedInGhz": 3.0},
    "VCpuInfo": {"DefaultVCpus": 96, "DefaultCores": 48, "DefaultThreadsPerCore": 2},
    "MemoryInfo": {"SizeInMiB": 786432},
    "InstanceStorageSupported": True,
    "InstanceStorageInfo": {
        "TotalSizeInGB": 4000,
        "Disks": [{"SizeInGB": 1000, "Count": 4, "Type": "ssd"}],
        "NvmeSupport": "required",
    },
    "NetworkInfo": {
        "NetworkPerformance": "4x 100 Gigabit",
        "MaximumNetworkInterfaces": 60,
        "MaximumNetworkCards": 4,
        "DefaultNetworkCardIndex": 0,
        "NetworkCards": [
            {"NetworkCardIndex": card, "NetworkPerformance": "100 Gigabit", "MaximumNetworkInterfaces": 15}
            for card in range(4)
        ],
        "Ipv4AddressesPerInterface": 50,
        "Ipv6AddressesPerInterface": 50,
        "Ipv6Supported": True,
        "EnaSupport": "required",
        "EfaSupported": True,
        "EfaInfo": {"MaximumEfaInterfaces": 4},
        "EncryptionInTransitSupported": True,
    },
    "PlacementGroupInfo": {"SupportedStrategies": ["cluster", "partition", "spread"]},
    "SupportedBootModes": ["legacy-bios", "uefi"],
}
# Where DL1 is offered in the emulated region.
DL1_ZONES = ("us-east-1a", "us-east-1b")

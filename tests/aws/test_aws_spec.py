"""The pure planning of `gaudi-cluster aws`: inputs -> what to create, with no emulator and no boto3."""

from __future__ import annotations

import fnmatch
import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from gaudi_cluster.aws import diff, facts, render, spec
from gaudi_cluster.aws import request as inputs
from gaudi_cluster.aws.diff import Existing, ExistingNode
from gaudi_cluster.aws.facts import GAUDI_TYPES, InstanceTypeFacts, QuotaCheck
from gaudi_cluster.aws.request import Request, validate_request
from gaudi_cluster.aws.spec import ALL_FROM_SELF, ALL_TO_INTERNET, SELF, Ami, ClusterSpec, Rule
from gaudi_cluster.errors import ClusterNotReady, ConfigError

ROOT = Path(__file__).resolve().parents[2]
DL1 = "dl1.24xlarge"
SSH_OK = {"key_name": "me", "ssh_cidr": "203.0.113.7/32"}


def request(**changes) -> Request:
    return validate_request(Request(**{"nodes": 2, "region": "us-east-1", **SSH_OK, **changes}))


def cluster(**changes) -> ClusterSpec:
    return ClusterSpec(
        request(**changes),
        GAUDI_TYPES[DL1],
        "us-east-1a",
        "vpc-0123456789abcdef0",
        "subnet-0123456789abcdef0",
        Ami("ami-0123456789abcdef0", "n", ""),
    )


@pytest.mark.parametrize(
    ("changes", "culprit"),
    [
        ({"nodes": 0}, "--nodes 0: a cluster needs at least one node; fix: --nodes 2"),
        ({"nodes": -3}, "--nodes -3"),
        ({"nodes": 65}, "--nodes 65 is more than 64"),
        ({"cluster_id": "Demo_1"}, "cluster id 'Demo_1'"),
        ({"region": "mars"}, "--region 'mars' is not an AWS region name"),
        ({"az": "us-west-2a"}, "--az 'us-west-2a' is not an availability zone of us-east-1"),
        ({"subnet_id": "net-1"}, "--subnet-id 'net-1'"),
        ({"instance_type": "DL1 big"}, "--instance-type 'DL1 big'"),
        ({"ami": "image-1"}, "--ami 'image-1'"),
        ({"synapse": "1"}, "--synapse '1' must be MAJOR.MINOR"),
        ({"image": "bad image"}, "--image 'bad image'"),
        ({"image_s3": "https://x/y"}, "--image-s3 'https://x/y'"),
        ({"ssh_cidr": "somewhere"}, "--ssh-cidr 'somewhere' is not an IP network"),
        ({"ssh_cidr": "0.0.0.0/0"}, "would open ssh to the whole internet"),
        ({"ssh_cidr": "0.0.0.0/0", "allow_wide_ssh_source": True}, "would open ssh to the whole internet"),
        (
            {"ssh_cidr": "0.0.0.0/1"},
            "--ssh-cidr 0.0.0.0/1 is wider than /16 (2,147,483,648 addresses could try port 22); "
            "fix: --ssh-cidr YOUR.IP.ADDR.ESS/32, or --allow-wide-ssh-source",
        ),
        ({"ssh_cidr": "10.0.0.0/8"}, "--ssh-cidr 10.0.0.0/8 is wider than /16"),
        ({"ssh_cidr": "198.51.0.0/15"}, "--ssh-cidr 198.51.0.0/15 is wider than /16"),
        ({"ssh_cidr": "2001:db8::/32"}, "--ssh-cidr 2001:db8::/32 is wider than /48"),
        ({"ssh_cidr": None}, "--key-delivery ssh needs ssh ingress from your address; fix: --ssh-cidr"),
        ({"key_name": None}, "--key-delivery ssh logs in with an EC2 key pair; fix: --key-name"),
        ({"key_delivery": "ssm"}, "--key-delivery ssm reads from AWS on the nodes"),
        ({"image_s3": "s3://bucket/gc.tar"}, "--image-s3 reads from AWS on the nodes"),
        (
            {"image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/gaudi-cluster:gaudi"},
            "--image on ECR reads from AWS on the nodes, which needs an instance profile; fix:",
        ),
        ({"wait_timeout_s": 0}, "--wait-timeout 0 must be positive"),
    ],
)
def test_bad_input_is_one_line_naming_the_culprit_and_the_fix(changes, culprit):
    with pytest.raises(ConfigError) as error:
        request(**changes)
    message = str(error.value)
    assert culprit in message
    assert "; fix: " in message and "\n" not in message


def test_ssh_cidr_is_normalized_to_its_network():
    assert request(ssh_cidr="203.0.113.77/24").ssh_cidr == "203.0.113.0/24"
    assert request(ssh_cidr="2001:db8::1/64").ssh_cidr == "2001:db8::/64"


def test_a_wide_ssh_source_needs_the_users_word():
    # A /16 is the widest taken as it is; anything wider only with --allow-wide-ssh-source.
    assert request(ssh_cidr="10.20.0.0/16").ssh_cidr == "10.20.0.0/16"
    assert request(ssh_cidr="2001:db8:1::/48").ssh_cidr == "2001:db8:1::/48"
    wide = request(ssh_cidr="0.0.0.0/1", allow_wide_ssh_source=True)
    assert wide.ssh_cidr == "0.0.0.0/1" and wide.allow_wide_ssh_source
    assert request(ssh_cidr="2001:db8::/32", allow_wide_ssh_source=True).ssh_cidr == "2001:db8::/32"


def test_ssm_delivery_needs_no_ssh_but_an_instance_profile():
    ok = request(key_delivery="ssm", instance_profile="gaudi-node", ssh_cidr=None, key_name=None)
    assert ok.ssh_cidr is None


def test_the_default_synapse_profile_is_the_dl1_images_release():
    matrix = json.loads((ROOT / "app" / "gaudi_cluster" / "settings" / "profiles.json").read_text())
    assert matrix["profiles"]["dl1"]["synapse"]["version"].rsplit(".", 1)[0] == facts.SYNAPSE_PROFILE
    assert facts.DEFAULT_IMAGE == "gaudi-cluster:dl1"


def test_the_ami_pattern_matches_its_release_only():
    pattern = inputs.ami_name_pattern("1.22")
    assert fnmatch.fnmatchcase(
        "Deep Learning Base AMI Habana SynapseAI 1.22.1 (Ubuntu 22.04) 20250801", pattern
    )
    assert not fnmatch.fnmatchcase(
        "Deep Learning Base AMI Habana SynapseAI 1.21.0 (Ubuntu 22.04) 20250901", pattern
    )
    assert not fnmatch.fnmatchcase(
        "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) 20250801", pattern
    )


def test_dl1_gets_one_efa_interface_per_network_card_primary_first():
    interfaces = spec.network_interfaces(GAUDI_TYPES[DL1].facts, "subnet-1", "sg-1")
    assert [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in interfaces] == [
        (0, 0, "efa"),
        (1, 0, "efa-only"),
        (2, 0, "efa-only"),
        (3, 0, "efa-only"),
    ]
    assert all(i["SubnetId"] == "subnet-1" and i["Groups"] == ["sg-1"] for i in interfaces)


def test_efa_interfaces_are_capped_by_the_types_efa_limit():
    facts = InstanceTypeFacts(
        "x.big", 8, network_cards=4, max_network_interfaces=8, efa_supported=True, max_efa_interfaces=2
    )
    assert facts.efa_interfaces == 2


def test_an_instance_type_without_efa_is_refused_with_the_fix():
    no_efa = InstanceTypeFacts("t3.micro", 2, 1, 2, efa_supported=False, max_efa_interfaces=0)
    with pytest.raises(
        ConfigError,
        match=r"^t3\.micro has no EFA \(Elastic Fabric Adapter\) in us-east-1; "
        r"fix: --instance-type dl1\.24xlarge$",
    ):
        spec.gaudi_type(no_efa, "us-east-1")
    gpu = InstanceTypeFacts("p4d.24xlarge", 96, 4, 60, efa_supported=True, max_efa_interfaces=4)
    with pytest.raises(ConfigError, match="has EFA but no Gaudi accelerators"):
        spec.gaudi_type(gpu, "us-east-1")
    assert spec.gaudi_type(GAUDI_TYPES[DL1].facts, "us-east-1").quota_code == "L-6E869C2A"


def test_zone_choice():
    assert spec.choose_az(DL1, "us-east-1", None, ["us-east-1b", "us-east-1a"]) == "us-east-1a"
    assert spec.choose_az(DL1, "us-east-1", "us-east-1b", ["us-east-1a", "us-east-1b"]) == "us-east-1b"
    with pytest.raises(
        ConfigError, match=r"not offered in us-east-1c \(it is in us-east-1a\); fix: --az us-east-1a"
    ):
        spec.choose_az(DL1, "us-east-1", "us-east-1c", ["us-east-1a"])
    with pytest.raises(
        ConfigError, match=r"region eu-west-1 offers no dl1\.24xlarge; fix: --region us-east-1"
    ):
        spec.choose_az(DL1, "eu-west-1", None, [])


def test_nodes_master_first_and_names():
    nodes = cluster(nodes=3, cluster_id="demo").nodes
    assert [(n.index, n.role, n.name) for n in nodes] == [
        (0, "master", "demo-node-0"),
        (1, "worker", "demo-node-1"),
        (2, "worker", "demo-node-2"),
    ]


def test_security_group_rules_self_all_traffic_and_ssh_from_the_caller_only():
    assert spec.wanted_ingress("203.0.113.7/32") == {ALL_FROM_SELF, Rule("tcp", 22, 22, "203.0.113.7/32")}
    assert spec.wanted_ingress(None) == {ALL_FROM_SELF}
    assert spec.wanted_egress() == {ALL_FROM_SELF, ALL_TO_INTERNET}
    assert spec.permission(ALL_FROM_SELF, "sg-1") == {
        "IpProtocol": "-1",
        "UserIdGroupPairs": [{"GroupId": "sg-1"}],
    }
    assert spec.permission(Rule("tcp", 22, 22, "203.0.113.7/32"), "sg-1") == {
        "IpProtocol": "tcp",
        "FromPort": 22,
        "ToPort": 22,
        "IpRanges": [{"CidrIp": "203.0.113.7/32"}],
    }


def test_rules_read_back_from_a_merged_permission():
    # DescribeSecurityGroups may merge peers of one protocol into one permission.
    permissions = [
        {
            "IpProtocol": "-1",
            "UserIdGroupPairs": [{"GroupId": "sg-1", "UserId": "1"}],
            "IpRanges": [{"CidrIp": "0.0.0.0/0"}],
        },
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": "198.51.100.0/24"}]},
    ]
    assert spec.rules_from_permissions(permissions, "sg-1") == {
        Rule("-1", None, None, SELF),
        ALL_TO_INTERNET,
        Rule("tcp", 22, 22, "198.51.100.0/24"),
    }


def node(index: int, state: str = "running", **fields) -> ExistingNode:
    return ExistingNode(
        index,
        "master" if index == 0 else "worker",
        f"i-{index:017x}",
        state,
        DL1,
        private_ip=f"10.0.0.{10 + index}",
        primary_interface=f"eni-{index:017x}",
        subnet_id="subnet-0123456789abcdef0",
        **fields,
    )


def complete(target: ClusterSpec) -> Existing:
    return Existing(
        security_group_id="sg-1",
        ingress=spec.wanted_ingress(target.request.ssh_cidr),
        egress=spec.wanted_egress(),
        placement_group=target.placement_group_name,
        nodes={i: node(i) for i in range(target.request.nodes)},
        address_allocation="eipalloc-1",
        address_public_ip="198.51.100.7",
        address_interface=node(0).primary_interface,
    )


def test_a_fresh_cluster_creates_everything_workers_before_the_master():
    target = cluster(nodes=3)
    changes = diff.diff(target, Existing())
    assert changes.create_security_group and changes.create_placement_group and changes.allocate_address
    assert set(changes.authorize_ingress) == spec.wanted_ingress("203.0.113.7/32")
    # The new group already holds AWS's default egress to anywhere; only the self rule is added.
    assert changes.authorize_egress == (ALL_FROM_SELF,)
    assert [n.index for n in changes.launch] == [0, 1, 2]
    assert not changes.create_parameters


def test_a_complete_cluster_needs_nothing():
    target = cluster(nodes=3)
    assert diff.diff(target, complete(target)).empty


def test_converging_adds_missing_nodes_and_fixes_rules_and_the_address():
    target = cluster(nodes=3)
    found = complete(target)
    stale = replace(
        found,
        nodes={0: node(0), 2: node(2, state="stopped")},
        ingress=found.ingress | {Rule("tcp", 22, 22, "192.0.2.0/24")},
        address_interface="eni-old",
    )
    changes = diff.diff(target, stale)
    assert [n.index for n in changes.launch] == [1]
    assert [n.index for n in changes.start] == [2]
    assert changes.revoke_ingress == (Rule("tcp", 22, 22, "192.0.2.0/24"),)
    assert changes.associate_address and not changes.allocate_address
    assert not changes.create_security_group


def test_fewer_nodes_than_exist_is_refused_not_deleted():
    target = cluster(nodes=3)
    with pytest.raises(
        ConfigError, match=r"already has 3 nodes and --nodes 2 would leave node 2 behind; fix: --nodes 3"
    ):
        diff.diff(cluster(nodes=2), complete(target))


def test_a_cluster_in_another_subnet_is_refused():
    target = cluster()
    moved = replace(complete(target), nodes={0: replace(node(0), subnet_id="subnet-0ffffffffffffffff")})
    with pytest.raises(ConfigError, match="runs in subnet subnet-0ffffffffffffffff"):
        diff.diff(target, moved)


def test_ssm_delivery_plans_one_parameter_per_secret_file():
    target = cluster(key_delivery="ssm", instance_profile="gaudi-node")
    # The client key alone: a host key stored before launch would be every node's (each makes its own).
    assert target.parameter_names == {"id_ed25519": "/gaudi-cluster/gaudi/id_ed25519"}
    assert diff.diff(target, Existing()).create_parameters
    # `up` deletes them once the new nodes have them: a complete cluster needs none.
    assert diff.diff(target, complete(target)).empty
    # A node to launch needs them again, unless an unfinished delivery left them.
    one_short = replace(complete(target), nodes={0: node(0)})
    assert diff.diff(target, one_short).create_parameters
    left = replace(one_short, parameters=tuple(target.parameter_names.values()))
    assert not diff.diff(target, left).create_parameters
    assert cluster().parameter_names == {}


def test_launch_parameters_carry_tags_imdsv2_profile_and_no_public_ip_request():
    target = cluster(key_delivery="ssm", instance_profile="gaudi-node", placement_group=False)
    params = spec.launch_parameters(target, target.nodes[1], "sg-1", "#!/bin/bash\n")
    assert "Placement" not in params
    assert params["IamInstanceProfile"] == {"Name": "gaudi-node"}
    assert params["MetadataOptions"] == {"HttpTokens": "required", "HttpEndpoint": "enabled"}
    assert all("AssociatePublicIpAddress" not in i for i in params["NetworkInterfaces"])
    kinds = [t["ResourceType"] for t in params["TagSpecifications"]]
    assert kinds == ["instance", "network-interface", "volume"]
    assert {"Key": facts.TAG_CLUSTER, "Value": "gaudi"} in params["TagSpecifications"][0]["Tags"]


def test_quota_check():
    ok = QuotaCheck("L-6E869C2A", "Running On-Demand DL instances", 384, 96, 192)
    assert ok.ok and ok.line().endswith("limit 384: ok")
    facts.check_quota(ok, "us-east-1")
    low = replace(ok, limit_vcpus=96)
    with pytest.raises(ClusterNotReady, match=r"is 96 vCPUs, the cluster needs 288; fix: ask for 288"):
        facts.check_quota(low, "us-east-1")
    unknown = replace(ok, limit_vcpus=None, unknown_reason="AccessDenied")
    assert unknown.ok and "not checked" in unknown.line()


def test_price_line_and_unknown_region():
    assert facts.price_line(DL1, "us-east-1", 2) == (
        "price: $13.10904/h per node, $26.22/h for 2 "
        "(on-demand Linux, us-east-1, price table as of 2021-10-26)"
    )
    assert "not in gaudi-cluster's price table" in facts.price_line(DL1, "eu-central-1", 2)


def test_status_shows_uptime_and_cost_so_far_from_the_price_table():
    now = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    started = now - timedelta(hours=1, minutes=30)
    nodes = [
        node(0, launch_time=started),
        node(1, launch_time=started),
        node(2, state="stopped", launch_time=started),
    ]
    text = render.render_status("demo", "us-east-1", nodes, "198.51.100.7", now)
    rows = {line.split()[0]: line.split() for line in text.splitlines()[2:5]}
    assert rows["0"][3:] == ["running", "10.0.0.10", "1h30m", "$19.66"]
    assert rows["2"][3:] == ["stopped", "10.0.0.12", "-", "$0.00"]
    # 2 running nodes x 1.5 h x $13.10904
    assert "cost so far: $39.33" in text
    assert "Elastic IP: 198.51.100.7" in text


def test_status_outside_the_price_table_says_so():
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    text = render.render_status("demo", "eu-central-1", [node(0, launch_time=now)], None, now)
    assert "cost so far: n/a" in text


def test_newest_image():
    images = [
        {"ImageId": "ami-1", "Name": "a", "CreationDate": "2025-01-01T00:00:00.000Z"},
        {"ImageId": "ami-2", "Name": "b", "CreationDate": "2025-03-01T00:00:00.000Z"},
        {
            "ImageId": "ami-3",
            "Name": "c",
            "CreationDate": "2025-09-01T00:00:00.000Z",
            "State": "deregistered",
        },
    ]
    assert spec.newest_image(images) == Ami("ami-2", "b", "2025-03-01T00:00:00.000Z")
    assert spec.newest_image([]) is None


def test_plan_lists_every_resource_price_and_quota():
    target = cluster(nodes=2)
    quota = QuotaCheck("L-6E869C2A", "Running On-Demand DL instances", 384, 0, 192)
    text = render.render_plan(target, Existing(), diff.diff(target, Existing()), quota)
    for expected in (
        "create security group gaudi-cluster-gaudi",
        "create ingress all traffic with the group itself",
        "create ingress tcp 22 with 203.0.113.7/32",
        "create egress all traffic with the group itself",
        "create placement group gaudi-cluster-gaudi (strategy cluster)",
        "create instance gaudi-node-0 (master): 4 EFA interfaces",
        "create instance gaudi-node-1 (worker)",
        "create Elastic IP (new) on node 0",
        "$26.22/h for 2",
        "needs 192 more vCPUs, 0 in use, limit 384: ok",
        "AMI: ami-0123456789abcdef0",
    ):
        assert expected in text, expected

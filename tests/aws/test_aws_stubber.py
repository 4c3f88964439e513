"""What moto cannot check, checked with botocore's Stubber: each request below is validated against AWS's
own EC2 / SSM / Service Quotas service model (names, types, nesting), and must equal the literal
parameters written here. Placement groups, EFA network interfaces, DL1's instance-type facts, the quota
call, the order in which `down` deletes, the SecureStrings and their deletion, the console read."""

from __future__ import annotations

import base64
from pathlib import Path

import botocore.session
import pytest
from botocore.stub import Stubber
from gaudi_cluster.aws import calls, ec2
from gaudi_cluster.aws.diff import Existing, ExistingNode
from gaudi_cluster.aws.ec2 import Cloud, Resources
from gaudi_cluster.aws.facts import GAUDI_TYPES, TAG_CLUSTER, TAG_NODE, TAG_ROLE
from gaudi_cluster.aws.keys import ClusterKeys, delete_key_parameters, put_key_parameters
from gaudi_cluster.aws.request import Request, validate_request
from gaudi_cluster.aws.spec import Ami, ClusterSpec
from gaudi_cluster.errors import ConfigError

from tests.aws.dl1_facts import DL1, DL1_INSTANCE_TYPE

SUBNET = "subnet-0123456789abcdef0"
GROUP = "sg-0123456789abcdef0"
AMI = "ami-0123456789abcdef0"


# One botocore session: it caches the (large) service models between tests.
SESSION = botocore.session.get_session()


def client(service: str):
    return SESSION.create_client(
        service,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        endpoint_url="https://stubbed.invalid",
    )


@pytest.fixture
def stubs(monkeypatch):
    monkeypatch.setattr(calls, "POLL_INTERVAL_S", 0.0)
    clients = {name: client(name) for name in ("ec2", "ssm", "service-quotas")}
    stubbers = {name: Stubber(c) for name, c in clients.items()}
    for stubber in stubbers.values():
        stubber.activate()
    yield Cloud(clients["ec2"], clients["ssm"], clients["service-quotas"], "us-east-1"), stubbers
    for stubber in stubbers.values():
        stubber.assert_no_pending_responses()
        stubber.deactivate()


def cluster(placement_group: bool = True) -> ClusterSpec:
    request = validate_request(
        Request(
            nodes=2,
            region="us-east-1",
            cluster_id="demo",
            key_name="me",
            ssh_cidr="203.0.113.7/32",
            placement_group=placement_group,
        )
    )
    return ClusterSpec(
        request, GAUDI_TYPES[DL1], "us-east-1a", "vpc-0123456789abcdef0", SUBNET, Ami(AMI, "x", "")
    )


def test_placement_group_is_created_with_strategy_cluster_and_the_cluster_tag(stubs):
    cloud, stub = stubs
    stub["ec2"].add_response(
        "create_placement_group",
        {"PlacementGroup": {"GroupName": "gaudi-cluster-demo", "State": "pending", "Strategy": "cluster"}},
        {
            "GroupName": "gaudi-cluster-demo",
            "Strategy": "cluster",
            "TagSpecifications": [
                {
                    "ResourceType": "placement-group",
                    "Tags": [
                        {"Key": TAG_CLUSTER, "Value": "demo"},
                        {"Key": "Name", "Value": "gaudi-cluster-demo"},
                    ],
                }
            ],
        },
    )
    journal = Resources()
    assert cloud.create_placement_group(cluster(), journal) == "gaudi-cluster-demo"
    assert journal.placement_groups == ["gaudi-cluster-demo"]


def efa(card: int) -> dict[str, object]:
    return {
        "NetworkCardIndex": card,
        "DeviceIndex": 0,
        "InterfaceType": "efa" if card == 0 else "efa-only",
        "SubnetId": SUBNET,
        "Groups": [GROUP],
        "DeleteOnTermination": True,
    }


def test_run_instances_puts_the_node_in_the_placement_group_with_one_efa_per_network_card(stubs):
    cloud, stub = stubs
    spec = cluster()
    node = spec.nodes[1]
    user_data = "#!/bin/bash\necho worker\n"
    tags = [
        {"Key": TAG_CLUSTER, "Value": "demo"},
        {"Key": "Name", "Value": "demo-node-1"},
        {"Key": TAG_NODE, "Value": "1"},
        {"Key": TAG_ROLE, "Value": "worker"},
    ]
    stub["ec2"].add_response(
        "run_instances",
        {
            "Instances": [
                {
                    "InstanceId": "i-0123456789abcdef1",
                    "InstanceType": DL1,
                    "State": {"Code": 0, "Name": "pending"},
                    "PrivateIpAddress": "172.31.0.11",
                    "SubnetId": SUBNET,
                    "Tags": tags,
                }
            ]
        },
        {
            "ImageId": AMI,
            "InstanceType": DL1,
            "MinCount": 1,
            "MaxCount": 1,
            "KeyName": "me",
            "Placement": {"GroupName": "gaudi-cluster-demo"},
            "NetworkInterfaces": [efa(0), efa(1), efa(2), efa(3)],
            # As given: botocore base64-encodes it on the wire.
            "UserData": user_data,
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
            "TagSpecifications": [
                {"ResourceType": kind, "Tags": tags} for kind in ("instance", "network-interface", "volume")
            ],
        },
    )
    journal = Resources()
    launched = cloud.launch(spec, node, GROUP, user_data, journal)
    assert (launched.instance_id, launched.index, launched.role) == ("i-0123456789abcdef1", 1, "worker")
    assert journal.instances == ["i-0123456789abcdef1"]


def test_without_a_placement_group_run_instances_has_no_placement(stubs):
    cloud, stub = stubs
    spec = cluster(placement_group=False)
    stub["ec2"].add_response(
        "run_instances",
        {"Instances": [{"InstanceId": "i-0123456789abcdef0", "State": {"Code": 0, "Name": "pending"}}]},
        {
            "ImageId": AMI,
            "InstanceType": DL1,
            "MinCount": 1,
            "MaxCount": 1,
            "KeyName": "me",
            "NetworkInterfaces": [efa(0), efa(1), efa(2), efa(3)],
            "UserData": "#!/bin/bash\n",
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
            "TagSpecifications": [
                {
                    "ResourceType": kind,
                    "Tags": [
                        {"Key": TAG_CLUSTER, "Value": "demo"},
                        {"Key": "Name", "Value": "demo-node-0"},
                        {"Key": TAG_NODE, "Value": "0"},
                        {"Key": TAG_ROLE, "Value": "master"},
                    ],
                }
                for kind in ("instance", "network-interface", "volume")
            ],
        },
    )
    cloud.launch(spec, spec.nodes[0], GROUP, "#!/bin/bash\n", Resources())


def test_dl1_facts_read_from_describe_instance_types_match_the_table(stubs):
    cloud, stub = stubs
    stub["ec2"].add_response(
        "describe_instance_types", {"InstanceTypes": [DL1_INSTANCE_TYPE]}, {"InstanceTypes": [DL1]}
    )
    facts = cloud.instance_type_facts(DL1)
    assert facts == GAUDI_TYPES[DL1].facts
    assert facts.efa_interfaces == 4


def test_an_unknown_instance_type_is_bad_input(stubs):
    cloud, stub = stubs
    stub["ec2"].add_client_error(
        "describe_instance_types",
        service_error_code="InvalidInstanceType",
        service_message="The following supplied instance types do not exist: [dl9.huge]",
        expected_params={"InstanceTypes": ["dl9.huge"]},
    )
    with pytest.raises(ConfigError, match=r"dl9\.huge is not an EC2 instance type in us-east-1; fix:"):
        cloud.instance_type_facts("dl9.huge")


def test_quota_reads_the_dl_vcpu_quota_and_counts_running_dl_vcpus(stubs):
    cloud, stub = stubs
    stub["ec2"].add_response(
        "describe_instances",
        {
            "Reservations": [
                {
                    "Instances": [
                        {
                            "InstanceId": "i-0000000000000000a",
                            "InstanceType": DL1,
                            "CpuOptions": {"CoreCount": 48, "ThreadsPerCore": 2},
                        },
                        {
                            "InstanceId": "i-0000000000000000b",
                            "InstanceType": "m5.large",
                            "CpuOptions": {"CoreCount": 1, "ThreadsPerCore": 2},
                        },
                    ]
                }
            ]
        },
        {"Filters": [{"Name": "instance-state-name", "Values": ["pending", "running"]}]},
    )
    stub["service-quotas"].add_client_error(
        "get_service_quota",
        service_error_code="NoSuchResourceException",
        expected_params={"ServiceCode": "ec2", "QuotaCode": "L-6E869C2A"},
    )
    stub["service-quotas"].add_response(
        "get_aws_default_service_quota",
        {"Quota": {"ServiceCode": "ec2", "QuotaCode": "L-6E869C2A", "Value": 0.0}},
        {"ServiceCode": "ec2", "QuotaCode": "L-6E869C2A"},
    )
    quota = cloud.quota(GAUDI_TYPES[DL1], new_nodes=2)
    assert (quota.limit_vcpus, quota.in_use_vcpus, quota.needed_vcpus, quota.ok) == (0.0, 96, 192, False)


def test_the_newest_habana_base_ami_of_the_synapse_release_is_chosen(stubs):
    cloud, stub = stubs
    stub["ec2"].add_response(
        "describe_images",
        {
            "Images": [
                {
                    "ImageId": "ami-00000000000000001",
                    "Name": "old",
                    "CreationDate": "2025-06-01T00:00:00.000Z",
                    "State": "available",
                },
                {
                    "ImageId": "ami-00000000000000002",
                    "Name": "new",
                    "CreationDate": "2025-08-01T00:00:00.000Z",
                    "State": "available",
                },
            ]
        },
        {
            "Owners": ["amazon"],
            "Filters": [
                {"Name": "name", "Values": ["Deep Learning Base*Habana*Synapse*1.21.*"]},
                {"Name": "state", "Values": ["available"]},
                {"Name": "architecture", "Values": ["x86_64"]},
            ],
        },
    )
    assert cloud.resolve_ami(cluster().request).image_id == "ami-00000000000000002"


def test_the_elastic_ip_goes_to_the_masters_primary_interface(stubs):
    cloud, stub = stubs
    spec = cluster()
    master = ExistingNode(
        0, "master", "i-0123456789abcdef0", "running", DL1, primary_interface="eni-0000000000000000a"
    )
    stub["ec2"].add_response(
        "allocate_address",
        {"AllocationId": "eipalloc-0123456789abcdef0", "PublicIp": "198.51.100.7"},
        {
            "Domain": "vpc",
            "TagSpecifications": [
                {
                    "ResourceType": "elastic-ip",
                    "Tags": [{"Key": TAG_CLUSTER, "Value": "demo"}, {"Key": "Name", "Value": "demo-master"}],
                }
            ],
        },
    )
    stub["ec2"].add_response(
        "associate_address",
        {"AssociationId": "eipassoc-0123456789abcdef0"},
        {
            "AllocationId": "eipalloc-0123456789abcdef0",
            "NetworkInterfaceId": "eni-0000000000000000a",
            "AllowReassociation": True,
        },
    )
    journal = Resources()
    assert cloud.ensure_address(spec, Existing(), master, journal) == "198.51.100.7"
    assert journal.addresses == ["eipalloc-0123456789abcdef0"]


def test_down_deletes_in_dependency_order_placement_group_included(stubs):
    cloud, stub = stubs
    instance, allocation, interface = (
        "i-0123456789abcdef0",
        "eipalloc-0123456789abcdef0",
        "eni-0123456789abcdef0",
    )
    parameter = "/gaudi-cluster/demo/id_ed25519"
    ec2_stub = stub["ec2"]
    ec2_stub.add_response("terminate_instances", {"TerminatingInstances": []}, {"InstanceIds": [instance]})
    ec2_stub.add_response(
        "describe_instances",
        {
            "Reservations": [
                {"Instances": [{"InstanceId": instance, "State": {"Code": 32, "Name": "shutting-down"}}]}
            ]
        },
        {"Filters": [{"Name": "instance-id", "Values": [instance]}]},
    )
    ec2_stub.add_response(
        "describe_instances",
        {
            "Reservations": [
                {"Instances": [{"InstanceId": instance, "State": {"Code": 48, "Name": "terminated"}}]}
            ]
        },
        {"Filters": [{"Name": "instance-id", "Values": [instance]}]},
    )
    ec2_stub.add_response(
        "describe_addresses",
        {"Addresses": [{"AllocationId": allocation, "AssociationId": "eipassoc-0123456789abcdef0"}]},
        {"Filters": [{"Name": "allocation-id", "Values": [allocation]}]},
    )
    # The instance is gone, so is its association: already-gone is fine.
    ec2_stub.add_client_error(
        "disassociate_address",
        service_error_code="InvalidAssociationID.NotFound",
        expected_params={"AssociationId": "eipassoc-0123456789abcdef0"},
    )
    ec2_stub.add_response("release_address", {}, {"AllocationId": allocation})
    ec2_stub.add_response(
        "describe_network_interfaces",
        {"NetworkInterfaces": [{"NetworkInterfaceId": interface, "Status": "available"}]},
        {"Filters": [{"Name": "group-id", "Values": [GROUP]}]},
    )
    ec2_stub.add_response("delete_network_interface", {}, {"NetworkInterfaceId": interface})
    ec2_stub.add_response("delete_placement_group", {}, {"GroupName": "gaudi-cluster-demo"})
    # Interfaces can hold the group for a moment after their instance is gone: retried.
    ec2_stub.add_client_error(
        "delete_security_group", service_error_code="DependencyViolation", expected_params={"GroupId": GROUP}
    )
    ec2_stub.add_response("delete_security_group", {}, {"GroupId": GROUP})
    stub["ssm"].add_response("delete_parameter", {}, {"Name": parameter})
    cloud.teardown(
        Resources(
            instances=[instance],
            addresses=[allocation],
            placement_groups=["gaudi-cluster-demo"],
            security_groups=[GROUP],
            parameters=[parameter],
        ),
        deadline=float("inf"),
    )


def test_each_secret_file_goes_to_parameter_store_as_a_tagged_securestring(stubs):
    cloud, stub = stubs
    keys = ClusterKeys(
        client_private=b"stand-in for the client key AAAA\n",
        client_public="ssh-ed25519 AAAA",
        ca_public="ssh-ed25519 CCCC",
        ca_key=Path("/nowhere/ca/host_ca"),
    )
    # The client key alone: no host key goes to Parameter Store (each node's container makes its own).
    names = {"id_ed25519": "/gaudi-cluster/demo/id_ed25519"}
    value = keys.client_private.decode()
    stored = {
        "Name": names["id_ed25519"],
        "Value": value,
        "Type": "SecureString",
        "Description": "gaudi-cluster: the cluster's id_ed25519, until every node has it",
        "Tags": [{"Key": TAG_CLUSTER, "Value": "demo"}],
    }
    # One left by an up that never finished: overwritten (it carries its tag already).
    stub["ssm"].add_client_error(
        "put_parameter", service_error_code="ParameterAlreadyExists", expected_params=stored
    )
    stub["ssm"].add_response(
        "put_parameter",
        {"Version": 2},
        {"Name": names["id_ed25519"], "Value": value, "Type": "SecureString", "Overwrite": True},
    )
    journal = Resources()
    put_key_parameters(cloud.ssm, names, keys, "demo", journal)
    assert journal.parameters == list(names.values())
    assert "PRIVATE" not in repr(keys) and "stand-in" not in repr(keys)


def test_the_parameters_are_deleted_and_one_already_gone_is_fine(stubs):
    cloud, stub = stubs
    stub["ssm"].add_response("delete_parameter", {}, {"Name": "/gaudi-cluster/demo/id_ed25519"})
    stub["ssm"].add_client_error(
        "delete_parameter",
        service_error_code="ParameterNotFound",
        expected_params={"Name": "/gaudi-cluster/demo/ssh_host_ed25519_key"},
    )
    delete_key_parameters(
        cloud.ssm, ["/gaudi-cluster/demo/id_ed25519", "/gaudi-cluster/demo/ssh_host_ed25519_key"]
    )


def test_the_console_is_read_first_hand(stubs):
    cloud, stub = stubs
    text = "-----BEGIN SSH HOST KEY KEYS-----\nssh-ed25519 AAAA root@ip\n-----END SSH HOST KEY KEYS-----\n"
    # The API sends base64; botocore's own handler decodes it before the answer reaches us.
    stub["ec2"].add_response(
        "get_console_output",
        {"InstanceId": "i-0123456789abcdef0", "Output": base64.b64encode(text.encode()).decode()},
        {"InstanceId": "i-0123456789abcdef0", "Latest": True},
    )
    assert cloud.console_output("i-0123456789abcdef0") == text
    # Before the instance printed anything there is no Output at all.
    stub["ec2"].add_response(
        "get_console_output",
        {"InstanceId": "i-0123456789abcdef0"},
        {"InstanceId": "i-0123456789abcdef0", "Latest": True},
    )
    assert cloud.console_output("i-0123456789abcdef0") == ""


def test_a_capacity_error_on_launch_is_exit_3_with_a_fix(stubs):
    cloud, stub = stubs
    stub["ec2"].add_client_error(
        "run_instances",
        service_error_code="InsufficientInstanceCapacity",
        service_message="We currently do not have sufficient dl1.24xlarge capacity in the Availability Zone.",
    )
    with pytest.raises(ec2.AwsCallFailed) as failure:
        cloud.launch(cluster(), cluster().nodes[0], GROUP, "#!/bin/bash\n", Resources())
    assert failure.value.exit_code == 3
    assert str(failure.value).startswith(
        "RunInstances for demo-node-0 failed: InsufficientInstanceCapacity: "
    )
    assert "; fix: " in str(failure.value) and "\n" not in str(failure.value)

"""plan / up / status / down end to end against moto's EC2 server (--placement-group none).

Each test gets a fresh emulated account (see conftest.py); the CLI runs in-process with boto3 pointed
at moto through AWS_ENDPOINT_URL. Assertions read the account back with boto3, never the CLI's output
alone: the exact security-group rules, the tags, the Elastic IP, the user data, what `down` leaves.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import pytest
from botocore.exceptions import ClientError
from gaudi_cluster.aws import cli, ec2
from gaudi_cluster.aws.facts import TAG_CLUSTER, TAG_NODE, TAG_ROLE

from tests.aws.dl1_facts import DL1, NEWEST_MATCHING_AMI

CIDR = "203.0.113.7/32"
FLAGS = ["--placement-group", "none", "--ssh-cidr", CIDR, "--key-name", "me"]


@dataclass
class Run:
    code: int
    out: str
    err: str


@pytest.fixture
def run(capsys):
    def invoke(*argv: str) -> Run:
        code = cli.main(list(argv))
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return invoke


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


def test_plan_prints_everything_and_creates_nothing(aws, run):
    result = run("plan", "--nodes", "2", *FLAGS)
    assert result.code == 0, result.err
    for expected in (
        f"AMI: {NEWEST_MATCHING_AMI}",
        "create security group gaudi-cluster-gaudi",
        f"create ingress tcp 22 with {CIDR}",
        "no placement group (--placement-group none)",
        "create instance gaudi-node-0 (master): 4 EFA interfaces",
        "create instance gaudi-node-1 (worker)",
        "price: $13.10904/h per node, $26.22/h for 2",
        "Running On-Demand DL instances (L-6E869C2A): needs 192 more vCPUs, 0 in use, limit 384: ok",
        "plan only: nothing was created",
    ):
        assert expected in result.out, expected
    assert left_over(aws) == {}


def test_up_status_reup_down_end_to_end(aws, run):
    first = run(*up_args(aws))
    assert first.code == 0, first.err

    # Two DL1 nodes from the newest matching AMI, one subnet, tagged, master = node 0.
    nodes = instances(aws)
    assert [tags_of(n)[TAG_ROLE] for n in nodes] == ["master", "worker"]
    assert all(
        n["InstanceType"] == DL1 and n["ImageId"] == NEWEST_MATCHING_AMI and n["KeyName"] == "me"
        for n in nodes
    )
    assert len({n["SubnetId"] for n in nodes}) == 1
    assert [tags_of(n)["Name"] for n in nodes] == ["gaudi-node-0", "gaudi-node-1"]
    master, worker = nodes

    # The security group: all traffic within itself both ways, ssh from the caller's CIDR only.
    client = aws.client("ec2")
    (group,) = client.describe_security_groups(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": ["gaudi"]}])[
        "SecurityGroups"
    ]
    assert rules(group["IpPermissions"], group["GroupId"]) == {
        ("-1", None, None, "self"),
        ("tcp", 22, 22, CIDR),
    }
    assert rules(group["IpPermissionsEgress"], group["GroupId"]) == {
        ("-1", None, None, "self"),
        ("-1", None, None, "0.0.0.0/0"),
    }
    assert all(g["GroupId"] == group["GroupId"] for n in nodes for g in n["SecurityGroups"])

    # One tagged Elastic IP, on the master's primary interface.
    (address,) = client.describe_addresses(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": ["gaudi"]}])[
        "Addresses"
    ]
    primary = next(i for i in master["NetworkInterfaces"] if i["Attachment"]["DeviceIndex"] == 0)
    assert address["NetworkInterfaceId"] == primary["NetworkInterfaceId"]
    assert address["PrivateIpAddress"] == master["PrivateIpAddress"]
    assert f"master: ssh -i ~/.ssh/me.pem ubuntu@{address['PublicIp']}" in first.out

    # User data: the master holds with the worker as its peer; no key material anywhere in it.
    secret = aws.private_key.decode().splitlines()[1]
    master_boot, worker_boot = user_data(aws, master["InstanceId"]), user_data(aws, worker["InstanceId"])
    assert f"GAUDI_CLUSTER_PEERS={worker['PrivateIpAddress']}\n" in master_boot
    assert "GAUDI_CLUSTER_HOLD=1\n" in master_boot and "NODE_ROLE=master\n" in master_boot
    assert "GAUDI_CLUSTER_PEERS" not in worker_boot and "NODE_ROLE=worker\n" in worker_boot
    assert all(secret not in text and "PRIVATE KEY" not in text for text in (master_boot, worker_boot))

    # The key went over ssh on stdin: master (Elastic IP) first, then the worker through it.
    calls = sorted(aws.ssh_log.glob("argv.*"))
    assert [c.read_text().splitlines()[2] for c in calls] == ["master", "node-1"]
    assert all((aws.ssh_log / c.name.replace("argv", "stdin")).read_bytes() == aws.private_key for c in calls)
    assert all(secret not in c.read_text() for c in calls)
    config = (aws.tmp / "cache" / "gaudi-cluster" / "aws" / "gaudi" / "ssh_config").read_text()
    assert f"HostName {address['PublicIp']}" in config and f"HostName {worker['PrivateIpAddress']}" in config
    assert secret not in first.out + first.err

    status = run("status", "gaudi")
    assert status.code == 0, status.err
    assert status.out.count(" running ") == 2 and "cost so far: $" in status.out
    assert f"Elastic IP: {address['PublicIp']}" in status.out

    # Converges: a second up finds everything and creates nothing.
    again = run(*up_args(aws))
    assert again.code == 0, again.err
    assert "create " not in again.out
    assert [n["InstanceId"] for n in instances(aws)] == [master["InstanceId"], worker["InstanceId"]]
    assert len(client.describe_addresses()["Addresses"]) == 1
    assert (
        len(
            client.describe_security_groups(
                Filters=[{"Name": "group-name", "Values": ["gaudi-cluster-gaudi"]}]
            )["SecurityGroups"]
        )
        == 1
    )

    down = run("down", "gaudi")
    assert down.code == 0, down.err
    assert "nothing carries gaudi-cluster:cluster-id=gaudi any more" in down.out
    assert left_over(aws) == {}
    assert client.describe_addresses()["Addresses"] == []
    assert not (aws.tmp / "cache" / "gaudi-cluster" / "aws" / "gaudi").exists()

    twice = run("down", "gaudi")
    assert twice.code == 0 and "nothing to delete" in twice.out


def test_a_failure_on_the_third_launch_rolls_back_what_up_created(aws, run, monkeypatch):
    fail_run_instances(monkeypatch, call=3, error=capacity_error())
    result = run(*up_args(aws, 3))
    assert result.code == 3
    (line,) = [x for x in result.err.splitlines() if x.startswith("gaudi-cluster: error:")]
    assert "RunInstances for gaudi-node-0 failed: InsufficientInstanceCapacity" in line
    assert "rolled back what this run created (instances: " in line and "security groups: sg-" in line
    assert "; fix: retry later, try another --az, or --placement-group none" in line
    assert left_over(aws) == {}


def test_keep_on_failure_leaves_it_tagged_then_up_converges_and_down_cleans(aws, run, monkeypatch):
    with monkeypatch.context() as patch:
        fail_run_instances(patch, call=3, error=capacity_error())
        failed = run(*up_args(aws, 3, "--on-failure", "keep"))
    assert failed.code == 3
    assert "kept what this run created" in failed.err and "gaudi-cluster aws down gaudi" in failed.err
    left = left_over(aws)
    assert len(left["instances"]) == 2 and len(left["security groups"]) == 1

    finished = run(*up_args(aws, 3))
    assert finished.code == 0, finished.err
    assert [tags_of(n)[TAG_NODE] for n in instances(aws)] == ["0", "1", "2"]
    peers = user_data(aws, instances(aws)[0]["InstanceId"])
    assert all(f"{n['PrivateIpAddress']}" in peers for n in instances(aws)[1:])

    assert run("down", "gaudi").code == 0
    assert left_over(aws) == {}


def test_ctrl_c_during_up_leaves_only_tagged_resources_that_down_removes(aws, run, monkeypatch):
    fail_run_instances(monkeypatch, call=2, error=KeyboardInterrupt())
    interrupted = run(*up_args(aws, 3))
    assert interrupted.code == 130
    assert "interrupted" in interrupted.err and "fix: gaudi-cluster aws down gaudi" in interrupted.err
    left = left_over(aws)
    assert len(left["instances"]) == 1 and len(left["security groups"]) == 1

    assert run("down", "gaudi").code == 0
    assert left_over(aws) == {}


def test_ssm_delivery_stores_a_tagged_securestring_and_down_deletes_it(aws, run):
    result = run(
        "up", "--nodes", "1", "--placement-group", "none", "--key-delivery", "ssm",
        "--instance-profile", "gaudi-node", "--keys", str(aws.keys_dir), "--cluster-id", "solo",
    )  # fmt: skip
    assert result.code == 0, result.err
    ssm = aws.client("ssm")
    stored = ssm.get_parameter(Name="/gaudi-cluster/solo/id_ed25519", WithDecryption=True)["Parameter"]
    assert stored["Type"] == "SecureString" and stored["Value"].encode() == aws.private_key
    (node,) = instances(aws, "solo")
    boot = user_data(aws, node["InstanceId"])
    assert "NODE_KEY_PARAMETER=/gaudi-cluster/solo/id_ed25519\n" in boot
    assert aws.private_key.decode().splitlines()[1] not in boot
    assert node["IamInstanceProfile"]["Arn"].endswith("/gaudi-node")
    assert list(aws.ssh_log.iterdir()) == []
    # The security group has no ssh ingress when no --ssh-cidr was given.
    (group,) = aws.client("ec2").describe_security_groups(
        Filters=[{"Name": "group-name", "Values": ["gaudi-cluster-solo"]}]
    )["SecurityGroups"]
    assert rules(group["IpPermissions"], group["GroupId"]) == {("-1", None, None, "self")}

    assert run("down", "solo").code == 0
    assert left_over(aws, "solo") == {}


@pytest.mark.parametrize(
    ("extra", "code", "fragment"),
    [
        (
            ["--instance-type", "t3.micro"],
            2,
            "t3.micro has no EFA (Elastic Fabric Adapter) in us-east-1; fix: --instance-type dl1.24xlarge",
        ),
        (["--region", "eu-west-1"], 2, "region eu-west-1 offers no dl1.24xlarge; fix: --region us-east-1"),
        (
            ["--az", "us-east-1c"],
            2,
            "dl1.24xlarge is not offered in us-east-1c (it is in us-east-1a, us-east-1b); "
            "fix: --az us-east-1a",
        ),
        (["--synapse", "9.9"], 3, "no Habana Deep Learning Base AMI for SynapseAI 9.9 in us-east-1"),
        (["--ami", "ami-0123456789abcdef9"], 2, "--ami ami-0123456789abcdef9 does not exist in us-east-1"),
        (
            ["--subnet-id", "subnet-0123456789abcdef9"],
            2,
            "--subnet-id subnet-0123456789abcdef9 does not exist",
        ),
        (
            ["--key-name", "nobody"],
            2,
            "--key-name nobody: no such EC2 key pair in us-east-1; fix: aws ec2 import-key-pair",
        ),
    ],
)
def test_a_cloud_that_cannot_host_the_cluster_is_refused_and_nothing_is_created(
    aws, run, extra, code, fragment
):
    result = run(*up_args(aws), *extra)
    assert result.code == code, result.err
    (line,) = [x for x in result.err.splitlines() if x.startswith("gaudi-cluster: error:")]
    assert fragment in line and "; fix: " in line
    assert left_over(aws) == {}


def test_a_quota_too_low_is_exit_3_and_nothing_is_created(aws, run):
    aws.set_dl_quota(96)
    result = run(*up_args(aws))
    assert result.code == 3
    assert (
        "quota Running On-Demand DL instances (L-6E869C2A) in us-east-1 is 96 vCPUs, the cluster needs 192"
        in result.err
    )
    assert (
        "request-service-quota-increase --service-code ec2 --quota-code L-6E869C2A --desired-value 192"
        in result.err
    )
    assert left_over(aws) == {}

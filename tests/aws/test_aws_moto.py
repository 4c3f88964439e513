"""plan / up / status / down end to end against moto's EC2 server (--placement-group none).

Each test gets a fresh emulated account (see conftest.py); the CLI runs in-process with boto3 pointed
at moto through AWS_ENDPOINT_URL. Assertions read the account back with boto3, never the CLI's output
alone: the exact security-group rules, the tags, the Elastic IP, the user data, what `down` leaves.
"""

from __future__ import annotations

import pytest
from gaudi_cluster.aws.facts import TAG_CLUSTER, TAG_NODE, TAG_ROLE
from gaudi_cluster.aws.keys import read_pins

from tests.aws.conftest import booted_console, made_up_host_key
from tests.aws.dl1_facts import DL1, NEWEST_MATCHING_AMI
from tests.aws.moto_views import (
    CIDR,
    FLAGS,
    capacity_error,
    fail_run_instances,
    instances,
    left_over,
    rules,
    tags_of,
    unpack,
    up_args,
    user_data,
)
from tests.support.keys import principals


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

    # User data: the master holds with the worker as its peer; public keys only, no secret in it.
    ca_key = (aws.keys_dir / "ca" / "host_ca").read_text()
    secrets = [aws.private_key.decode().splitlines()[1], ca_key.splitlines()[1]]
    master_boot, worker_boot = user_data(aws, master["InstanceId"]), user_data(aws, worker["InstanceId"])
    assert f"GAUDI_CLUSTER_PEERS={worker['PrivateIpAddress']}\n" in master_boot
    assert "GAUDI_CLUSTER_HOLD=1\n" in master_boot and "NODE_ROLE=master\n" in master_boot
    assert "GAUDI_CLUSTER_PEERS" not in worker_boot and "NODE_ROLE=worker\n" in worker_boot
    for text in (master_boot, worker_boot):
        assert "PRIVATE KEY" not in text and not any(secret in text for secret in secrets)
        for public in ("id_ed25519.pub", "ca/host_ca.pub"):
            assert (aws.keys_dir / public).read_text().strip() in text
    assert "NODE_SECRETS='id_ed25519 ssh_host_ed25519_key'" in master_boot
    assert "NODE_SECRETS=ssh_host_ed25519_key\n" in worker_boot

    # The keys went over ssh on stdin: master (Elastic IP) first with the client key and its own host
    # key, then the worker, through it, with its own host key only; each certified by the cluster's CA
    # for the node's name and the private IP the master dials.
    sent = [(host, unpack(stdin or b"")) for host, stdin in aws.sent_to()]
    host_files = {"ssh_host_ed25519_key", "ssh_host_ed25519_key.pub", "ssh_host_ed25519_key-cert.pub"}
    assert [(host, set(files)) for host, files in sent] == [
        ("master", {"id_ed25519", *host_files}),
        ("node-1", host_files),
    ]
    assert sent[0][1]["id_ed25519"] == aws.private_key
    assert sent[0][1]["ssh_host_ed25519_key"] != sent[1][1]["ssh_host_ed25519_key"]
    for (_, files), names in (
        (sent[0], ["master", "node-0", master["PrivateIpAddress"]]),
        (sent[1], ["node-1", worker["PrivateIpAddress"]]),
    ):
        assert principals(files["ssh_host_ed25519_key-cert.pub"]) == names
    assert all(not any(s in c.read_text() for s in secrets) for c in aws.ssh_log.glob("argv.*"))
    # Only to the host keys each instance printed on its console, pinned under its instance id.
    state = aws.tmp / "cache" / "gaudi-cluster" / "aws" / "gaudi"
    config = (state / "ssh_config").read_text()
    assert f"HostName {address['PublicIp']}" in config and f"HostName {worker['PrivateIpAddress']}" in config
    assert config.count("StrictHostKeyChecking yes") == 2 and "accept-new" not in config
    pins = read_pins(state / "known_hosts")
    assert set(pins) == {master["InstanceId"], worker["InstanceId"]}
    for node in (master, worker):
        assert f"HostKeyAlias {node['InstanceId']}" in config
        assert aws.host_keys_printed(node["InstanceId"]) in pins[node["InstanceId"]]
    assert not any(secret in first.out + first.err for secret in secrets)

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


SSM_UP = [
    "up", "--nodes", "2", "--placement-group", "none", "--key-delivery", "ssm",
    "--instance-profile", "gaudi-node", "--cluster-id", "solo",
]  # fmt: skip
CLIENT_PARAMETER = "/gaudi-cluster/solo/id_ed25519"


def test_ssm_delivery_deletes_the_securestrings_once_every_node_has_its_keys(aws, run):
    result = run(*SSM_UP, "--keys", str(aws.keys_dir))
    assert result.code == 0, result.err
    assert f"create SSM parameter {CLIENT_PARAMETER} (SecureString:" in result.out
    assert "ssh_host_ed25519_key" not in result.out  # no host key for all: each node makes its own
    assert aws.client("ssm").describe_parameters()["Parameters"] == []
    master, worker = instances(aws, "solo")
    master_boot, worker_boot = user_data(aws, master["InstanceId"]), user_data(aws, worker["InstanceId"])
    # Each role reads only its own files: the client key is the master's alone.
    assert f"NODE_PARAMETER_id_ed25519={CLIENT_PARAMETER}\n" in master_boot
    assert "NODE_PARAMETER_id_ed25519" not in worker_boot and "NODE_SECRETS=''\n" in worker_boot
    for text in (master_boot, worker_boot):
        assert "ssh_host_ed25519_key" not in text
        assert "host_ca.pub" not in text  # no certificate to check: the nodes' own keys at first contact
    assert aws.private_key.decode().splitlines()[1] not in master_boot + worker_boot
    assert master["IamInstanceProfile"]["Arn"].endswith("/gaudi-node")
    assert list(aws.ssh_log.iterdir()) == []
    # Converged: nothing to launch, so no key is stored again.
    again = run(*SSM_UP, "--keys", str(aws.keys_dir))
    assert again.code == 0, again.err
    assert "create " not in again.out and "SSM parameter" not in again.out
    assert aws.client("ssm").describe_parameters()["Parameters"] == []
    # The security group has no ssh ingress when no --ssh-cidr was given.
    (group,) = aws.client("ec2").describe_security_groups(
        Filters=[{"Name": "group-name", "Values": ["gaudi-cluster-solo"]}]
    )["SecurityGroups"]
    assert rules(group["IpPermissions"], group["GroupId"]) == {("-1", None, None, "self")}

    assert run("down", "solo").code == 0
    assert left_over(aws, "solo") == {}


def test_the_securestrings_stay_while_a_node_lacks_its_keys_and_go_once_it_has_them(aws, run):
    key = made_up_host_key()
    aws.console("solo-node-1", booted_console(key, keyed=False))
    waiting = run(*SSM_UP, "--keys", str(aws.keys_dir), "--wait-timeout", "2")
    assert waiting.code == 3, waiting.err
    (line,) = [x for x in waiting.err.splitlines() if x.startswith("gaudi-cluster: error:")]
    (worker,) = [n["InstanceId"] for n in instances(aws, "solo") if tags_of(n)[TAG_NODE] == "1"]
    assert f"the cluster is up but node 1 ({worker}) has not said on its console that it has its keys" in line
    assert "so the SSM parameters stay (tagged: down deletes them); fix: " in line
    ssm = aws.client("ssm")
    stored = ssm.get_parameter(Name=CLIENT_PARAMETER, WithDecryption=True)["Parameter"]
    assert stored["Type"] == "SecureString" and stored["Value"].encode() == aws.private_key
    assert len(left_over(aws, "solo")["parameters"]) == 1

    aws.console("solo-node-1", booted_console(key))
    finished = run(*SSM_UP, "--keys", str(aws.keys_dir))
    assert finished.code == 0, finished.err
    assert "parameters" not in left_over(aws, "solo")
    assert run("down", "solo").code == 0
    assert left_over(aws, "solo") == {}


def test_up_sends_no_key_to_a_node_whose_console_shows_no_host_keys(aws, run):
    aws.console("gaudi-node-1", "[    0.000000] Linux version 5.15.0-1051-aws\n")
    result = run(*up_args(aws), "--wait-timeout", "2")
    assert result.code == 3, result.err
    (line,) = [x for x in result.err.splitlines() if x.startswith("gaudi-cluster: error:")]
    (worker,) = [n["InstanceId"] for n in instances(aws) if tags_of(n)[TAG_NODE] == "1"]
    assert f"the cluster is up but node-1 ({worker}) printed no ssh host keys on its console" in line
    # Every node is pinned before the first ssh: not even the master got anything.
    assert aws.sent_to() == []


def test_up_refuses_a_node_that_answers_with_another_host_key_and_names_it(aws, run):
    aws.impostor_at("node-1")
    result = run(*up_args(aws))
    assert result.code == 1, result.err
    (line,) = [x for x in result.err.splitlines() if x.startswith("gaudi-cluster: error:")]
    _, worker = instances(aws)
    assert (
        f"the cluster is up but node-1 ({worker['InstanceId']}) at {worker['PrivateIpAddress']} answered ssh "
        "with a host key its console did not print; nothing was sent to it" in line
    )
    sent = dict(aws.sent_to())
    assert sent["node-1"] is None  # refused before ssh read its standard input
    assert set(unpack(sent["master"] or b"")) == {
        "id_ed25519",
        "ssh_host_ed25519_key",
        "ssh_host_ed25519_key.pub",
        "ssh_host_ed25519_key-cert.pub",
    }


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

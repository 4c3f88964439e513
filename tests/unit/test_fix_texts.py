"""Every error's "fix:" names something different from the input that caused it.

The walk is static: every string of the shipped code holding "fix:" is found with `ast`. A fix can
repeat its input only where it names a flag (or variable) that its own culprit names too, e.g.
"--instance-type dl1.24xlarge is not offered here; fix: --instance-type dl1.24xlarge"; each such site
must have a row in TRIGGERS, which raises it with the inputs that trigger it, and the message is
checked: no `FLAG VALUE` (or `NAME=VALUE`) of the fix may be one the culprit names. Every setting's
bad-value error (its fix built from its example) is walked the same way, setting by setting.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from botocore.exceptions import ClientError
from gaudi_cluster.aws import request as aws_request
from gaudi_cluster.aws.reads import Reads
from gaudi_cluster.aws.request import Request, validate_request
from gaudi_cluster.errors import GaudiClusterError
from gaudi_cluster.settings.config import SETTINGS, resolve_config

APP = Path(__file__).resolve().parents[2] / "app"
FLAG = re.compile(r"(--[a-z][\w-]*|GAUDI_CLUSTER_[A-Z_]+)")
PAIR = re.compile(r"(--[a-z][\w-]*|GAUDI_CLUSTER_[A-Z_]+)(?:\s+|=)'?([^\s',;)]+)")
PLACEHOLDER = re.compile(r"…|YOUR|NAME|PATTERN|^N$|^\{")


def pairs(text: str) -> set[tuple[str, str]]:
    return {(flag, value) for flag, value in PAIR.findall(text) if not PLACEHOLDER.search(value)}


def repeated(message: str) -> set[tuple[str, str]]:
    """The (flag, value) pairs that the fix names and the culprit already named."""
    culprit, _, fix = message.partition("fix:")
    assert fix, f"no fix in {message!r}"
    return pairs(fix) & pairs(culprit)


def _pieces(node: ast.AST) -> str:
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}"
                       for v in node.values)  # fmt: skip
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""


def fix_sites() -> list[tuple[str, str]]:
    """(module path, text) of every string with a "fix:" whose fix names a flag its culprit names."""
    found = []
    for path in sorted(APP.rglob("*.py")):
        tree = ast.parse(path.read_text())
        inner = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
        for node in ast.walk(tree):
            if id(node) in inner or not isinstance(node, ast.JoinedStr | ast.Constant):
                continue
            text = _pieces(node)
            culprit, _, fix = text.partition("fix:")
            if fix and set(FLAG.findall(culprit)) & set(FLAG.findall(fix)):
                found.append((str(path.relative_to(APP)), text))
    return found


def raised(action: Callable[[], object]) -> str:
    try:
        action()
    except GaudiClusterError as error:
        return str(error)
    raise AssertionError("no error raised")


def req(**changes: object) -> Request:
    return Request(**{"nodes": 2, "region": "us-east-1", **changes})  # type: ignore[arg-type]


def ec2_refusing(code: str) -> Reads:
    def describe_instance_types(**_: object) -> dict:
        raise ClientError({"Error": {"Code": code, "Message": "no"}}, "DescribeInstanceTypes")

    return Reads(SimpleNamespace(describe_instance_types=describe_instance_types), None, None, "eu-west-1")


def ec2_answering(**answers: object) -> Reads:
    client = SimpleNamespace(
        meta=SimpleNamespace(method_to_api_mapping={}),
        can_paginate=lambda _op: False,
        **{name: _answer(value) for name, value in answers.items()},
    )
    return Reads(client, None, None, "us-east-1")


def _answer(value: object) -> Callable[..., object]:
    return lambda **_: value


def subnet(zone: str) -> dict:
    return {"Subnets": [{"AvailabilityZone": zone, "VpcId": "vpc-1", "SubnetId": "subnet-1"}]}


# (module, a piece of its fix text, the trigger). Each trigger raises the site's error.
TRIGGERS: list[tuple[str, str, Callable[[], object]]] = [
    ("gaudi_cluster/aws/reads.py", "not an EC2 instance type",
     lambda: ec2_refusing("InvalidInstanceType").instance_type_facts("dl1.24xlarge")),
    ("gaudi_cluster/aws/reads.py", "is not offered in",
     lambda: ec2_answering(describe_instance_types={"InstanceTypes": []}).instance_type_facts("dl1.24xl")),
    ("gaudi_cluster/aws/reads.py", "not --az",
     lambda: ec2_answering(describe_subnets=subnet("us-east-1b")).network(
         req(subnet_id="subnet-1", az="us-east-1a"), None, ["us-east-1b"])),
    ("gaudi_cluster/aws/reads.py", "an AMI id of",
     lambda: ec2_answering(describe_images={"Images": []}).resolve_ami(req(ami="ami-0123456789abcdef0"))),
    ("gaudi_cluster/aws/reads.py", "import-key-pair",
     lambda: Reads(SimpleNamespace(describe_key_pairs=lambda **_: (_ for _ in ()).throw(ClientError(
         {"Error": {"Code": "InvalidKeyPair.NotFound", "Message": "no"}}, "DescribeKeyPairs"))),
         None, None, "us-east-1").check_key_pair("mine")),
    ("gaudi_cluster/aws/request.py", "fix: --region us-east-1", lambda: aws_request.validate_region("Moon")),
    ("gaudi_cluster/aws/request.py", "your own address", lambda: aws_request.normalize_cidr("nope")),
    ("gaudi_cluster/aws/request.py", "YOUR.IP.ADDR.ESS", lambda: aws_request.normalize_cidr("0.0.0.0/0")),
    ("gaudi_cluster/aws/request.py", "fix: --nodes 2", lambda: validate_request(req(nodes=0))),
    ("gaudi_cluster/aws/request.py", "or fewer", lambda: validate_request(req(nodes=10_000))),
    ("gaudi_cluster/aws/request.py", "leave --az out", lambda: validate_request(req(az="eu-west-1a"))),
    ("gaudi_cluster/aws/request.py", "subnet-0abc", lambda: validate_request(req(subnet_id="sub"))),
    ("gaudi_cluster/aws/request.py", "instance type name",
     lambda: validate_request(req(instance_type="DL1!"))),
    ("gaudi_cluster/aws/request.py", "ami-0abc", lambda: validate_request(req(ami="img"))),
    ("gaudi_cluster/aws/request.py", "MAJOR.MINOR", lambda: validate_request(req(synapse="latest"))),
    ("gaudi_cluster/aws/request.py", "not an image reference", lambda: validate_request(req(image="::"))),
    ("gaudi_cluster/aws/request.py", "s3://bucket", lambda: validate_request(req(image_s3="http://x"))),
    ("gaudi_cluster/aws/request.py", "my-key", lambda: validate_request(req(key_name="a b"))),
    ("gaudi_cluster/aws/request.py", "gaudi-node", lambda: validate_request(req(instance_profile="a b"))),
    ("gaudi_cluster/aws/request.py", "must be positive", lambda: validate_request(req(wait_timeout_s=0))),
    ("gaudi_cluster/aws/request.py", "ssh or ssm", lambda: validate_request(req(key_delivery="mail"))),
    ("gaudi_cluster/aws/request.py", "rollback or keep", lambda: validate_request(req(on_failure="maybe"))),
    ("gaudi_cluster/aws/request.py", "needs ssh ingress", lambda: validate_request(req(key_name="k"))),
    ("gaudi_cluster/aws/request.py", "logs in with an EC2 key pair",
     lambda: validate_request(req(ssh_cidr="203.0.113.7/32"))),
    ("gaudi_cluster/settings/config.py", "--metrics-port {other}",
     lambda: resolve_config({"metrics_port": "29500"}, {})),
    ("gaudi_cluster/settings/config.py", "--min-nodes {config.nodes} or less",
     lambda: resolve_config({"min_nodes": "3", "nodes": "2", "max_restarts": "1"}, {})),
    ("gaudi_cluster/settings/config.py", "--max-restarts 1 or more",
     lambda: resolve_config({"spares": "1"}, {})),
]  # fmt: skip
# Sites whose fix value differs from the culprit's by construction: (module, piece, why).
BY_CONSTRUCTION = [
    ("gaudi_cluster/aws/cli.py", "must be positive", "the input is <= 0, the fix 900"),
    ("gaudi_cluster/aws/diff.py", "would leave node", "the fix is the existing count, above the input"),
    ("gaudi_cluster/aws/ec2.py", "is not an EC2 region", "the input is not a region, the fix is one"),
    ("gaudi_cluster/compat/translate.py", "drop --world_size", "the fix is the hostfile's total, not it"),
    ("gaudi_cluster/compat/translate.py", "not a rendezvous port", "input outside 1024-65535, fix 29500"),
    ("gaudi_cluster/settings/command_line.py", "--tee takes no value", "the fix names no value"),
    ("gaudi_cluster/launch/launchers.py", "--launcher deepspeed or mpirun", "the input is torchrun"),
    ("gaudi_cluster/launch/plan.py", "on its first slots", "input mpirun/torchrun, fix direct"),
    ("gaudi_cluster/nodes/find.py", "lower --spares", "names no value"),
    ("gaudi_cluster/nodes/find.py", "lower --nodes", "the fix is the count found, below the input"),
    ("gaudi_cluster/nodes/ssh.py", "set --ssh-port", "names no value"),
]


def _known(module: str, text: str) -> bool:
    rows = [(m, piece) for m, piece, _ in TRIGGERS] + [(m, piece) for m, piece, _ in BY_CONSTRUCTION]
    return any(module == m and piece in text for m, piece in rows)


def test_every_fix_that_names_its_culprits_flag_has_a_trigger_or_a_reason():
    missing = [f"{module}: {text[:120]}" for module, text in fix_sites() if not _known(module, text)]
    assert not missing, "add a TRIGGERS row for:\n" + "\n".join(missing)


@pytest.mark.parametrize(("module", "piece", "trigger"), TRIGGERS, ids=[f"{m}:{p}" for m, p, _ in TRIGGERS])
def test_the_fix_names_something_else_than_the_input(module, piece, trigger):
    message = raised(trigger)
    assert "fix:" in message, message
    assert not repeated(message), message


def test_dl1_in_a_region_without_it_names_another_region_not_the_type_again():
    message = raised(lambda: ec2_refusing("InvalidInstanceType").instance_type_facts("dl1.24xlarge"))
    assert message.endswith("fix: --region us-east-1 or us-west-2 (where EC2 offers dl1.24xlarge)"), message
    other = raised(lambda: ec2_refusing("InvalidInstanceType").instance_type_facts("p4d.24xlarge"))
    assert other.endswith("fix: --instance-type dl1.24xlarge"), other


# Every setting's parser refuses at least one of these (free text refuses only blanks).
CANDIDATES = ("not-a-value!", "-5", "0", "99999", "x;y", "=", " ")


@pytest.mark.parametrize("setting", [s for s in SETTINGS if not s.switch], ids=lambda s: s.name)
def test_every_setting_s_bad_value_fix_differs_from_the_value(setting):
    checked = 0
    for bad in CANDIDATES:
        for flags, environ in (({setting.name: bad}, {}), ({}, {setting.env: bad})):
            try:
                resolve_config(flags, environ)
            except GaudiClusterError as error:
                checked += 1
                assert not repeated(str(error)), str(error)
    if setting.parse.__name__ != "text":  # free text refuses only blanks, which the env layer drops
        assert checked, f"no candidate value is refused by {setting.name}"

"""Fixtures for `gaudi-cluster aws`: a moto server (EC2, SSM, IAM, Service Quotas) on a loopback port,
boto3 pointed at it through AWS_ENDPOINT_URL with dummy credentials, and a cluster key.

moto 5.2.5 lacks a few things AWS has; the session fixture adds them to the emulator's own tables (the
code under test runs unchanged): the dl1.24xlarge instance type and its zones, the Habana AMIs, the DL
vCPU quota (L-6E869C2A), DescribePlacementGroups answering "none" (these tests run with
--placement-group none; placement groups themselves are checked with botocore's Stubber), and consoles:
GetConsoleOutput answers what a booted node prints (its ssh host keys, then "keys received"), or what a
test sets for an instance by its Name tag.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.aws.dl1_facts import DL1, DL1_INSTANCE_TYPE, DL1_ZONES, moto_amis

ROOT = Path(__file__).resolve().parents[2]

REGION = "us-east-1"
DL_QUOTA = "L-6E869C2A"
# What the emulated account's DL vCPU quota is; a test lowers it to see `up` refuse.
QUOTAS: dict[str, float] = {}
DEFAULT_DL_QUOTA = 384.0
# What an instance prints on its console, by Name tag, when a test says so; the host keys a booted
# instance prints otherwise (made up once per instance id).
CONSOLES: dict[str, str] = {}
HOST_KEYS: dict[str, str] = {}


def made_up_host_key(kind: str = "ssh-ed25519") -> str:
    """A well-formed ssh public key line of random bytes: the blob holds the type's fields (the type
    itself, then the key: ed25519's 32 bytes, or an ECDSA curve name and point)."""
    fields = [kind.encode()]
    fields += [os.urandom(32)] if kind == "ssh-ed25519" else [kind.rsplit("-", 1)[1].encode(), os.urandom(65)]
    blob = b"".join(len(field).to_bytes(4, "big") + field for field in fields)
    return f"{kind} {base64.b64encode(blob).decode()}"


def booted_console(host_key: str, keyed: bool = True) -> str:
    """A DL1 first boot as cloud-init prints it on Ubuntu, then our node's line once it has its keys."""
    from gaudi_cluster.aws.userdata import HOST_KEYS_BEGIN, HOST_KEYS_END, KEYS_RECEIVED

    lines = [
        "[    0.000000] Linux version 5.15.0-1051-aws (buildd@lcy02-amd64-008) #56~20.04.1-Ubuntu",
        "[   14.201337] cloud-init[1042]: Cloud-init v. 23.1.2 running 'modules:config'",
        "ci-info: no authorized SSH keys fingerprints found for user ubuntu.",
        HOST_KEYS_BEGIN,
        f"{made_up_host_key('ecdsa-sha2-nistp256')} root@ip-172-31-0-10",
        f"{host_key} root@ip-172-31-0-10",
        HOST_KEYS_END,
        "[   15.702114] cloud-init[1042]: Cloud-init v. 23.1.2 finished",
    ]
    if keyed:
        lines.append(KEYS_RECEIVED)
    return "\n".join(lines) + "\n"


def _teach_moto(amis_path: Path) -> None:
    from moto.core.responses import ActionResult
    from moto.core.utils import utcnow
    from moto.ec2.models import amis, instance_types
    from moto.ec2.responses import EC2Response
    from moto.ec2.utils import Base64EncodedString
    from moto.servicequotas.exceptions import NoSuchResource
    from moto.servicequotas.models import ServiceQuotasBackend

    amis.AMIS[:] = json.loads(amis_path.read_text())
    instance_types.INSTANCE_TYPES[DL1] = DL1_INSTANCE_TYPE
    if not any(t.name == DL1 for t in instance_types.InstanceTypeBackend.instance_types):
        instance_types.InstanceTypeBackend.instance_types.append(instance_types.InstanceType(DL1))
    offerings = instance_types.INSTANCE_TYPE_OFFERINGS
    offerings["availability-zone"][REGION] += [
        {"InstanceType": DL1, "Location": zone, "LocationType": "availability-zone"} for zone in DL1_ZONES
    ]
    offerings["region"][REGION] += [{"InstanceType": DL1, "Location": REGION, "LocationType": "region"}]

    original = ServiceQuotasBackend.get_service_quota

    def get_service_quota(self: Any, service_code: str, quota_code: str) -> dict[str, Any]:
        if service_code == "ec2" and quota_code in QUOTAS:
            return {
                "ServiceCode": "ec2",
                "QuotaCode": quota_code,
                "QuotaName": "Running On-Demand DL instances",
                "Value": QUOTAS[quota_code],
                "Unit": "None",
                "Adjustable": True,
                "GlobalQuota": False,
            }
        if service_code == "ec2":
            raise NoSuchResource
        return original(self, service_code, quota_code)

    ServiceQuotasBackend.get_service_quota = get_service_quota  # type: ignore[method-assign]

    def describe_placement_groups(self: Any) -> ActionResult:
        return ActionResult({"PlacementGroups": []})

    EC2Response.describe_placement_groups = describe_placement_groups  # type: ignore[attr-defined]

    def get_console_output(self: Any) -> ActionResult:
        instance = self.ec2_backend.get_instance(self._get_param("InstanceId"))
        name = self.ec2_backend.tags.get(instance.id, {}).get("Name")
        if name in CONSOLES:
            text = CONSOLES[name]
        else:
            text = booted_console(HOST_KEYS.setdefault(instance.id, made_up_host_key()))
        output = Base64EncodedString.from_raw_string(text)
        return ActionResult({"InstanceId": instance.id, "Timestamp": utcnow(), "Output": output})

    EC2Response.get_console_output = get_console_output  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    amis_path = tmp_path_factory.mktemp("moto") / "amis.json"
    amis_path.write_text(json.dumps(moto_amis()))
    with pytest.MonkeyPatch.context() as patch:
        # Only our AMIs: moto then skips loading thousands of default ones per region.
        patch.setenv("MOTO_AMIS_PATH", str(amis_path))
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            _teach_moto(amis_path)
            host, port = server.get_host_and_port()
            yield f"http://{host}:{port}"
        finally:
            server.stop()


# Parsed service models shared by every boto3 session of the test run (a real CLI run parses them once
# per process; here dozens of commands run in one process).
_MODELS: dict[str, Any] = {}


def shared_models_session(region: str) -> Any:
    import boto3
    import botocore.loaders
    import botocore.session

    core = botocore.session.get_session()
    core.register_component("data_loader", _MODELS.setdefault("loader", botocore.loaders.create_loader()))
    return boto3.session.Session(region_name=region, botocore_session=core)


_CLIENTS: dict[tuple[str, str], Any] = {}


@dataclass
class Aws:
    """The emulated account as a test sees it: clients for assertions, and the paths the CLI uses."""

    endpoint: str
    tmp: Path
    keys_dir: Path
    ssh_log: Path

    def client(self, service: str) -> Any:
        key = (self.endpoint, service)
        if key not in _CLIENTS:
            _CLIENTS[key] = shared_models_session(REGION).client(service, endpoint_url=self.endpoint)
        return _CLIENTS[key]

    @property
    def private_key(self) -> bytes:
        return (self.keys_dir / "id_ed25519").read_bytes()

    def impostor_at(self, host: str) -> None:
        """The ssh config's `host` answers with a host key other than its pinned one."""
        with (self.ssh_log / "impostors").open("a") as listed:
            listed.write(f"{host}\n")

    def sent_to(self) -> list[tuple[str, bytes | None]]:
        """Each ssh call's host, and what it received on stdin (None: nothing was read)."""
        calls = sorted(self.ssh_log.glob("argv.*"), key=lambda p: int(p.suffix[1:]))
        stdin = [self.ssh_log / p.name.replace("argv", "stdin") for p in calls]
        return [
            (p.read_text().splitlines()[2], s.read_bytes() if s.exists() else None)
            for p, s in zip(calls, stdin, strict=True)
        ]

    def console(self, name: str, text: str) -> None:
        """What the instance tagged Name=`name` prints on its console from now on."""
        CONSOLES[name] = text

    def host_keys_printed(self, instance_id: str) -> str:
        """The made-up ed25519 host key the instance printed on its (default) console."""
        return HOST_KEYS[instance_id]

    def set_dl_quota(self, vcpus: float) -> None:
        QUOTAS[DL_QUOTA] = vcpus


@pytest.fixture(scope="session")
def cluster_keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("keys") / ".keys"
    # `make keys` itself: the client key pair and the host CA (and master/, which aws up does not read).
    subprocess.run([str(ROOT / "scripts" / "make-keys.sh"), str(directory)], check=True, capture_output=True)
    return directory


FAKE_SSH = """#!/bin/bash
# Records each ssh call (argv, one per line; stdin) instead of connecting. A host named in
# $log/impostors answers with a host key that is not the pinned one: refused as OpenSSH refuses it,
# before anything is read from stdin.
log={log}
n=$(find "$log" -name 'argv.*' | wc -l)
printf '%s\\n' "$@" >"$log/argv.$n"
if grep -qx -- "$3" "$log/impostors" 2>/dev/null; then
	echo "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @" >&2
	echo "Host key verification failed." >&2
	exit 255
fi
cat >"$log/stdin.$n"
"""


@pytest.fixture
def aws(moto_endpoint: str, cluster_keys: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Aws:
    """A fresh emulated account for one test, with the CLI's environment pointed at it."""
    from gaudi_cluster.aws import calls, ec2, keys

    urllib.request.urlopen(urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST")).read()
    QUOTAS.clear()
    QUOTAS[DL_QUOTA] = DEFAULT_DL_QUOTA
    CONSOLES.clear()
    empty = tmp_path / "empty-aws-config"
    empty.write_text("")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    ssh_log = tmp_path / "ssh-calls"
    ssh_log.mkdir()
    fake_ssh = tmp_path / "fake-ssh"
    fake_ssh.write_text(FAKE_SSH.format(log=ssh_log))
    fake_ssh.chmod(0o755)
    monkeypatch.setenv("GAUDI_CLUSTER_AWS_SSH", str(fake_ssh))
    # moto answers at once; the real intervals would only slow the tests down.
    monkeypatch.setattr(ec2, "new_session", shared_models_session)
    monkeypatch.setattr(calls, "POLL_INTERVAL_S", 0.01)
    monkeypatch.setattr(keys, "RETRY_INTERVAL_S", 0.01)
    state = Aws(moto_endpoint, tmp_path, cluster_keys, ssh_log)
    state.client("ec2").import_key_pair(
        KeyName="me", PublicKeyMaterial=(cluster_keys / "id_ed25519.pub").read_bytes()
    )
    state.client("iam").create_instance_profile(InstanceProfileName="gaudi-node")
    return state


@dataclass
class Run:
    code: int
    out: str
    err: str


@pytest.fixture
def run(capsys):
    def invoke(*argv: str) -> Run:
        from gaudi_cluster.aws import cli

        code = cli.main(list(argv))
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return invoke

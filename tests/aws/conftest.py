"""Fixtures for `gaudi-cluster aws`: a moto server (EC2, SSM, IAM, Service Quotas) on a loopback port,
boto3 pointed at it through AWS_ENDPOINT_URL with dummy credentials, and a cluster key.

moto 5.2.5 lacks a few things AWS has; the session fixture adds them to the emulator's own tables (the
code under test runs unchanged): the dl1.24xlarge instance type and its zones, the Habana AMIs, the DL
vCPU quota (L-6E869C2A), and DescribePlacementGroups answering "none" (these tests run with
--placement-group none; placement groups themselves are checked with botocore's Stubber).
"""

from __future__ import annotations

import json
import logging
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.aws.dl1_facts import DL1, DL1_INSTANCE_TYPE, DL1_ZONES, moto_amis

REGION = "us-east-1"
DL_QUOTA = "L-6E869C2A"
# What the emulated account's DL vCPU quota is; a test lowers it to see `up` refuse.
QUOTAS: dict[str, float] = {}
DEFAULT_DL_QUOTA = 384.0


def _teach_moto(amis_path: Path) -> None:
    from moto.core.responses import ActionResult
    from moto.ec2.models import amis, instance_types
    from moto.ec2.responses import EC2Response
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

    def set_dl_quota(self, vcpus: float) -> None:
        QUOTAS[DL_QUOTA] = vcpus


@pytest.fixture(scope="session")
def cluster_keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("keys") / ".keys"
    directory.mkdir(mode=0o700)
    subprocess.run(
        [
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "gaudi-cluster",
            "-f",
            str(directory / "id_ed25519"),
        ],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return directory


FAKE_SSH = """#!/bin/bash
# Records each ssh call (argv, one per line; stdin) instead of connecting.
log={log}
n=$(find "$log" -name 'argv.*' | wc -l)
printf '%s\\n' "$@" >"$log/argv.$n"
cat >"$log/stdin.$n"
"""


@pytest.fixture
def aws(moto_endpoint: str, cluster_keys: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Aws:
    """A fresh emulated account for one test, with the CLI's environment pointed at it."""
    from gaudi_cluster.aws import calls, ec2, keys

    urllib.request.urlopen(urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST")).read()
    QUOTAS.clear()
    QUOTAS[DL_QUOTA] = DEFAULT_DL_QUOTA
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

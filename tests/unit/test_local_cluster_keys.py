"""What each container of the local cluster (make demo, the cluster tests, the benchmarks) mounts of make
keys' directory: the master master/, every worker its own nodes/<container name>/, certified for its
name and for the DNS alias the master finds the workers by. No two containers mount the same host key
(make keys' old nodes/any was one key on every worker). No Docker: only the key directories."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from gaudi_cluster_dev.localcluster import KEY_MOUNT, WORKER_ALIAS, LocalCluster

from tests.support.keys import principals

ROOT = Path(__file__).resolve().parents[2]
HOST_KEY = "ssh_host_ed25519_key"


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    directory = tmp_path / "keys"
    subprocess.run([str(ROOT / "scripts" / "make-keys.sh"), str(directory)], check=True, capture_output=True)
    return directory


def test_every_worker_mounts_a_host_key_of_its_own(keys):
    cluster = LocalCluster(image="img", key_dir=keys, workers=3, name="gc-test")
    mounted = {name: cluster.keys_for("worker", name) for name in cluster.worker_names}
    mounted[cluster.master] = cluster.keys_for("master")
    assert mounted[cluster.master] == keys / "master"
    for name in cluster.worker_names:
        assert mounted[name] == keys / "nodes" / name
        assert principals(mounted[name] / f"{HOST_KEY}-cert.pub") == [name, WORKER_ALIAS]
        assert not (mounted[name] / "id_ed25519").exists()  # the client key is the master's alone
    host_keys = [(part / HOST_KEY).read_bytes() for part in mounted.values()]
    assert len(set(host_keys)) == len(host_keys) == 4
    # Started again (a second cluster of the session, a restart): the same key, not a new one.
    assert (cluster.keys_for("worker", cluster.worker(1)) / HOST_KEY).read_bytes() == host_keys[0]
    args = cluster._common_args(cluster.worker(2), "worker-2", "worker")
    assert f"{(keys / 'nodes' / cluster.worker(2)).resolve()}:{KEY_MOUNT}:ro" in args


def test_a_worker_without_its_own_key_is_refused_without_the_ca(tmp_path, keys):
    copy = tmp_path / "copy"  # master/ and an old nodes/any, without the CA to make a worker's own
    shutil.copytree(keys / "master", copy / "master")
    (copy / "nodes" / "any").mkdir(parents=True)  # make keys' old shared part: never a fallback
    cluster = LocalCluster(image="img", key_dir=copy, workers=1, name="gc-test")
    with pytest.raises(
        RuntimeError, match=r"no host key of its own for worker gc-test-worker-1 .*; fix: make keys"
    ):
        cluster.keys_for("worker", cluster.worker(1))

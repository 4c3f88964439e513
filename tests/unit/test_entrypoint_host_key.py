"""The entrypoint serves a host key from the key directory only when it is this node's own: certified by
the cluster's host CA, and on a worker for the names the node is reached by. A layout that gives several
nodes one key (an uncertified key from before the CA, make keys' old nodes/any certified for any name)
is refused in one line with the fix, before sshd starts. Run on the host: the entrypoint sourced, its
/etc/ssh and /root/.ssh moved into a temporary directory."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "entrypoint" / "entrypoint.sh"
HOST_KEY = "ssh_host_ed25519_key"
PREPARE = 'source "$1"; ep_validate_keys "$2"; ep_install_keys; ep_host_keys'


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("k") / "keys"
    subprocess.run(
        [str(ROOT / "scripts" / "make-keys.sh"), str(directory), "node-1"], check=True, capture_output=True
    )
    return directory


def prepare(tmp_path: Path, key_dir: Path, role: str) -> subprocess.CompletedProcess[str]:
    etc, root = tmp_path / "etc-ssh", tmp_path / "root-ssh"
    env = {
        "PATH": os.environ["PATH"],
        "GAUDI_CLUSTER_SSH_DIR": str(key_dir),
        "EP_ETC_SSH": str(etc),
        "EP_ROOT_SSH": str(root),
    }
    return subprocess.run(
        ["bash", "-c", PREPARE, "test", str(ENTRYPOINT), role],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def copy(source: Path, target: Path, leave_out: tuple[str, ...] = ()) -> Path:
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(*leave_out))
    return target


@pytest.mark.parametrize(("part", "role"), [("nodes/node-1", "worker"), ("master", "master")])
def test_a_nodes_own_certified_key_is_served_and_the_ca_pinned(tmp_path, keys, part, role):
    done = prepare(tmp_path, keys / part, role)
    assert done.returncode == 0, done.stderr
    etc = tmp_path / "etc-ssh"
    assert (etc / HOST_KEY).read_bytes() == (keys / part / HOST_KEY).read_bytes()
    assert (etc / f"{HOST_KEY}-cert.pub").read_bytes() == (keys / part / f"{HOST_KEY}-cert.pub").read_bytes()
    assert (etc / "sshd_config.d" / "20-gaudi-cluster-cert.conf").read_text().startswith("HostCertificate ")
    ca = " ".join((keys / "ca" / "host_ca.pub").read_text().split()[:2])
    assert (etc / "ssh_known_hosts").read_text() == f"@cert-authority * {ca}\n"


def test_without_a_host_key_the_node_makes_its_own(tmp_path, keys):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(keys / "id_ed25519.pub", bare)
    done = prepare(tmp_path, bare, "worker")
    assert done.returncode == 0, done.stderr
    made = tmp_path / "etc-ssh" / HOST_KEY
    assert made.is_file() and made.read_bytes() not in {p.read_bytes() for p in keys.rglob(HOST_KEY)}


def test_an_uncertified_key_from_before_the_ca_is_refused(tmp_path, keys):
    old = copy(keys / "nodes" / "node-1", tmp_path / "old", (f"{HOST_KEY}-cert.pub", "host_ca.pub"))
    done = prepare(tmp_path, old, "worker")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1
    assert "has no certificate of the cluster's host CA" in done.stderr
    assert "the same host key on every node" in done.stderr and "fix: make keys NAMES=" in done.stderr
    assert not (tmp_path / "etc-ssh" / HOST_KEY).exists()


def test_a_worker_certificate_valid_for_any_name_is_refused(tmp_path, keys):
    # What make keys' nodes/any was: a host key certified for any name, mounted on every unnamed worker.
    any_name = copy(keys / "master", tmp_path / "any", ("id_ed25519",))
    done = prepare(tmp_path, any_name, "worker")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1
    assert "is valid for any name" in done.stderr and "fix: make keys NAMES=" in done.stderr
    assert "PRIVATE KEY" not in done.stdout + done.stderr

"""scripts/make-keys.sh: every host key it makes is one node's own. No directory serves several nodes
(no shared host key, no worker certificate valid for any name), whatever NAMES holds, empty included;
an older layout that did is named with the fix."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.keys import principals

ROOT = Path(__file__).resolve().parents[2]
MAKE_KEYS = ROOT / "scripts" / "make-keys.sh"
HOST_KEY = "ssh_host_ed25519_key"


def make_keys(directory: Path, *names: str, env_names: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(MAKE_KEYS), str(directory), *names],
        env={"PATH": "/usr/bin:/bin", "NAMES": env_names},
        capture_output=True,
        text=True,
        check=True,
    )


def host_keys(directory: Path) -> dict[Path, bytes]:
    """Every private host key under the directory (any name an ssh host key has), by path."""
    found = [path for path in directory.rglob("*") if path.is_file() and "ca" not in path.parts]
    return {path: path.read_bytes() for path in found if "host" in path.name and path.suffix != ".pub"}


def certificate(path: Path) -> str:
    shown = subprocess.run(["ssh-keygen", "-L", "-f", str(path)], capture_output=True, text=True, check=True)
    return shown.stdout


@pytest.mark.parametrize(
    ("names", "env_names", "nodes"),
    [
        pytest.param((), "", set(), id="no-names"),
        pytest.param(("node-1", "node-2,10.0.0.2"), "", {"node-1", "node-2"}, id="arguments"),
        pytest.param((), "node-1 node-2 node-3", {"node-1", "node-2", "node-3"}, id="NAMES"),
    ],
)
def test_no_two_directories_hold_the_same_host_key(tmp_path, names, env_names, nodes):
    keys = tmp_path / "keys"
    make_keys(keys, *names, env_names=env_names)
    found = host_keys(keys)
    # The master's and one per named node, nothing else: no shared key beside them, no nodes/any.
    assert set(found) == {keys / "master" / HOST_KEY, *(keys / "nodes" / n / HOST_KEY for n in nodes)}
    assert len(set(found.values())) == len(found)
    assert {p.name for p in (keys / "nodes").iterdir()} == nodes
    assert not (keys / HOST_KEY).exists() and not (keys / "nodes" / "any").exists()


def test_a_worker_certificate_names_its_node_and_a_second_run_keeps_the_keys(tmp_path):
    keys = tmp_path / "keys"
    make_keys(keys, "node-1", "node-2,10.0.0.2,worker")
    first = host_keys(keys)
    assert principals(keys / "nodes" / "node-1" / f"{HOST_KEY}-cert.pub") == ["node-1"]
    assert principals(keys / "nodes" / "node-2" / f"{HOST_KEY}-cert.pub") == ["node-2", "10.0.0.2", "worker"]
    # Again with other addresses: the same keys, certificates for the new principals, nothing left over.
    make_keys(keys, "node-2,10.0.0.9")
    assert host_keys(keys) == first
    assert principals(keys / "nodes" / "node-2" / f"{HOST_KEY}-cert.pub") == ["node-2", "10.0.0.9"]
    assert sorted(p.name for p in (keys / "nodes" / "node-2").iterdir()) == sorted(
        ["host_ca.pub", "id_ed25519.pub", HOST_KEY, f"{HOST_KEY}.pub", f"{HOST_KEY}-cert.pub"]
    )


def test_the_layouts_that_gave_every_node_one_key_are_named_with_the_fix(tmp_path):
    keys = tmp_path / "keys"
    make_keys(keys)
    (keys / "nodes" / "any").mkdir()
    (keys / HOST_KEY).write_text("old shared key\n")
    done = make_keys(keys)
    for old in (keys / "nodes" / "any", keys / HOST_KEY):
        assert f"make-keys: {old} (one host key on every node) is no longer used" in done.stderr
    assert "fix: make keys NAMES=" in done.stderr
    assert "PRIVATE KEY" not in done.stdout + done.stderr


def test_no_names_says_the_workers_need_them(tmp_path):
    done = make_keys(tmp_path / "keys")
    assert "no worker has keys yet" in done.stderr and 'fix: make keys NAMES="node-1 node-2"' in done.stderr

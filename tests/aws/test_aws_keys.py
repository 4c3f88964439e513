"""Delivering the cluster key over ssh: on stdin only, retried while a node boots, never logged."""

from __future__ import annotations

import logging
import shutil
import subprocess

import pytest
from gaudi_cluster.aws import keys
from gaudi_cluster.aws.keys import ClusterKey, deliver_over_ssh, read_cluster_key, write_ssh_config
from gaudi_cluster.errors import ClusterNotReady, ConfigError, GaudiClusterError

from tests.support.keys import pem_label

KEY = ClusterKey(
    private=b"stand-in for the cluster key c2VjcmV0\n",  # what is delivered is opaque bytes
    public="ssh-ed25519 AAAA",
)


class FakeSsh:
    """Answers ssh calls from a script of exit codes; records argv and stdin."""

    def __init__(self, codes: list[int]) -> None:
        self.codes = codes
        self.calls: list[tuple[list[str], bytes]] = []

    def __call__(self, argv, input, capture_output, check):
        self.calls.append((argv, input))
        code = self.codes.pop(0)
        stderr = (
            b"ssh: connect to host 198.51.100.7 port 22: Connection refused\n"
            if code == 255
            else b"sudo: a password is required\n"
        )
        return subprocess.CompletedProcess(argv, code, b"", stderr if code else b"")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_the_key_travels_on_stdin_master_first_and_is_never_logged(tmp_path, caplog):
    config = write_ssh_config(tmp_path, "ubuntu", None, "198.51.100.7", {"node-1": "10.0.0.11"})
    ssh = FakeSsh([255, 0, 0])
    clock = Clock()
    with caplog.at_level(logging.DEBUG):
        deliver_over_ssh(
            ["master", "node-1"], KEY, config, deadline=60, run=ssh, clock=clock, sleep=clock.sleep
        )
    assert [argv[3] for argv, _ in ssh.calls] == ["master", "master", "node-1"]
    assert all(stdin == KEY.private for _, stdin in ssh.calls)
    assert all(b"c2VjcmV0" not in " ".join(argv).encode() for argv, _ in ssh.calls)
    assert "c2VjcmV0" not in caplog.text and "PRIVATE" not in caplog.text
    assert "cluster key delivered to node-1 over ssh" in caplog.text


def test_ssh_that_never_connects_fails_at_the_deadline(tmp_path):
    config = write_ssh_config(tmp_path, "ubuntu", None, "198.51.100.7", {})
    clock = Clock()
    with pytest.raises(
        ClusterNotReady,
        match=r"master did not accept ssh before the deadline \(ssh: connect to host .* refused\); "
        r"fix: check --ssh-cidr",
    ):
        deliver_over_ssh(
            ["master"], KEY, config, deadline=20, run=FakeSsh([255] * 10), clock=clock, sleep=clock.sleep
        )


def test_a_remote_failure_is_not_retried(tmp_path):
    config = write_ssh_config(tmp_path, "ubuntu", None, "198.51.100.7", {})
    ssh = FakeSsh([1])
    with pytest.raises(
        GaudiClusterError,
        match="writing the cluster key on master failed: sudo: a password is required; fix:",
    ):
        deliver_over_ssh(["master"], KEY, config, deadline=60, run=ssh, clock=Clock(), sleep=lambda _: None)
    assert len(ssh.calls) == 1


def test_workers_are_reached_through_the_master_with_per_cluster_host_trust(tmp_path):
    identity = tmp_path / "me.pem"
    config = write_ssh_config(
        tmp_path / "state", "ubuntu", identity, "198.51.100.7", {"node-1": "10.0.0.11"}, "ssh"
    )
    text = config.read_text()
    assert "Host master\n  HostName 198.51.100.7\n" in text
    assert "Host node-1\n  HostName 10.0.0.11\n  ProxyCommand ssh -F " in text and "-W %h:%p master" in text
    assert text.count("StrictHostKeyChecking accept-new") == 2
    assert f"UserKnownHostsFile {tmp_path / 'state' / 'known_hosts'}" in text
    assert f"IdentityFile {identity}" in text
    assert config.stat().st_mode & 0o777 == 0o600


def test_the_remote_command_writes_the_key_0600_and_the_public_half_last(tmp_path):
    # Run the remote side locally (without sudo) against a scratch directory.
    if shutil.which("ssh-keygen") is None:
        pytest.fail("ssh-keygen is needed; fix: apt-get install -y openssh-client")
    source = tmp_path / "src"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(source)], check=True)
    target = tmp_path / "keys"
    command = keys.INSTALL_KEY.replace("sudo ", "", 1).replace(keys.NODE_KEYS_DIR, str(target))
    subprocess.run(["bash", "-c", command], input=source.read_bytes(), check=True)
    assert (target / "id_ed25519").read_bytes() == source.read_bytes()
    assert (target / "id_ed25519").stat().st_mode & 0o777 == 0o600
    assert (target / "id_ed25519.pub").read_text().split()[:2] == source.with_suffix(
        ".pub"
    ).read_text().split()[:2]


def test_reading_the_cluster_key(tmp_path, cluster_keys):
    assert pem_label(read_cluster_key(cluster_keys).private) == "OPENSSH PRIVATE KEY"
    with pytest.raises(ConfigError, match=r"no cluster key in .*; fix: make keys"):
        read_cluster_key(tmp_path)
    loose = tmp_path / "loose"
    shutil.copytree(cluster_keys, loose)
    (loose / "id_ed25519").chmod(0o644)
    with pytest.raises(ConfigError, match=r"readable by others \(mode 0644\); fix: chmod 600"):
        read_cluster_key(loose)

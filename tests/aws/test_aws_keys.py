"""Delivering the secret keys over ssh: on stdin only, the client key to the master alone, each node a
host key of its own certified by the cluster's host CA, to host keys pinned from each instance's console
and checked strictly, retried while a node boots, never logged."""

from __future__ import annotations

import io
import logging
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from gaudi_cluster.aws import keys
from gaudi_cluster.aws.keys import (
    ClusterKeys,
    Delivery,
    SshHost,
    deliver_over_ssh,
    read_cluster_keys,
    read_pins,
    write_pins,
    write_ssh_config,
)
from gaudi_cluster.errors import ClusterNotReady, ConfigError, GaudiClusterError

from tests.aws.conftest import made_up_host_key
from tests.support.keys import pem_label, principals

KEYS = ClusterKeys(
    client_private=b"stand-in for the client key c2VjcmV0\n",  # what is delivered is opaque bytes
    client_public="ssh-ed25519 AAAA client",
    ca_public="ssh-ed25519 CCCC host-ca",
    ca_key=Path("/nowhere/ca/host_ca"),
)
# A node's own host key and certificate, as node_host_key makes them (stand-ins: opaque bytes here).
MASTER_HOST = {
    "ssh_host_ed25519_key": b"stand-in for the master's host key aG9zdA==\n",
    "ssh_host_ed25519_key.pub": b"ssh-ed25519 BBBB master\n",
    "ssh_host_ed25519_key-cert.pub": b"ssh-ed25519-cert-v01@openssh.com MMMM master\n",
}
WORKER_HOST = {
    "ssh_host_ed25519_key": b"stand-in for node-1's host key aG9zdA==\n",
    "ssh_host_ed25519_key.pub": b"ssh-ed25519 DDDD node-1\n",
    "ssh_host_ed25519_key-cert.pub": b"ssh-ed25519-cert-v01@openssh.com NNNN node-1\n",
}
MASTER = SshHost("master", "198.51.100.7", "i-0000000000000000a")
WORKER = SshHost("node-1", "10.0.0.11", "i-0000000000000000b")


class FakeSsh:
    """Answers ssh calls from a script of (exit code, stderr); records argv and stdin."""

    def __init__(self, answers: list[tuple[int, bytes]]) -> None:
        self.answers = answers
        self.calls: list[tuple[list[str], bytes]] = []

    def __call__(self, argv, input, capture_output, check):
        self.calls.append((argv, input))
        code, stderr = self.answers.pop(0)
        return subprocess.CompletedProcess(argv, code, b"", stderr)


REFUSED = (255, b"ssh: connect to host 198.51.100.7 port 22: Connection refused\n")
OK = (0, b"")
CHANGED = (
    255,
    b"@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
    b"@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n"
    b"Host key for i-0000000000000000b has changed and you have requested strict checking.\n"
    b"Host key verification failed.\n",
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def deliveries() -> list[Delivery]:
    return [
        Delivery(MASTER, {"id_ed25519": KEYS.client_private, **MASTER_HOST}),
        Delivery(WORKER, dict(WORKER_HOST), ("id_ed25519",)),
    ]


def unpack(payload: bytes) -> dict[str, tuple[bytes, int]]:
    with tarfile.open(fileobj=io.BytesIO(payload)) as tar:
        return {m.name: (tar.extractfile(m).read(), m.mode) for m in tar.getmembers()}


def test_the_master_alone_gets_the_client_key_on_stdin_and_nothing_is_logged(tmp_path, caplog):
    config = write_ssh_config(tmp_path, "ubuntu", None, MASTER, [WORKER])
    ssh = FakeSsh([REFUSED, OK, OK])
    clock = Clock()
    with caplog.at_level(logging.DEBUG):
        deliver_over_ssh(deliveries(), config, deadline=60, run=ssh, clock=clock, sleep=clock.sleep)
    assert [argv[3] for argv, _ in ssh.calls] == ["master", "master", "node-1"]
    master, worker = unpack(ssh.calls[1][1]), unpack(ssh.calls[2][1])
    assert master == {
        "id_ed25519": (KEYS.client_private, 0o600),
        **{name: (data, 0o600) for name, data in MASTER_HOST.items()},
    }
    assert worker == {name: (data, 0o600) for name, data in WORKER_HOST.items()}
    # A worker of an older cluster held the client key: it is removed there.
    assert 'rm -f "$d/id_ed25519"' in ssh.calls[2][0][4] and "rm -f" not in ssh.calls[1][0][4]
    for argv, _ in ssh.calls:
        assert b"c2VjcmV0" not in " ".join(argv).encode() and b"aG9zdA" not in " ".join(argv).encode()
    assert "c2VjcmV0" not in caplog.text and "aG9zdA" not in caplog.text and "PRIVATE" not in caplog.text
    assert (
        "keys delivered to node-1 (i-0000000000000000b) over ssh: ssh_host_ed25519_key, "
        "ssh_host_ed25519_key-cert.pub, ssh_host_ed25519_key.pub" in caplog.text
    )


def test_a_host_key_other_than_the_pinned_one_is_refused_named_and_not_retried(tmp_path):
    config = write_ssh_config(tmp_path, "ubuntu", None, MASTER, [WORKER])
    ssh = FakeSsh([OK, CHANGED])
    with pytest.raises(GaudiClusterError) as refused:
        deliver_over_ssh(deliveries(), config, deadline=60, run=ssh, clock=Clock(), sleep=lambda _: None)
    message = str(refused.value)
    assert message.startswith(
        "node-1 (i-0000000000000000b) at 10.0.0.11 answered ssh with a host key its console did not print; "
        "nothing was sent to it; fix: "
    )
    assert "aws ec2 get-console-output --latest --output text --instance-id i-0000000000000000b" in message
    assert len(ssh.calls) == 2  # no retry: a wrong key is not a node still booting
    assert not isinstance(refused.value, ClusterNotReady)


def test_ssh_that_never_connects_fails_at_the_deadline(tmp_path):
    config = write_ssh_config(tmp_path, "ubuntu", None, MASTER, [])
    clock = Clock()
    with pytest.raises(
        ClusterNotReady,
        match=r"master did not accept ssh before the deadline \(ssh: connect to host .* refused\); "
        r"fix: check --ssh-cidr",
    ):
        deliver_over_ssh(
            deliveries()[:1], config, deadline=20, run=FakeSsh([REFUSED] * 10), clock=clock, sleep=clock.sleep
        )


def test_a_remote_failure_is_not_retried(tmp_path):
    config = write_ssh_config(tmp_path, "ubuntu", None, MASTER, [])
    ssh = FakeSsh([(1, b"sudo: a password is required\n")])
    with pytest.raises(
        GaudiClusterError, match="writing the keys on master failed: sudo: a password is required; fix:"
    ):
        deliver_over_ssh(deliveries()[:1], config, deadline=60, run=ssh, clock=Clock(), sleep=lambda _: None)
    assert len(ssh.calls) == 1


def test_the_ssh_config_pins_each_instance_and_checks_strictly(tmp_path):
    identity = tmp_path / "me.pem"
    config = write_ssh_config(tmp_path / "state", "ubuntu", identity, MASTER, [WORKER], "ssh")
    text = config.read_text()
    assert "Host master\n  HostName 198.51.100.7\n  HostKeyAlias i-0000000000000000a\n" in text
    assert (
        "Host node-1\n  HostName 10.0.0.11\n  HostKeyAlias i-0000000000000000b\n  ProxyCommand ssh -F "
        in text
    )
    assert "-W %h:%p master" in text
    assert "accept-new" not in text and text.count("StrictHostKeyChecking yes") == 2
    assert config.stat().st_mode & 0o777 == 0o600
    # What OpenSSH itself makes of it (ssh -G prints the options it would use; it connects nowhere).
    known_hosts = tmp_path / "state" / "known_hosts"
    for host, alias in (("master", MASTER.instance_id), ("node-1", WORKER.instance_id)):
        shown = subprocess.run(
            ["ssh", "-G", "-F", str(config), host], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        options = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in shown if " " in line}
        assert options["stricthostkeychecking"] == "true", host
        assert options["hostkeyalias"] == alias, host
        assert options["userknownhostsfile"] == str(known_hosts), host
        assert options["updatehostkeys"] == "false" and options["checkhostip"] == "no", host
        assert options["identityfile"] == str(identity), host


def test_pins_round_trip_and_openssh_finds_them(tmp_path):
    key = made_up_host_key()
    known_hosts = tmp_path / "known_hosts"
    write_pins(known_hosts, {WORKER.instance_id: (key,), MASTER.instance_id: (made_up_host_key(),)})
    assert read_pins(known_hosts)[WORKER.instance_id] == (key,)
    assert known_hosts.stat().st_mode & 0o777 == 0o600
    found = subprocess.run(
        ["ssh-keygen", "-F", WORKER.instance_id, "-f", str(known_hosts)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert found.returncode == 0 and key in found.stdout


def test_the_remote_command_moves_each_file_in_whole_0600_the_waited_for_key_last(tmp_path):
    # Run the remote side locally (without sudo) against a scratch directory.
    target = tmp_path / "keys"
    target.mkdir()
    (target / "id_ed25519").write_bytes(b"a client key an older gaudi-cluster left on a worker\n")
    (target / "id_ed25519.pub").write_text("ssh-ed25519 AAAA client\n")
    command = keys.install_command(sorted(WORKER_HOST), ["id_ed25519"]).replace("sudo ", "", 1)
    command = command.replace(keys.NODE_KEYS_DIR, str(target))
    # The node's start script waits for the key: its certificate is in place before it.
    moves = [word for word in command.split() if word.startswith('"$s/')]
    assert moves[-1] == '"$s/ssh_host_ed25519_key"' and len(moves) == 3
    subprocess.run(["bash", "-c", command], input=keys.bundle(WORKER_HOST), check=True)
    assert sorted(p.name for p in target.iterdir()) == ["id_ed25519.pub", *sorted(WORKER_HOST)]
    assert (target / "ssh_host_ed25519_key").read_bytes() == WORKER_HOST["ssh_host_ed25519_key"]
    assert (target / "ssh_host_ed25519_key").stat().st_mode & 0o777 == 0o600


def test_reading_the_cluster_keys(tmp_path, cluster_keys):
    read = read_cluster_keys(cluster_keys)
    assert pem_label(read.client_private) == "OPENSSH PRIVATE KEY"
    assert read.ca_key == cluster_keys / "ca" / "host_ca"
    assert read.public_keys() == {
        "id_ed25519.pub": (cluster_keys / "id_ed25519.pub").read_text().strip(),
        "host_ca.pub": (cluster_keys / "ca" / "host_ca.pub").read_text().strip(),
    }
    assert read.public_keys(pin_ca=False) == {"id_ed25519.pub": read.client_public}
    assert "PRIVATE" not in repr(read)
    with pytest.raises(ConfigError, match=r"no cluster key in .*; fix: make keys"):
        read_cluster_keys(tmp_path)
    # A key directory from before the CA: its one host key was every node's; not used, refused.
    old = tmp_path / "old"
    shutil.copytree(cluster_keys, old)
    shutil.rmtree(old / "ca")
    (old / "ssh_host_ed25519_key").write_text("one key for every node\n")
    with pytest.raises(ConfigError, match=r"no host CA in .*/ca .*was every node's\); fix: make keys"):
        read_cluster_keys(old)
    loose = tmp_path / "loose"
    shutil.copytree(cluster_keys, loose)
    (loose / "ca" / "host_ca").chmod(0o644)
    with pytest.raises(ConfigError, match=r"host CA key .* is readable by others \(mode 0644\); fix: chmod"):
        read_cluster_keys(loose)


def test_every_node_gets_a_host_key_of_its_own_certified_for_its_name_and_address(tmp_path, cluster_keys):
    read = read_cluster_keys(cluster_keys)
    master = read.files_for("master", "master", ("master", "node-0", "10.0.0.10"))
    workers = [read.files_for("worker", f"node-{i}", (f"node-{i}", f"10.0.0.{10 + i}")) for i in (1, 2)]
    assert set(master) == {"id_ed25519", *WORKER_HOST} and master["id_ed25519"] == read.client_private
    assert all(set(files) == set(WORKER_HOST) for files in workers)
    host_keys = [files["ssh_host_ed25519_key"] for files in (master, *workers)]
    assert len(set(host_keys)) == 3 and all(pem_label(key) == "OPENSSH PRIVATE KEY" for key in host_keys)
    assert principals(master["ssh_host_ed25519_key-cert.pub"]) == ["master", "node-0", "10.0.0.10"]
    assert principals(workers[1]["ssh_host_ed25519_key-cert.pub"]) == ["node-2", "10.0.0.12"]
    # Signed by the cluster's CA, which the nodes pin (host_ca.pub in their user data).
    (tmp_path / "c-cert.pub").write_bytes(workers[0]["ssh_host_ed25519_key-cert.pub"])
    shown = subprocess.run(
        ["ssh-keygen", "-L", "-f", str(tmp_path / "c-cert.pub")], capture_output=True, text=True, check=True
    )
    fingerprint = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(cluster_keys / "ca" / "host_ca.pub")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[1]
    assert "host certificate" in shown.stdout and f"Signing CA: ED25519 {fingerprint}" in shown.stdout

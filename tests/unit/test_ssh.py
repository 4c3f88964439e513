"""The job's ssh client config, read back by the real ssh (`ssh -G`), and the failure explanations."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from gaudi_cluster.errors import ConfigError
from gaudi_cluster.nodes import ssh
from gaudi_cluster.nodes.ssh import (
    HOST_CA_NAME,
    HOST_KEY_NAME,
    KEX_ALGORITHMS,
    SshResult,
    cluster_trust,
    explain_ssh_failure,
    ssh_argv,
    write_ssh_config,
)


def effective(config: Path, host: str = "node-1") -> dict[str, str]:
    out = subprocess.run(["ssh", "-G", "-F", str(config), host], check=True, capture_output=True, text=True)
    return dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)


def test_job_ssh_config_as_ssh_reads_it(tmp_path: Path):
    key = tmp_path / "id_ed25519"
    key.write_text("not read by ssh -G")
    config = effective(write_ssh_config(tmp_path, 4022, key))
    assert config["port"] == "4022"
    assert config["user"] == "root"
    assert config["batchmode"] == "yes"
    assert config["stricthostkeychecking"] == "accept-new"
    assert config["userknownhostsfile"] == str(tmp_path / "known_hosts")
    assert config["identityfile"] == str(key)
    # ssh accepts every name in the list, and picks the cheap X25519 exchange first
    assert config["kexalgorithms"] == KEX_ALGORITHMS
    assert config["kexalgorithms"].startswith("curve25519-sha256,")


def test_a_key_directory_pinning_one_host_key_for_every_node_is_refused(tmp_path: Path):
    """A pre-CA key directory: one host key that every node served. Refused, not pinned."""
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / HOST_KEY_NAME).write_text(
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIbase gaudi-cluster-host\n"
    )
    with pytest.raises(ConfigError, match=r"pins one host key for every node .*; fix: make keys NAMES="):
        cluster_trust(tmp_path / "keys")
    assert cluster_trust(tmp_path / "nowhere") is None


def test_the_host_ca_is_pinned_rather_than_any_one_key(tmp_path: Path):
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / HOST_KEY_NAME).write_text("ssh-ed25519 AAAAnodekey node\n")
    (keys / HOST_CA_NAME).write_text("ssh-ed25519 AAAAcakey gaudi-cluster-host-ca\n")
    trust = cluster_trust(keys)
    assert trust == "@cert-authority * ssh-ed25519 AAAAcakey"
    config = effective(write_ssh_config(tmp_path, 3022, None, host_trust=trust), host="10.0.0.9")
    assert config["stricthostkeychecking"] == "true"  # what ssh -G prints for "yes"
    assert "hostkeyalias" not in config  # a named node's certificate names the name it is dialled by
    assert (tmp_path / "known_hosts").read_text() == "@cert-authority * ssh-ed25519 AAAAcakey\n"
    assert (tmp_path / "known_hosts").stat().st_mode & 0o077 == 0


def test_nodes_found_by_a_dns_name_are_checked_against_that_name(tmp_path: Path):
    """The master dials the addresses a DNS name gives (a compose service, the Indexed Job's Service):
    each node's own certificate names that DNS name, which ssh checks in place of the address."""
    trust = "@cert-authority * ssh-ed25519 AAAAcakey"
    config = write_ssh_config(tmp_path, 3022, None, host_trust=trust, host_key_alias="worker")
    for address in ("10.0.0.9", "172.18.0.3"):
        assert effective(config, host=address)["hostkeyalias"] == "worker"
    # Without the CA there is nothing to check a name against: each node's own key is pinned at first
    # contact under its address, never under one alias for all (the second node would be refused).
    unpinned = write_ssh_config(tmp_path, 3022, None, host_key_alias="worker")
    assert "hostkeyalias" not in effective(unpinned, host="10.0.0.9")


def test_a_refused_host_key_names_the_node_and_the_fix():
    err = "Certificate invalid: name is not a listed principal\r\nHost key verification failed.\r\n"
    why = explain_ssh_failure(SshResult("worker-2", 255, "", err), 3022)
    assert "\n" not in why and "its certificate does not name it" in why
    assert "make keys NAMES=worker-2" in why and ".keys/nodes/worker-2" in why


def test_job_ssh_config_is_private(tmp_path: Path):
    assert write_ssh_config(tmp_path, 3022, None).stat().st_mode & 0o077 == 0


def test_ssh_argv_quotes_remote_words():
    argv = ssh_argv("h", ["echo", "a b", "$HOME"], Path("/cfg"), connect_timeout_s=1)
    assert argv == ["ssh", "-F", "/cfg", "-o", "ConnectTimeout=1", "--", "h", "echo 'a b' '$HOME'"]


@pytest.mark.parametrize(
    ("code", "stderr", "expected"),
    [
        (255, "ssh: connect to host w port 3022: Connection refused", "nothing listens on port 3022"),
        (255, "root@w: Permission denied (publickey).", "the cluster key is not authorized there"),
        (255, "ssh: Could not resolve hostname w: Name or service not known", "the name does not resolve"),
        (255, "ssh: connect to host w port 3022: No route to host", "unreachable ("),
        (255, "Host key verification failed.", "an impostor at this name or address"),
        (124, "", "ssh timed out"),
        (3, "boom", "remote command failed with exit code 3: boom"),
    ],
)
def test_ssh_failures_name_cause_and_fix(code: int, stderr: str, expected: str):
    why = explain_ssh_failure(SshResult("w", code, "", stderr), 3022)
    assert expected in why
    assert "\n" not in why


def test_a_held_masters_hostfile_remembers_the_dns_name_its_nodes_certificates_name(tmp_path):
    """gaudi_spawn.py --hostfile /run/gaudi-cluster/hostfile: the addresses came from a DNS name (compose's
    `worker`), which the nodes' certificates name; the held master wrote it beside the hostfile."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("172.24.0.2 slots=1\n")
    assert ssh.remembered_host_key_name(str(hostfile)) is None and ssh.remembered_host_key_name(None) is None
    ssh.host_key_name_file(hostfile).write_text("worker\n")
    assert ssh.remembered_host_key_name(str(hostfile)) == "worker"
    ssh.host_key_name_file(hostfile).write_text("worker\nProxyCommand evil\n")  # no name: nothing taken
    assert ssh.remembered_host_key_name(str(hostfile)) is None


def test_a_launch_by_hand_reads_the_jobs_settings_for_the_clusters_nodes_only(tmp_path: Path):
    """A held master's promise: the user's own ssh (deepspeed's ssh check, pdsh) reaches the nodes of
    the stable hostfile as the master does (port, key, the CA, the DNS name the certificates name),
    with no shared connection, and any other host as before."""
    trust = "@cert-authority * ssh-ed25519 AAAAcakey"
    key = tmp_path / "id_ed25519"
    job = write_ssh_config(tmp_path, 3022, key, control_dir=tmp_path / "cm", host_trust=trust,
                           host_key_alias="worker")  # fmt: skip
    stable = tmp_path / "stable"
    stable.mkdir()
    text = ssh.by_hand_config(job.read_text(), ["172.18.0.2", "172.18.0.3"], stable / "known_hosts")
    (stable / "ssh_config").write_text(text)
    node = effective(stable / "ssh_config", host="172.18.0.3")
    assert (node["port"], node["hostkeyalias"], node["identityfile"]) == ("3022", "worker", str(key))
    assert node["userknownhostsfile"] == str(stable / "known_hosts")
    assert node["controlmaster"] == "false" and node.get("controlpath") in (None, "none")
    elsewhere = effective(stable / "ssh_config", host="example.org")
    assert elsewhere["port"] == "22" and "hostkeyalias" not in elsewhere


def test_the_users_ssh_config_gets_the_include_only_when_it_has_none_of_its_own(tmp_path: Path):
    config = tmp_path / "run" / "ssh_config"
    fresh = tmp_path / "fresh" / ".ssh" / "config"
    assert "includes it" in ssh.include_in_user_config(config, fresh)
    assert fresh.read_text() == f"Include {config}\n" and fresh.stat().st_mode & 0o077 == 0
    assert "includes it" in ssh.include_in_user_config(config, fresh)  # again: unchanged
    assert fresh.read_text() == f"Include {config}\n"
    own = tmp_path / "own-config"
    own.write_text("Host gateway\n  User me\n")
    line = ssh.include_in_user_config(config, own)
    assert line == f"for a launch by hand, add `Include {config}` at the top of {own}"
    assert own.read_text() == "Host gateway\n  User me\n"

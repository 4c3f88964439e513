"""The user data each node boots with: what it starts, with which peers, that it holds no secret (public
keys only), which secret files each role waits for, and how `up` reads what a node prints on its console."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from pathlib import Path

import pytest
from gaudi_cluster.aws.userdata import (
    HOST_KEYS_BEGIN,
    HOST_KEYS_END,
    KEYS_RECEIVED,
    START_NODE,
    NodeBoot,
    console_host_keys,
    keys_received,
    node_environment,
    render_user_data,
    worker_peers,
)
from gaudi_cluster.errors import ClusterNotReady, ConfigError

from tests.aws.conftest import booted_console, made_up_host_key

ROOT = Path(__file__).resolve().parents[2]
RUN_NODE = (ROOT / "scripts" / "run-node.sh").read_text()
SHELLCHECK = Path(sys.executable).with_name("shellcheck")


def boot(**changes) -> NodeBoot:
    values = {
        "cluster_id": "demo",
        "index": 0,
        "role": "master",
        "region": "us-east-1",
        "image": "gaudi-cluster:gaudi",
    }
    return NodeBoot(**{**values, **changes})


def heredoc(script: str, path: str) -> str:
    match = re.search(
        rf"^(?:base64 -d|cat) >{re.escape(path)} <<'(\w+)'\n(.*?)^\1$", script, re.MULTILINE | re.DOTALL
    )
    assert match is not None, path
    return match.group(2)


def test_the_master_holds_with_its_workers_as_peers():
    env = node_environment(boot(peers=("10.0.0.11", "10.0.0.12")))
    assert env["GAUDI_CLUSTER_PEERS"] == "10.0.0.11,10.0.0.12"
    assert env["GAUDI_CLUSTER_HOLD"] == "1"
    assert env["GAUDI_CLUSTER_KEYS"] == "/opt/gaudi-cluster/keys"
    assert env["NODE_ROLE"] == "master"


def test_a_worker_has_no_peers_and_does_not_hold():
    env = node_environment(boot(index=1, role="worker", peers=("10.0.0.11",)))
    assert "GAUDI_CLUSTER_PEERS" not in env and "GAUDI_CLUSTER_HOLD" not in env
    assert env["NODE_ROLE"] == "worker"


def test_user_data_installs_run_node_verbatim_and_starts_it_through_a_unit():
    script = render_user_data(boot(peers=("10.0.0.11",)), RUN_NODE)
    installed = base64.b64decode(heredoc(script, "/opt/gaudi-cluster/run-node.sh"))
    assert installed.decode() == RUN_NODE
    assert heredoc(script, "/opt/gaudi-cluster/start-node.sh") == START_NODE
    assert "GAUDI_CLUSTER_PEERS=10.0.0.11\n" in heredoc(script, "/opt/gaudi-cluster/node.env")
    assert script.rstrip().endswith("/opt/gaudi-cluster/start-node.sh")
    assert "systemd-run --unit=gaudi-cluster-node" in script
    assert 'exec ./run-node.sh "$NODE_ROLE"' in START_NODE


PARAMETERS = {"id_ed25519": "/gaudi-cluster/demo/id_ed25519"}


def test_ssm_delivery_reads_the_parameter_names_never_the_values():
    script = render_user_data(boot(key_parameters=PARAMETERS, key_delivery="ssm"), RUN_NODE)
    env = heredoc(script, "/opt/gaudi-cluster/node.env")
    assert "NODE_PARAMETER_id_ed25519=/gaudi-cluster/demo/id_ed25519\n" in env
    assert "ssh_host_ed25519_key" not in env  # no host key through SSM: each container makes its own
    assert "--with-decryption" in START_NODE


def test_only_the_master_waits_for_the_client_key_and_every_node_for_its_own_host_key():
    assert node_environment(boot())["NODE_SECRETS"] == "id_ed25519 ssh_host_ed25519_key"
    assert node_environment(boot(index=1, role="worker"))["NODE_SECRETS"] == "ssh_host_ed25519_key"
    ssm = node_environment(boot(key_parameters=PARAMETERS, key_delivery="ssm"))
    assert ssm["NODE_SECRETS"] == "id_ed25519"
    worker = node_environment(boot(index=1, role="worker", key_delivery="ssm"))
    assert worker["NODE_SECRETS"] == "" and "NODE_PARAMETER_id_ed25519" not in worker
    with pytest.raises(ConfigError, match=r"node 1 \(worker\) must not read id_ed25519"):
        node_environment(boot(index=1, role="worker", key_parameters=PARAMETERS, key_delivery="ssm"))


def test_the_public_keys_are_written_at_boot_and_the_host_keys_printed_on_the_console(cluster_keys):
    publics = {
        "id_ed25519.pub": (cluster_keys / "id_ed25519.pub").read_text().strip(),
        "host_ca.pub": (cluster_keys / "ca" / "host_ca.pub").read_text().strip(),
    }
    script = render_user_data(boot(public_keys=publics), RUN_NODE)
    for name, line in publics.items():
        assert heredoc(script, f"/opt/gaudi-cluster/keys/{name}") == line + "\n"
        assert f"chmod 0644 /opt/gaudi-cluster/keys/{name}\n" in script
    keys = "cat /etc/ssh/ssh_host_*_key.pub"
    printed = f'{{ echo "{HOST_KEYS_BEGIN}"; {keys}; echo "{HOST_KEYS_END}"; }} >/dev/console'
    assert printed in script
    assert script.index(printed) < script.index("systemd-run")
    assert f'echo "{KEYS_RECEIVED}" >/dev/console' in START_NODE
    with pytest.raises(ConfigError, match="is not one ssh public key"):
        render_user_data(boot(public_keys={"id_ed25519.pub": "ssh-ed25519 AAAA\nrm -rf /"}), RUN_NODE)


def test_user_data_holds_no_secret(cluster_keys):
    publics = {
        "id_ed25519.pub": (cluster_keys / "id_ed25519.pub").read_text(),
        "host_ca.pub": (cluster_keys / "ca" / "host_ca.pub").read_text(),
    }
    script = render_user_data(
        boot(peers=("10.0.0.11",), key_parameters=PARAMETERS, public_keys=publics, key_delivery="ssm"),
        RUN_NODE,
    )
    everything = script + base64.b64decode(heredoc(script, "/opt/gaudi-cluster/run-node.sh")).decode()
    assert "PRIVATE KEY" not in everything
    for path in ("id_ed25519", "ca/host_ca"):
        secret_line = (cluster_keys / path).read_text().splitlines()[1]
        assert secret_line not in everything
        assert secret_line not in base64.b64encode(script.encode()).decode()


def test_values_are_shell_quoted_in_node_env(tmp_path):
    script = render_user_data(boot(image="registry.example:5000/gaudi-cluster:1.22"), RUN_NODE)
    env_file = tmp_path / "node.env"
    env_file.write_text(heredoc(script, "/opt/gaudi-cluster/node.env"))
    shown = subprocess.run(
        ["bash", "-c", f'set -a; . "{env_file}"; printf "%s" "$GAUDI_CLUSTER_IMAGE"'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout == "registry.example:5000/gaudi-cluster:1.22"


@pytest.mark.parametrize("part", ["user-data", "start-node"])
def test_generated_scripts_pass_shellcheck(tmp_path, part):
    script = render_user_data(boot(peers=("10.0.0.11",)), RUN_NODE) if part == "user-data" else START_NODE
    path = tmp_path / f"{part}.sh"
    path.write_text(script)
    checked = subprocess.run(
        [str(SHELLCHECK), "-s", "bash", str(path)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout
    assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0


def test_too_much_user_data_is_refused():
    with pytest.raises(ConfigError, match="over EC2's 16384"):
        render_user_data(boot(), RUN_NODE + "#" * 20000)


def test_a_worker_without_a_private_ip_stops_the_master_launch():
    assert worker_peers(["10.0.0.11", "10.0.0.12"]) == ("10.0.0.11", "10.0.0.12")
    with pytest.raises(ClusterNotReady, match="worker 2 has no private IP"):
        worker_peers(["10.0.0.11", None])


# -- the console ------------------------------------------------------------------------------------


def test_the_host_keys_cloud_init_prints_are_read_from_the_console():
    key = made_up_host_key()
    found = console_host_keys(booted_console(key))
    assert len(found) == 2 and found[1] == key and found[0].startswith("ecdsa-sha2-nistp256 AAAA")
    # Amazon Linux prefixes every line with "ec2: "; a timestamp or a unit name may come first too.
    prefixed = "\n".join(f"ec2: {line}" for line in booted_console(key).splitlines())
    assert console_host_keys(prefixed)[1] == key


def test_every_host_key_type_openssh_makes_is_read(tmp_path):
    lines = []
    for kind, bits in (
        ("ed25519", None),
        ("ecdsa", "256"),
        ("ecdsa", "384"),
        ("ecdsa", "521"),
        ("rsa", "2048"),
    ):
        path = tmp_path / f"{kind}{bits or ''}"
        size = ["-b", bits] if bits else []
        subprocess.run(["ssh-keygen", "-q", "-t", kind, *size, "-N", "", "-f", str(path)], check=True)
        lines.append(" ".join(path.with_suffix(".pub").read_text().split()[:2]))
    console = "\n".join([HOST_KEYS_BEGIN, *(f"{line} root@ip-10-0-0-11" for line in lines), HOST_KEYS_END])
    assert console_host_keys(console) == tuple(lines)


def test_only_a_complete_well_formed_block_counts_and_the_last_one_wins():
    first, second = made_up_host_key(), made_up_host_key()
    assert console_host_keys("[ 1.0] booting\n") == ()
    assert console_host_keys(f"{HOST_KEYS_BEGIN}\n{first}\n") == ()  # still printing
    assert console_host_keys(f"{first}\n") == ()  # a key outside the block is anyone's output
    kind, blob = first.split()
    forged = f"ssh-rsa {blob}"  # a blob that does not name its own type
    garbled = f"{kind} {blob[:-8]}!!!!"
    text = f"{HOST_KEYS_BEGIN}\n{forged}\n{garbled}\n{first}\n{HOST_KEYS_END}\n"
    assert console_host_keys(text) == (first,)
    # A reboot prints them again: the last complete block is the one sshd serves now.
    again = f"{text}{HOST_KEYS_BEGIN}\n{second}\n{HOST_KEYS_END}\n"
    assert console_host_keys(again) == (second,)


def test_keys_received_is_the_nodes_own_line():
    assert keys_received(booted_console(made_up_host_key()))
    assert not keys_received(booted_console(made_up_host_key(), keyed=False))
    assert keys_received(f"[  301.5] {KEYS_RECEIVED}\n")

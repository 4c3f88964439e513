"""The user data each node boots with: what it starts, with which peers, and that it holds no key."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from pathlib import Path

import pytest
from gaudi_cluster.aws.userdata import START_NODE, NodeBoot, node_environment, render_user_data, worker_peers
from gaudi_cluster.errors import ClusterNotReady, ConfigError

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


def test_ssm_delivery_reads_the_parameter_name_never_the_value():
    script = render_user_data(boot(key_parameter="/gaudi-cluster/demo/id_ed25519"), RUN_NODE)
    assert "NODE_KEY_PARAMETER=/gaudi-cluster/demo/id_ed25519\n" in heredoc(
        script, "/opt/gaudi-cluster/node.env"
    )
    assert "--with-decryption" in START_NODE


def test_user_data_holds_no_key_material(cluster_keys):
    private = (cluster_keys / "id_ed25519").read_text()
    secret_line = private.splitlines()[1]
    script = render_user_data(
        boot(peers=("10.0.0.11",), key_parameter="/gaudi-cluster/demo/id_ed25519"), RUN_NODE
    )
    everything = script + base64.b64decode(heredoc(script, "/opt/gaudi-cluster/run-node.sh")).decode()
    assert "PRIVATE KEY" not in everything
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

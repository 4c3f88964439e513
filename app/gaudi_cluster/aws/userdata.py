"""The user data each node boots with: install run-node.sh, wait for the cluster key, load/pull the image,
start `run-node.sh worker|master`. Pure text generation.

User data is readable by anything on the node through instance metadata, so it carries no key material:
the cluster key arrives after boot, over ssh (`up` writes it) or from SSM Parameter Store (the node
reads a SecureString with its instance profile). The node side waits for the key with a deadline.
"""

from __future__ import annotations

import base64
import shlex
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from gaudi_cluster.aws.facts import MASTER, NODE_HOME, NODE_KEYS_DIR, WORKER
from gaudi_cluster.errors import ClusterNotReady, ConfigError

# EC2 refuses user data over 16 KiB (before base64).
USER_DATA_LIMIT = 16 * 1024
# How long a node waits for its key before giving up (the key comes after every node is running).
KEY_WAIT_S = 3600
UNIT = "gaudi-cluster-node"
_END = "GAUDI_CLUSTER_EOF"

START_NODE = """\
#!/bin/bash
# Start this node's gaudi-cluster container once the cluster key is here (written by gaudi-cluster aws).
set -Eeuo pipefail
set -a
# shellcheck disable=SC1091
. /opt/gaudi-cluster/node.env
set +a
say() { printf 'gaudi-cluster-node: %s\\n' "$*" >&2; }
keys="$GAUDI_CLUSTER_KEYS"
deadline=$((SECONDS + NODE_KEY_WAIT_S))
install -d -m 0700 "$keys"
if [[ -n "${NODE_KEY_PARAMETER:-}" ]]; then
	# The value goes straight to a 0600 file; it is never echoed.
	umask 077
	until aws ssm get-parameter --region "$NODE_REGION" --name "$NODE_KEY_PARAMETER" --with-decryption \\
		--query Parameter.Value --output text >"$keys/id_ed25519.new" 2>/dev/null; do
		((SECONDS < deadline)) || { say "no cluster key from SSM parameter $NODE_KEY_PARAMETER"; exit 1; }
		sleep 10
	done
	mv "$keys/id_ed25519.new" "$keys/id_ed25519"
	umask 022
	ssh-keygen -y -f "$keys/id_ed25519" >"$keys/id_ed25519.pub.new"
	mv "$keys/id_ed25519.pub.new" "$keys/id_ed25519.pub"
fi
# The public half is written last, so its presence means the private key is complete.
until [[ -s "$keys/id_ed25519.pub" ]]; do
	((SECONDS < deadline)) || { say "the cluster key never arrived in $keys"; exit 1; }
	sleep 5
done
say "cluster key present"
if [[ -n "${NODE_IMAGE_S3:-}" ]]; then
	say "loading $NODE_IMAGE_S3"
	aws s3 cp "$NODE_IMAGE_S3" - | docker load
fi
if ! docker image inspect "$GAUDI_CLUSTER_IMAGE" >/dev/null 2>&1; then
	registry="${GAUDI_CLUSTER_IMAGE%%/*}"
	if [[ "$registry" == *.dkr.ecr.*.amazonaws.com ]]; then
		# ECR wants a login; the token goes through a pipe, never onto a command line.
		ecr_region="${registry#*.dkr.ecr.}"
		aws ecr get-login-password --region "${ecr_region%.amazonaws.com}" |
			docker login --username AWS --password-stdin "$registry"
	fi
	docker pull "$GAUDI_CLUSTER_IMAGE"
fi
cd /opt/gaudi-cluster
exec ./run-node.sh "$NODE_ROLE"
"""


@dataclass(frozen=True)
class NodeBoot:
    """What one node needs to know at boot; nothing in here is secret."""

    cluster_id: str
    index: int
    role: str
    region: str
    image: str
    image_s3: str | None = None
    peers: tuple[str, ...] = ()
    key_parameter: str | None = None


def node_environment(boot: NodeBoot) -> dict[str, str]:
    """node.env: the GAUDI_CLUSTER_* settings run-node.sh passes into the container, plus the NODE_* ones
    only start-node.sh reads."""
    if boot.role not in (MASTER, WORKER):
        raise ConfigError(f"node role {boot.role!r}; fix: master or worker")
    env = {
        "GAUDI_CLUSTER_IMAGE": boot.image,
        "GAUDI_CLUSTER_KEYS": NODE_KEYS_DIR,
        "NODE_ROLE": boot.role,
        "NODE_REGION": boot.region,
        "NODE_KEY_WAIT_S": str(KEY_WAIT_S),
    }
    if boot.role == MASTER:
        # A prepared master that stays up: the user docker-execs into it and runs the job.
        env["GAUDI_CLUSTER_HOLD"] = "1"
        if boot.peers:
            env["GAUDI_CLUSTER_PEERS"] = ",".join(boot.peers)
    if boot.key_parameter is not None:
        env["NODE_KEY_PARAMETER"] = boot.key_parameter
    if boot.image_s3 is not None:
        env["NODE_IMAGE_S3"] = boot.image_s3
    return env


def render_user_data(boot: NodeBoot, run_node_script: str) -> str:
    """The bash script cloud-init runs once as root on first boot."""
    env_lines = "".join(f"{k}={shlex.quote(v)}\n" for k, v in node_environment(boot).items())
    run_node_b64 = "\n".join(textwrap.wrap(base64.b64encode(run_node_script.encode()).decode(), 76))
    unit_properties = " ".join(f"--property={p}" for p in ("After=docker.service", "Requires=docker.service"))
    script = (
        "#!/bin/bash\n"
        f"# gaudi-cluster {boot.cluster_id}: node {boot.index} ({boot.role}). No key material here\n"
        "# (instance metadata is readable on the node); the cluster key arrives after boot.\n"
        f"# Log: journalctl -u {UNIT}\n"
        "set -Eeuo pipefail\n"
        f"install -d -m 0755 {NODE_HOME}\n"
        f"install -d -m 0700 {NODE_KEYS_DIR}\n"
        f"base64 -d >{NODE_HOME}/run-node.sh <<'{_END}'\n{run_node_b64}\n{_END}\n"
        f"cat >{NODE_HOME}/start-node.sh <<'{_END}'\n{START_NODE}{_END}\n"
        f"cat >{NODE_HOME}/node.env <<'{_END}'\n{env_lines}{_END}\n"
        f"chmod 0755 {NODE_HOME}/run-node.sh {NODE_HOME}/start-node.sh\n"
        # A transient unit outlives cloud-init, restarts nothing by itself and logs to the journal.
        f'systemd-run --unit={UNIT} --description="gaudi-cluster node" {unit_properties} '
        f"{NODE_HOME}/start-node.sh\n"
    )
    size = len(script.encode())
    if size > USER_DATA_LIMIT:
        raise ConfigError(
            f"user data for node {boot.index} is {size} bytes, over EC2's {USER_DATA_LIMIT}; "
            "fix: fewer --nodes, or a shorter --image reference"
        )
    return script


def worker_peers(private_ips: Sequence[str | None]) -> tuple[str, ...]:
    """The master's GAUDI_CLUSTER_PEERS: every worker's private IP, in node order."""
    missing = [i for i, ip in enumerate(private_ips) if not ip]
    if missing:
        raise ClusterNotReady(
            f"worker {missing[0] + 1} has no private IP yet; fix: run up again once it is running"
        )
    return tuple(ip for ip in private_ips if ip)

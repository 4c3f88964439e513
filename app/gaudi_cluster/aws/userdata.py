"""The user data each node boots with: print the instance's ssh host keys on its console, install
run-node.sh and the public keys, wait for the secret keys, load/pull the image, start
`run-node.sh worker|master`; and the reading of what a node prints on its console. Pure.

User data is readable by anything on the node through instance metadata, so it carries no secret: the
secret key files arrive after boot, over ssh (`up` writes them) or from SSM Parameter Store (the node
reads SecureStrings with its instance profile), the client key to the master only. The node waits for
them with a deadline, then says so on its console, where `up` reads it (GetConsoleOutput).
"""

from __future__ import annotations

import base64
import binascii
import re
import shlex
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gaudi_cluster.aws.facts import (
    MASTER,
    NODE_HOME,
    NODE_KEYS_DIR,
    SECRETS_OF_ROLE,
    SSM_SECRETS_OF_ROLE,
    WORKER,
)
from gaudi_cluster.errors import ClusterNotReady, ConfigError

# EC2 refuses user data over 16 KiB (before base64).
USER_DATA_LIMIT = 16 * 1024
# How long a node waits for its key before giving up (the key comes after every node is running).
KEY_WAIT_S = 3600
UNIT = "gaudi-cluster-node"
_END = "GAUDI_CLUSTER_EOF"
# What cloud-init (and our user data, for AMIs whose cloud-init does not) prints around the instance's
# ssh host keys on the console; the line a node prints once its secret keys are in place.
HOST_KEYS_BEGIN = "-----BEGIN SSH HOST KEY KEYS-----"
HOST_KEYS_END = "-----END SSH HOST KEY KEYS-----"
KEYS_RECEIVED = "gaudi-cluster-node: keys received"

START_NODE = """\
#!/bin/bash
# Start this node's gaudi-cluster container once its keys are here (from gaudi-cluster aws).
set -Eeuo pipefail
set -a
# shellcheck disable=SC1091
. /opt/gaudi-cluster/node.env
set +a
say() { printf 'gaudi-cluster-node: %s\\n' "$*" >&2; }
keys="$GAUDI_CLUSTER_KEYS"
deadline=$((SECONDS + NODE_KEY_WAIT_S))
install -d -m 0700 "$keys"
umask 077
# NODE_SECRETS: this role's secret key files (the client key on the master only). Each arrives whole
# (moved into place), so its presence means it is complete.
for file in $NODE_SECRETS; do
	parameter="NODE_PARAMETER_$file"
	if [[ -n "${!parameter:-}" ]]; then
		# The value goes straight to a 0600 file; it is never echoed.
		until aws ssm get-parameter --region "$NODE_REGION" --name "${!parameter}" --with-decryption \\
			--query Parameter.Value --output text >"$keys/$file.new" 2>/dev/null; do
			((SECONDS < deadline)) || { say "no $file from SSM parameter ${!parameter}"; exit 1; }
			sleep 10
		done
		mv "$keys/$file.new" "$keys/$file"
	fi
	until [[ -s "$keys/$file" ]]; do
		((SECONDS < deadline)) || { say "$file never arrived in $keys"; exit 1; }
		sleep 5
	done
done
umask 022
say "keys present: $NODE_SECRETS"
# gaudi-cluster aws up reads this on the console (then deletes the SSM parameters).
echo "@KEYS_RECEIVED@" >/dev/console || true
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
""".replace("@KEYS_RECEIVED@", KEYS_RECEIVED)


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
    # Public key lines by file name (id_ed25519.pub, host_ca.pub): written at boot.
    public_keys: Mapping[str, str] = field(default_factory=dict)
    # SSM parameter names of this role's secret files, by file name (empty: they come over ssh).
    key_parameters: Mapping[str, str] = field(default_factory=dict)
    key_delivery: str = "ssh"

    @property
    def secrets(self) -> tuple[str, ...]:
        """The secret files the node waits for: over ssh its own host key (and the master the client
        key); through SSM the client key on the master alone (each container makes its own host key)."""
        return (SSM_SECRETS_OF_ROLE if self.key_delivery == "ssm" else SECRETS_OF_ROLE)[self.role]


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
        "NODE_SECRETS": " ".join(boot.secrets),
    }
    if boot.role == MASTER:
        # A prepared master that stays up: the user docker-execs into it and runs the job.
        env["GAUDI_CLUSTER_HOLD"] = "1"
        if boot.peers:
            env["GAUDI_CLUSTER_PEERS"] = ",".join(boot.peers)
    unknown = sorted(set(boot.key_parameters) - set(boot.secrets))
    if unknown:
        raise ConfigError(
            f"node {boot.index} ({boot.role}) must not read {unknown[0]}; fix: a bug, report it"
        )
    for file, name in boot.key_parameters.items():
        env[f"NODE_PARAMETER_{file}"] = name
    if boot.image_s3 is not None:
        env["NODE_IMAGE_S3"] = boot.image_s3
    return env


def render_user_data(boot: NodeBoot, run_node_script: str) -> str:
    """The bash script cloud-init runs once as root on first boot."""
    env_lines = "".join(f"{k}={shlex.quote(v)}\n" for k, v in node_environment(boot).items())
    # Public halves only: authorized_keys material and the host CA the master pins.
    publics = "".join(
        f"cat >{NODE_KEYS_DIR}/{name} <<'{_END}'\n{public_key_line(line)}\n{_END}\n"
        f"chmod 0644 {NODE_KEYS_DIR}/{name}\n"
        for name, line in sorted(boot.public_keys.items())
    )
    run_node_b64 = "\n".join(textwrap.wrap(base64.b64encode(run_node_script.encode()).decode(), 76))
    unit_properties = " ".join(f"--property={p}" for p in ("After=docker.service", "Requires=docker.service"))
    script = (
        "#!/bin/bash\n"
        f"# gaudi-cluster {boot.cluster_id}: node {boot.index} ({boot.role}). No secret here (instance\n"
        "# metadata is readable on the node): public keys only; the secret ones arrive after boot.\n"
        f"# Log: journalctl -u {UNIT}\n"
        "set -Eeuo pipefail\n"
        "# This instance's own ssh host keys, in cloud-init's format, for `up` to pin before its first ssh.\n"
        f'{{ echo "{HOST_KEYS_BEGIN}"; cat /etc/ssh/ssh_host_*_key.pub; echo "{HOST_KEYS_END}"; }} '
        ">/dev/console 2>&1 || true\n"
        f"install -d -m 0755 {NODE_HOME}\n"
        f"install -d -m 0700 {NODE_KEYS_DIR}\n"
        f"{publics}"
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


# -- what a node prints on its console ---------------------------------------------------------------

# An ssh public key's wire form: length-prefixed fields, the first its type; how many each type has.
_KEY_FIELDS = {
    "ssh-ed25519": 2,
    "ssh-rsa": 3,
    "ecdsa-sha2-nistp256": 3,
    "ecdsa-sha2-nistp384": 3,
    "ecdsa-sha2-nistp521": 3,
}
_KEY = re.compile(rf"(?<![\w-])({'|'.join(_KEY_FIELDS)})\s+(AAAA[0-9A-Za-z+/]+={{0,3}})(?=\s|$)")


def _well_formed(kind: str, blob: str) -> bool:
    """The base64 key decodes into exactly its type's fields, the first naming the type itself."""
    try:
        raw = base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError):
        return False
    fields, at = [], 0
    while at + 4 <= len(raw):
        length = int.from_bytes(raw[at : at + 4], "big")
        fields.append(raw[at + 4 : at + 4 + length])
        at += 4 + length
    return at == len(raw) and len(fields) == _KEY_FIELDS[kind] and fields[0] == kind.encode()


def public_key_line(line: str) -> str:
    """One ssh public key line (`type base64 [comment]`), as written into a node's key directory."""
    text = line.strip()
    match = _KEY.match(text)
    if "\n" in text or match is None or not _well_formed(match[1], match[2]) or _END in text:
        raise ConfigError(f"{text[:40]!r}… is not one ssh public key; fix: make keys (remove .keys first)")
    return text


def console_host_keys(output: str) -> tuple[str, ...]:
    """The ssh host keys ("type base64") in the last complete block an instance printed on its console;
    lines may carry a prefix (`ec2: `, a timestamp). Empty when no complete block is there yet."""
    found: list[str] | None = None
    block: list[str] | None = None
    for line in output.splitlines():
        if HOST_KEYS_BEGIN in line:
            block = []
        elif HOST_KEYS_END in line:
            if block is not None:
                found, block = block, None
        elif block is not None:
            match = _KEY.search(line)
            if match and _well_formed(match[1], match[2]):
                block.append(f"{match[1]} {match[2]}")
    return tuple(dict.fromkeys(found or ()))


def keys_received(output: str) -> bool:
    """True once the node's console says its secret key files are in place."""
    return any(line.rstrip().endswith(KEYS_RECEIVED) for line in output.splitlines())

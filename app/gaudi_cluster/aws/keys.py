"""Deliver the cluster key (made by `make keys`) to the nodes after boot: over ssh, or through SSM
Parameter Store as a SecureString. Never through user data, never on a command line, never logged.

Over ssh the private key travels on ssh's standard input; the remote side writes it 0600 as root and
derives the public half last (the node's start script waits for that file). Workers have no public
address: they are reached through the master (ProxyCommand over its Elastic IP). Host keys are trusted
per cluster (accept-new into a known_hosts of this cluster's own), never disabled.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gaudi_cluster.aws.facts import NODE_KEYS_DIR
from gaudi_cluster.aws.spec import tags
from gaudi_cluster.errors import ClusterNotReady, ConfigError, GaudiClusterError

log = logging.getLogger("gaudi_cluster.aws")

# ssh's exit status when the connection itself failed (node still booting): retried until the deadline.
SSH_CONNECTION_FAILED = 255
RETRY_INTERVAL_S = 5.0

INSTALL_KEY = "sudo sh -c " + shlex.quote(
    f'umask 077; d={NODE_KEYS_DIR}; mkdir -p "$d" && cat >"$d/id_ed25519.new" && '
    'mv "$d/id_ed25519.new" "$d/id_ed25519" && '
    'ssh-keygen -y -f "$d/id_ed25519" >"$d/id_ed25519.pub.new" && '
    'chmod 0644 "$d/id_ed25519.pub.new" && mv "$d/id_ed25519.pub.new" "$d/id_ed25519.pub"'
)


@dataclass(frozen=True)
class ClusterKey:
    private: bytes = field(repr=False)
    public: str


def read_cluster_key(keys_dir: Path) -> ClusterKey:
    private_path, public_path = keys_dir / "id_ed25519", keys_dir / "id_ed25519.pub"
    if not private_path.is_file() or not public_path.is_file():
        raise ConfigError(f"no cluster key in {keys_dir}; fix: make keys (or --keys DIR holding id_ed25519)")
    mode = private_path.stat().st_mode & 0o777
    if mode & 0o077:
        raise ConfigError(
            f"cluster key {private_path} is readable by others (mode {mode:04o}); "
            f"fix: chmod 600 {private_path}"
        )
    private = private_path.read_bytes()
    if b"PRIVATE KEY" not in private:
        raise ConfigError(
            f"{private_path} is not an OpenSSH private key; fix: remove {keys_dir} and run make keys"
        )
    return ClusterKey(private=private, public=public_path.read_text().strip())


def state_dir(cluster_id: str, environ: Mapping[str, str] = os.environ) -> Path:
    """This machine's files for one cluster (ssh config, known_hosts); `down` removes them."""
    cache = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "gaudi-cluster" / "aws" / cluster_id


def ssh_program(environ: Mapping[str, str] = os.environ) -> str:
    # Tests point this at a recorder; users never need to.
    return environ.get("GAUDI_CLUSTER_AWS_SSH", "ssh")


def write_ssh_config(
    directory: Path,
    user: str,
    identity: Path | None,
    master_ip: str,
    workers: Mapping[str, str],
    ssh: str = "ssh",
) -> Path:
    """An ssh config naming the master (Elastic IP) and each worker (private IP, through the master)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    config = directory / "ssh_config"
    common = [
        f"  User {user}",
        "  BatchMode yes",
        "  ConnectTimeout 10",
        "  StrictHostKeyChecking accept-new",
        f"  UserKnownHostsFile {directory / 'known_hosts'}",
        "  ServerAliveInterval 15",
        "  LogLevel ERROR",
    ]
    if identity is not None:
        common += [f"  IdentityFile {identity}", "  IdentitiesOnly yes"]
    lines = ["Host master", f"  HostName {master_ip}", *common]
    jump = f"{shlex.quote(ssh)} -F {shlex.quote(str(config))} -W %h:%p master"
    for name, ip in workers.items():
        lines += [f"Host {name}", f"  HostName {ip}", f"  ProxyCommand {jump}", *common]
    config.write_text("\n".join(lines) + "\n")
    config.chmod(0o600)
    return config


Runner = Callable[..., "subprocess.CompletedProcess[bytes]"]


def deliver_over_ssh(
    hosts: Sequence[str],
    key: ClusterKey,
    config: Path,
    deadline: float,
    ssh: str = "ssh",
    run: Runner = subprocess.run,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Write the key on every host (master first: the workers are reached through it)."""
    for host in hosts:
        argv = [ssh, "-F", str(config), host, INSTALL_KEY]
        while True:
            done = run(argv, input=key.private, capture_output=True, check=False)
            if done.returncode == 0:
                log.info("cluster key delivered to %s over ssh", host)
                break
            reason = _last_line(done.stderr) or f"exit {done.returncode}"
            if done.returncode != SSH_CONNECTION_FAILED:
                raise GaudiClusterError(
                    f"writing the cluster key on {host} failed: {reason}; fix: check sudo for the login "
                    f"user, then run up again (ssh -F {config} {host})"
                )
            if clock() >= deadline:
                raise ClusterNotReady(
                    f"{host} did not accept ssh before the deadline ({reason}); fix: check --ssh-cidr and "
                    f"--key-name/--identity-file, then run up again (it converges)"
                )
            sleep(RETRY_INTERVAL_S)


def put_key_parameter(ssm: Any, name: str, key: ClusterKey, cluster_id: str) -> bool:
    """Store the private key as a SecureString (tagged, so `down` finds it). True when newly created."""
    value = key.private.decode()
    try:
        ssm.put_parameter(
            Name=name,
            Value=value,
            Type="SecureString",
            Description="gaudi-cluster: the cluster's ssh private key",
            Tags=tags(cluster_id),
        )
        return True
    except ssm.exceptions.ParameterAlreadyExists:
        # Tags cannot go with Overwrite; the existing parameter already carries them.
        ssm.put_parameter(Name=name, Value=value, Type="SecureString", Overwrite=True)
        return False


def _last_line(data: bytes | str | None) -> str:
    text = data.decode(errors="replace") if isinstance(data, bytes) else (data or "")
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""

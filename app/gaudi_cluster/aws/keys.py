"""The cluster's keys (made by `make keys`) and how their secret halves reach the nodes after boot: over
ssh, or through SSM Parameter Store as SecureStrings. Never through user data, never on a command line,
never logged. The master gets the client key; every node gets a host key of its own, made here for it
and certified by the cluster's host CA (`make keys`' ca/, on this machine only) for the node's name and
private IP, which the master dials: no two nodes share a host key, and the master pins the CA. Through
SSM only the client key travels (to the master); each node's container makes its own host key then.

Over ssh the secret files travel as a tar on ssh's standard input; the remote side unpacks them as root,
0600, and moves each into place whole, the waited-for secrets last (the node's start script waits for
them). Workers have no public address: they are reached through the master (ProxyCommand over its
Elastic IP). Host keys are pinned from each instance's console (delivery.py) under the instance id
(HostKeyAlias), and checked strictly: an address that answers with another key is refused, and nothing is
sent to it.
"""

from __future__ import annotations

import io
import logging
import os
import shlex
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gaudi_cluster.aws.calls import Resources, calling, tolerating_gone
from gaudi_cluster.aws.facts import CLIENT_KEY, HOST_CA, HOST_KEY, NODE_KEYS_DIR, SECRETS_OF_ROLE
from gaudi_cluster.aws.spec import tags
from gaudi_cluster.errors import ClusterNotReady, ConfigError, GaudiClusterError

log = logging.getLogger("gaudi_cluster.aws")

# ssh's exit status when the connection itself failed (node still booting): retried until the deadline.
SSH_CONNECTION_FAILED = 255
RETRY_INTERVAL_S = 5.0
# What ssh says (exit 255) when the host key is not the pinned one, or there is no pin: never retried.
HOST_KEY_REFUSED = "Host key verification failed"


@dataclass(frozen=True)
class ClusterKeys:
    """The key files of `make keys`: the client key pair (the master logs in with it) and the host CA,
    whose private key stays here and signs each node's own host key (`node_host_key`)."""

    client_private: bytes = field(repr=False)
    client_public: str
    ca_public: str
    ca_key: Path  # the CA's private key file (make keys' ca/host_ca), read by ssh-keygen only

    def public_keys(self, pin_ca: bool = True) -> dict[str, str]:
        """What user data writes on every node: the client public key, and the CA the nodes pin (not
        with SSM delivery: no node has a certificate then)."""
        return {f"{CLIENT_KEY}.pub": self.client_public, **({HOST_CA: self.ca_public} if pin_ca else {})}

    def secret(self, name: str) -> bytes:
        return {CLIENT_KEY: self.client_private}[name]

    def files_for(self, role: str, identity: str, principals: Sequence[str]) -> dict[str, bytes]:
        """What one node receives over ssh: its own host key and certificate, and the client key on the
        master alone."""
        files = node_host_key(self.ca_key, identity, principals)
        return {**files, **{name: self.secret(name) for name in SECRETS_OF_ROLE[role] if name != HOST_KEY}}


def node_host_key(ca_key: Path, identity: str, principals: Sequence[str]) -> dict[str, bytes]:
    """A new host key for one node and its certificate from the CA, for `principals` only (the names and
    addresses the node is reached by): HOST_KEY, its .pub and its -cert.pub, by file name."""
    if not principals or any("," in name or not name for name in principals):
        raise GaudiClusterError(f"no principals for {identity}'s host certificate; fix: a bug, report it")
    with tempfile.TemporaryDirectory(prefix="gc-host-key-") as tmp:
        key = Path(tmp) / HOST_KEY
        comment, signed_as = f"gaudi-cluster-host {identity}", f"gaudi-cluster-host-{identity}"
        for argv in (
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)],
            [
                "ssh-keygen",
                "-q",
                "-s",
                str(ca_key),
                "-I",
                signed_as,
                "-h",
                "-n",
                ",".join(principals),
                f"{key}.pub",
            ],
        ):
            done = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, check=False)
            if done.returncode != 0:
                raise GaudiClusterError(
                    f"ssh-keygen could not make {identity}'s host key ({_last_line(done.stderr)}); "
                    f"fix: check {ca_key} (make keys)"
                )
        names = (HOST_KEY, f"{HOST_KEY}.pub", f"{HOST_KEY}-cert.pub")
        return {name: (Path(tmp) / name).read_bytes() for name in names}


def _private(path: Path, what: str) -> bytes:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise ConfigError(f"{what} {path} is readable by others (mode {mode:04o}); fix: chmod 600 {path}")
    data = path.read_bytes()
    if b"PRIVATE KEY" not in data:
        raise ConfigError(
            f"{path} is not an OpenSSH private key; fix: remove {path.parent} and run make keys"
        )
    return data


def read_cluster_keys(keys_dir: Path) -> ClusterKeys:
    client, ca = keys_dir / CLIENT_KEY, keys_dir / "ca" / "host_ca"
    if not client.is_file() or not client.with_name(f"{CLIENT_KEY}.pub").is_file():
        raise ConfigError(
            f"no cluster key in {keys_dir}; fix: make keys (or --keys DIR holding {CLIENT_KEY})"
        )
    if not ca.is_file() or not ca.with_name(HOST_CA).is_file():
        raise ConfigError(
            f"no host CA in {keys_dir}/ca (it certifies each node's own host key; the one {HOST_KEY} "
            "of older clusters was every node's); fix: make keys (it adds one to an existing .keys)"
        )
    _private(ca, "host CA key")
    return ClusterKeys(
        client_private=_private(client, "cluster key"),
        client_public=client.with_name(f"{CLIENT_KEY}.pub").read_text().strip(),
        ca_public=ca.with_name(HOST_CA).read_text().strip(),
        ca_key=ca,
    )


def state_dir(cluster_id: str, environ: Mapping[str, str] = os.environ) -> Path:
    """This machine's files for one cluster (ssh config, known_hosts); `down` removes them."""
    cache = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "gaudi-cluster" / "aws" / cluster_id


def ssh_program(environ: Mapping[str, str] = os.environ) -> str:
    # Tests point this at a recorder; users never need to.
    return environ.get("GAUDI_CLUSTER_AWS_SSH", "ssh")


# -- ssh --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SshHost:
    """One node as this machine's ssh reaches it: its Host name, address, and the instance id its host
    keys are pinned under."""

    name: str
    address: str
    instance_id: str


def write_ssh_config(
    directory: Path,
    user: str,
    identity: Path | None,
    master: SshHost,
    workers: Sequence[SshHost],
    ssh: str = "ssh",
) -> Path:
    """An ssh config naming the master (Elastic IP) and each worker (private IP, through the master)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    config = directory / "ssh_config"
    common = [
        f"  User {user}",
        "  BatchMode yes",
        "  ConnectTimeout 10",
        # Only the keys the instance printed on its console; a new or changed key is refused.
        "  StrictHostKeyChecking yes",
        "  UpdateHostKeys no",
        "  CheckHostIP no",
        f"  UserKnownHostsFile {directory / 'known_hosts'}",
        "  ServerAliveInterval 15",
        "  LogLevel ERROR",
    ]
    if identity is not None:
        common += [f"  IdentityFile {identity}", "  IdentitiesOnly yes"]
    lines = ["Host master", f"  HostName {master.address}", f"  HostKeyAlias {master.instance_id}", *common]
    jump = f"{shlex.quote(ssh)} -F {shlex.quote(str(config))} -W %h:%p master"
    for worker in workers:
        lines += [
            f"Host {worker.name}",
            f"  HostName {worker.address}",
            f"  HostKeyAlias {worker.instance_id}",
        ]
        lines += [f"  ProxyCommand {jump}", *common]
    config.write_text("\n".join(lines) + "\n")
    config.chmod(0o600)
    return config


def read_pins(known_hosts: Path) -> dict[str, tuple[str, ...]]:
    """The host keys pinned so far, by instance id (from earlier runs of up)."""
    pins: dict[str, list[str]] = {}
    if known_hosts.is_file():
        for line in known_hosts.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and not line.startswith("#"):
                pins.setdefault(parts[0], []).append(f"{parts[1]} {parts[2]}")
    return {alias: tuple(keys) for alias, keys in pins.items()}


def write_pins(known_hosts: Path, pins: Mapping[str, Sequence[str]]) -> None:
    known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    known_hosts.write_text(
        "".join(f"{alias} {key}\n" for alias, keys in sorted(pins.items()) for key in keys)
    )
    known_hosts.chmod(0o600)


def bundle(files: Mapping[str, bytes]) -> bytes:
    """The secret files as one tar (0600 each) for ssh's standard input."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o600
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def install_command(files: Sequence[str], remove: Iterable[str] = ()) -> str:
    """The remote side: unpack the tar from stdin as root into a private staging directory, drop the files
    this role must not hold (a worker's client key from an older gaudi-cluster), move each file in whole,
    the secrets the node's start script waits for last (the certificate is there before the key is)."""
    last = [name for name in files if name in (CLIENT_KEY, HOST_KEY)]
    order = [*sorted(name for name in files if name not in last), *sorted(last)]
    script = (
        f'umask 077; d={NODE_KEYS_DIR}; mkdir -p "$d" || exit 1; '
        's=$(mktemp -d "$d/.incoming.XXXXXX") || exit 1; trap \'rm -rf "$s"\' EXIT; '
        'tar -x -f - -C "$s" --no-same-owner || exit 1; '
        + "".join(f'rm -f "$d/{name}"; ' for name in remove)
        + "".join(f'mv -f "$s/{name}" "$d/" || exit 1; ' for name in order)
    )
    return "sudo sh -c " + shlex.quote(script.rstrip("; "))


@dataclass(frozen=True)
class Delivery:
    host: SshHost
    files: Mapping[str, bytes] = field(repr=False)
    remove: tuple[str, ...] = ()


Runner = Callable[..., "subprocess.CompletedProcess[bytes]"]


def deliver_over_ssh(
    deliveries: Sequence[Delivery],
    config: Path,
    deadline: float,
    ssh: str = "ssh",
    run: Runner = subprocess.run,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Write each host's secret files (master first: the workers are reached through it)."""
    for delivery in deliveries:
        host = delivery.host
        argv = [ssh, "-F", str(config), host.name, install_command(sorted(delivery.files), delivery.remove)]
        payload = bundle(delivery.files)
        while True:
            done = run(argv, input=payload, capture_output=True, check=False)
            if done.returncode == 0:
                log.info(
                    "keys delivered to %s (%s) over ssh: %s",
                    host.name,
                    host.instance_id,
                    ", ".join(sorted(delivery.files)),
                )
                break
            reason = _last_line(done.stderr) or f"exit {done.returncode}"
            if HOST_KEY_REFUSED in _text(done.stderr):
                raise GaudiClusterError(
                    f"{host.name} ({host.instance_id}) at {host.address} answered ssh with a host key its "
                    f"console did not print; nothing was sent to it; fix: find out who answers there "
                    f"(aws ec2 get-console-output --latest --output text --instance-id {host.instance_id} "
                    "shows the instance's own keys), then run up again"
                )
            if done.returncode != SSH_CONNECTION_FAILED:
                raise GaudiClusterError(
                    f"writing the keys on {host.name} failed: {reason}; fix: check sudo for the login "
                    f"user, then run up again (ssh -F {config} {host.name})"
                )
            if clock() >= deadline:
                raise ClusterNotReady(
                    f"{host.name} did not accept ssh before the deadline ({reason}); fix: check --ssh-cidr "
                    "and --key-name/--identity-file, then run up again (it converges)"
                )
            sleep(RETRY_INTERVAL_S)


# -- SSM Parameter Store ------------------------------------------------------------------------------------


def put_key_parameters(
    ssm: Any, names: Mapping[str, str], keys: ClusterKeys, cluster_id: str, journal: Resources
) -> None:
    """Store each secret file as a SecureString (tagged, so `down` finds it); each name goes to the journal
    as it is stored."""
    for file, name in names.items():
        value = keys.secret(file).decode()
        with calling("PutParameter"):
            try:
                ssm.put_parameter(
                    Name=name,
                    Value=value,
                    Type="SecureString",
                    Description=f"gaudi-cluster: the cluster's {file}, until every node has it",
                    Tags=tags(cluster_id),
                )
            except ssm.exceptions.ParameterAlreadyExists:
                # Tags cannot go with Overwrite; the existing parameter already carries them.
                ssm.put_parameter(Name=name, Value=value, Type="SecureString", Overwrite=True)
        journal.parameters.append(name)
        log.info("stored %s as SecureString %s", file, name)


def delete_key_parameters(ssm: Any, names: Iterable[str]) -> None:
    for name in names:
        with tolerating_gone(), calling("DeleteParameter"):
            ssm.delete_parameter(Name=name)
        log.info("deleted SSM parameter %s: every node has its keys", name)


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _last_line(data: bytes | str | None) -> str:
    lines = [line.strip() for line in _text(data).strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""

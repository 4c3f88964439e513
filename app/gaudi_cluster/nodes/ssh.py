"""ssh to the nodes: one job-local client config, parallel commands, readable failures.

Host-key trust is per job: `StrictHostKeyChecking accept-new` into a known_hosts file inside the
job's directory, so a cluster rebuilt with new host keys never trips a stale global known_hosts and
trust is never disabled globally. Every call is BatchMode (never prompts) with a connect timeout.
"""

from __future__ import annotations

import contextlib
import shlex
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gaudi_cluster.errors import ConfigError


@dataclass(frozen=True)
class SshResult:
    host: str
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def check_private_key(path: Path) -> None:
    """The cluster key must exist and be readable by its owner only (ssh refuses it otherwise)."""
    if not path.is_file():
        raise ConfigError(f"no cluster private key at {path}; fix: run `make keys` and mount .keys read-only")
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise ConfigError(
            f"cluster key {path} is readable by others (mode {mode:04o}); fix: chmod 600 {path}"
        )


# Prefer classic X25519 over OpenSSH 9's default post-quantum hybrid (sntrup761): that KEX costs ~0.13 s
# of CPU per connection on each side, and a launch opens several connections per node (probe, pdsh,
# reap). The hybrid stays allowed, last, for a server that offers nothing else. entrypoint/ssh_config
# carries the same line for ssh run by hand or by mpirun.
KEX_ALGORITHMS = "curve25519-sha256,curve25519-sha256@libssh.org,sntrup761x25519-sha512@openssh.com"


def write_ssh_config(
    job_dir: Path,
    port: int,
    identity: Path | None,
    connect_timeout_s: int = 5,
    control_dir: Path | None = None,
    host_key: str | None = None,
) -> Path:
    """The job's ssh client config. With `control_dir`, every session to a node rides on the one
    connection `open_connections` made (probe, launch, clean-up: no new handshake each time); a
    session finds no such connection and ssh simply connects on its own. With `host_key` (the
    cluster's, "TYPE BASE64"), every node must answer with it: a node with another key is refused
    before anything (the probe's secrets included) is sent; without one, first contact pins a key."""
    known_hosts = job_dir / "known_hosts"
    if host_key is not None:
        known_hosts.write_text(f"* {host_key}\n")
    lines = [
        "Host *",
        f"  Port {port}",
        "  User root",
        "  BatchMode yes",
        f"  ConnectTimeout {connect_timeout_s}",
        f"  StrictHostKeyChecking {'yes' if host_key else 'accept-new'}",
        f"  UserKnownHostsFile {known_hosts}",
        "  GlobalKnownHostsFile /dev/null",
        # A partitioned node must not keep a launcher's ssh session alive for hours.
        "  ServerAliveInterval 5",
        "  ServerAliveCountMax 3",
        f"  KexAlgorithms {KEX_ALGORITHMS}",
        "  LogLevel ERROR",
    ]
    if identity is not None:
        lines += [f"  IdentityFile {identity}", "  IdentitiesOnly yes"]
    if control_dir is not None:
        # %C: a hash of this host, the node, port and user (short enough for a socket path).
        lines += ["  ControlMaster no", f"  ControlPath {control_dir}/%C"]
    path = job_dir / "ssh_config"
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


def ssh_argv(
    host: str, remote: Sequence[str], config: Path, connect_timeout_s: int | None = None
) -> list[str]:
    # The remote side runs a shell; quote each word so arguments arrive verbatim.
    options = ["-o", f"ConnectTimeout={connect_timeout_s}"] if connect_timeout_s else []
    # `--`: a host is never read as an option, whatever validated it before.
    return ["ssh", "-F", str(config), *options, "--", host, shlex.join(remote)]


Runner = Callable[[Sequence[str], float, "str | None"], SshResult]


def run_subprocess(argv: Sequence[str], timeout_s: float, stdin: str | None = None) -> SshResult:
    """Run argv; `stdin` (when given) is its whole standard input, the way secrets reach a node."""
    host = argv[3] if len(argv) > 3 else "?"
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return SshResult(host, 124, "", f"timed out after {timeout_s:.0f}s")
    return SshResult(host, done.returncode, done.stdout, done.stderr)


def run_on_hosts(
    hosts: Iterable[str],
    remote: Sequence[str],
    config: Path,
    timeout_s: float,
    runner: Runner = run_subprocess,
    connect_timeout_s: int | None = None,
    stdin: str | Callable[[str], str] | None = None,
) -> dict[str, SshResult]:
    """Run the same command on every host at once; one slow host does not delay the others. `stdin`
    is the same text for every host, or made for each (a node's own key goes to that node only)."""
    host_list = list(hosts)
    if not host_list:
        return {}

    def stdin_of(host: str) -> str | None:
        return stdin(host) if callable(stdin) else stdin

    with ThreadPoolExecutor(max_workers=min(64, len(host_list))) as pool:
        futures = {
            host: pool.submit(
                runner, ssh_argv(host, remote, config, connect_timeout_s), timeout_s, stdin_of(host)
            )
            for host in host_list
        }
    return {host: _with_host(future.result(), host) for host, future in futures.items()}


def _with_host(result: SshResult, host: str) -> SshResult:
    return SshResult(host, result.returncode, result.stdout, result.stderr)


def explain_ssh_failure(result: SshResult, port: int) -> str:
    """Turn ssh's exit 255 and its stderr into the cause and the fix."""
    err = result.stderr.strip()
    last = err.splitlines()[-1] if err else ""
    if result.returncode == 124:
        return f"ssh timed out; fix: check that {result.host} is up and reachable"
    if "Connection refused" in err:
        return (
            f"nothing listens on port {port} (sshd down or wrong --ssh-port); "
            "fix: start the worker or set --ssh-port"
        )
    if "Permission denied" in err:
        return "the cluster key is not authorized there; fix: mount the same .keys on every node"
    if "Could not resolve hostname" in err or "Name or service not known" in err:
        return "the name does not resolve; fix: check the peer list or DNS"
    if "timed out" in err or "No route to host" in err or "Network is unreachable" in err:
        return f"unreachable ({last}); fix: check the network between the nodes"
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in err or "Host key verification failed" in err:
        return (
            "answered with a host key that is not the cluster's (an impostor at this name or address, or "
            "a node started without the cluster's host key); nothing was sent to it; fix: start that node "
            "with the keys of make keys (ssh_host_ed25519_key) or leave it out of the peers"
        )
    if result.returncode == 255:
        return f"ssh failed ({last or 'exit 255'})"
    return f"remote command failed with exit code {result.returncode}: {last}"


def sshd_answers(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """True when something at host:port greets like sshd (a TCP connect alone can be a proxy)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            return sock.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def wait_for_sshd(
    hosts: Sequence[str],
    port: int,
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
    check: Callable[[str, int], bool] = sshd_answers,
) -> list[str]:
    """Poll every host in parallel until all greet or the deadline passes; return those that never did."""
    waiting = list(hosts)
    with ThreadPoolExecutor(max_workers=min(64, max(1, len(waiting)))) as pool:
        while waiting:
            answers = list(pool.map(lambda host: check(host, port), waiting))
            waiting = [host for host, ok in zip(waiting, answers, strict=True) if not ok]
            if not waiting or clock() >= deadline:
                break
            time.sleep(0.25)
    return waiting


# Our key (make keys), then the Kubeflow MPI Operator's, which it names id_rsa (an ECDSA P-521 key).
IDENTITY_NAMES = ("id_ed25519", "id_rsa")


HOST_KEY_NAME = "ssh_host_ed25519_key.pub"


def cluster_host_key(ssh_dir: Path) -> str | None:
    """The cluster's host key ("TYPE BASE64") from the key directory (make keys), or None."""
    try:
        words = (ssh_dir / HOST_KEY_NAME).read_text().split()
    except OSError:
        return None
    return " ".join(words[:2]) if len(words) >= 2 else None


def default_identity(ssh_dir: Path) -> Path | None:
    """The installed copy in ~/.ssh (0600, made by the entrypoint) or the mounted secret."""
    for directory in (Path.home() / ".ssh", ssh_dir):
        for name in IDENTITY_NAMES:
            if (directory / name).is_file():
                return directory / name
    return None


# How long a shared connection outlives its last session: the survey closes them when the attempt
# ends; this only bounds what a killed master leaves behind (a root ssh master process per node).
CONTROL_PERSIST_S = 600


def open_connections(hosts: Sequence[str], config: Path, timeout_s: float) -> list[str]:
    """Open one background master connection per node (in parallel) for the sessions to share;
    returns the hosts where that failed (their sessions then connect on their own). An idle one ends
    by itself after CONTROL_PERSIST_S, should the master die before closing it."""

    def open_one(host: str) -> bool:
        argv = [
            "ssh",
            "-F",
            str(config),
            "-o",
            "ControlMaster=yes",
            "-o",
            f"ControlPersist={CONTROL_PERSIST_S}",
            "-N",
            "-f",
            "--",
            host,
        ]
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0

    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(64, len(hosts))) as pool:
        opened = list(pool.map(open_one, hosts))
    return [host for host, ok in zip(hosts, opened, strict=True) if not ok]


def close_connections(hosts: Iterable[str], config: Path) -> None:
    """End the shared connections, all at once (`ssh -O exit` talks to the local master process only:
    it never waits on an unreachable node)."""

    def close_one(host: str) -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                ["ssh", "-F", str(config), "-O", "exit", "--", host],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=5,
                check=False,
            )

    targets = list(hosts)
    if targets:
        with ThreadPoolExecutor(max_workers=min(64, len(targets))) as pool:
            list(pool.map(close_one, targets))

"""ssh to the nodes: one job-local client config, parallel commands, readable failures.

Host-key trust is per job, in a known_hosts file inside the job's directory: with the keys of make keys,
`@cert-authority * <host CA>` (a node must present a host certificate of the cluster's CA naming the
name or address the master dialled, or, for nodes found at the addresses of a DNS name, that DNS name:
HostKeyAlias; StrictHostKeyChecking yes), else `accept-new` (first contact pins each node's own key).
A key directory that pins one host key for every node (from before the CA) is refused. A cluster
rebuilt with new host keys never trips a stale global known_hosts and trust is never disabled
globally. Every call is BatchMode (never prompts) with a connect timeout.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gaudi_cluster.errors import ConfigError
from gaudi_cluster.nodes import parallel
from gaudi_cluster.rank.jobdir import write_private_file


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
    host_trust: str | None = None,
    host_key_alias: str | None = None,
) -> Path:
    """The job's ssh client config. With `control_dir`, every session to a node rides on the one
    connection `open_connections` made (probe, launch, clean-up: no new handshake each time); a
    session finds no such connection and ssh simply connects on its own. With `host_trust` (a
    known_hosts line, `cluster_trust`), every node must pass it: a node that does not is refused
    before anything (the probe's secrets included) is sent; without one, first contact pins a key.
    `host_key_alias` (with `host_trust`): the nodes are addresses a DNS name gave (a compose service,
    the Indexed Job's Service), so each node's own certificate must name that DNS name, as the
    address it answers at is not known when its key is certified."""
    known_hosts = job_dir / "known_hosts"
    if host_trust is not None:
        write_private_file(known_hosts, f"{host_trust}\n")
    lines = [
        "Host *",
        f"  Port {port}",
        "  User root",
        "  BatchMode yes",
        f"  ConnectTimeout {connect_timeout_s}",
        f"  StrictHostKeyChecking {'yes' if host_trust else 'accept-new'}",
        f"  UserKnownHostsFile {known_hosts}",
        "  GlobalKnownHostsFile /dev/null",
        # A partitioned node must not keep a launcher's ssh session alive for hours.
        "  ServerAliveInterval 5",
        "  ServerAliveCountMax 3",
        f"  KexAlgorithms {KEX_ALGORITHMS}",
        "  LogLevel ERROR",
    ]
    if host_trust is not None and host_key_alias is not None:
        lines.append(f"  HostKeyAlias {host_key_alias}")
    if identity is not None:
        lines += [f"  IdentityFile {identity}", "  IdentitiesOnly yes"]
    if control_dir is not None:
        # %C: a hash of this host, the node, port and user (short enough for a socket path).
        lines += ["  ControlMaster no", f"  ControlPath {control_dir}/%C"]
    path = job_dir / "ssh_config"
    write_private_file(path, "\n".join(lines) + "\n")
    return path


BY_HAND_CONFIG = "ssh_config"  # beside the stable hostfile: /run/gaudi-cluster/ssh_config


def include_in_user_config(config: Path, user_config: Path) -> str:
    """Let the user's own ssh (deepspeed's ssh check, pdsh, mpirun run by hand) read `config`: an
    `Include` line in `user_config` (~/.ssh/config), written only when that file is absent or already
    has it (a config of the user's own is never edited); returns the line to print."""
    include = f"Include {config}"
    try:
        present = include in user_config.read_text().splitlines()
    except FileNotFoundError:
        user_config.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_private_file(user_config, include + "\n")
        present = True
    if present:
        return f"your ssh reads {config} for these nodes ({user_config} includes it)"
    return f"for a launch by hand, add `{include}` at the top of {user_config}"


def by_hand_config(job_config: str, hosts: Sequence[str], known_hosts: Path) -> str:
    """The job's client config (write_ssh_config's text) for the user's own ssh on a held master, as
    a raw launcher run by hand uses it (deepspeed's ssh check and pdsh, mpirun): for the cluster's
    nodes only (a user's other hosts keep their own settings), no shared connection, `known_hosts`
    (the CA line) in place of the job's."""
    lines = [f"Host {' '.join(hosts)}"]
    for line in job_config.splitlines()[1:]:  # the first is write_ssh_config's "Host *"
        key = line.split(maxsplit=1)[0] if line.strip() else ""
        if key == "UserKnownHostsFile":
            lines.append(f"  UserKnownHostsFile {known_hosts}")
        elif key not in ("ControlMaster", "ControlPath"):
            lines.append(line)
    return "\n".join(lines) + "\n"


# Beside the hostfile a held master writes: the DNS name its nodes were found at, which their
# certificates name; a master later given that hostfile (gaudi_spawn.py --hostfile) checks them by it.
HOST_KEY_NAME_SUFFIX = ".host-key-name"
_DNS_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")


def host_key_name_file(hostfile: Path) -> Path:
    return hostfile.with_name(hostfile.name + HOST_KEY_NAME_SUFFIX)


def remembered_host_key_name(hostfile: str | None) -> str | None:
    """The DNS name a held master found this hostfile's nodes at (None: none was written beside it)."""
    if not hostfile:
        return None
    try:
        name = host_key_name_file(Path(hostfile)).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return name if _DNS_NAME.fullmatch(name) else None


def ssh_argv(
    host: str, remote: Sequence[str], config: Path, connect_timeout_s: int | None = None
) -> list[str]:
    # The remote side runs a shell; quote each word so arguments arrive verbatim.
    options = ["-o", f"ConnectTimeout={connect_timeout_s}"] if connect_timeout_s else []
    # `--`: a host is never read as an option, whatever validated it before.
    return ["ssh", "-F", str(config), *options, "--", host, shlex.join(remote)]


def run_on_hosts(
    hosts: Iterable[str],
    remote: Sequence[str],
    config: Path,
    timeout_s: float,
    connect_timeout_s: int | None = None,
    stdin: str | Callable[[str], str] | None = None,
) -> dict[str, SshResult]:
    """Run the same command on every host at once (nodes/parallel: no thread per node); one slow host
    does not delay the others. `stdin` is the same text for every host, or made for each (a node's
    own key goes to that node only)."""
    commands = {host: ssh_argv(host, remote, config, connect_timeout_s) for host in hosts}

    def stdin_of(host: str) -> str | None:
        return stdin(host) if callable(stdin) else stdin

    finished = parallel.run_all(commands, timeout_s, stdin_of)
    return {host: SshResult(host, r.returncode, r.stdout, r.stderr) for host, r in finished.items()}


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
        why = (
            "its certificate does not name it"
            if "not a listed principal" in err
            else "no certificate of the cluster's CA for this name"
        )
        return (
            f"answered with a host key that is not the cluster's ({why}: an impostor at this name or "
            "address, or a node started without its own keys); nothing was sent to it; fix: make keys "
            f"NAMES={result.host} and start that node with .keys/nodes/{result.host} mounted, or leave it "
            "out of the peers"
        )
    if result.returncode == 255:
        return f"ssh failed ({last or 'exit 255'})"
    return f"remote command failed with exit code {result.returncode}: {last}"


def wait_for_sshd(
    hosts: Sequence[str],
    port: int,
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
) -> list[str]:
    """Ask every host at once, round after round, until all greet like sshd or the deadline passes;
    return those that never did."""
    waiting = list(hosts)
    while waiting:
        answered = parallel.greeters(waiting, port)
        waiting = [host for host in waiting if host not in answered]
        if not waiting or clock() >= deadline:
            break
        time.sleep(0.25)
    return waiting


# Our key (make keys), then the Kubeflow MPI Operator's, which it names id_rsa (an ECDSA P-521 key).
IDENTITY_NAMES = ("id_ed25519", "id_rsa")


HOST_CA_NAME = "host_ca.pub"
# A key directory made before the host CA held one host key that every node served.
HOST_KEY_NAME = "ssh_host_ed25519_key.pub"


def _public_key(path: Path) -> str | None:
    try:
        words = path.read_text().split()
    except OSError:
        return None
    return " ".join(words[:2]) if len(words) >= 2 else None


def cluster_trust(ssh_dir: Path) -> str | None:
    """The known_hosts line the nodes must pass, from the key directory (make keys): the host CA
    (`@cert-authority * TYPE BASE64`), else None (nothing to pin: each node's own key at first contact).
    A host key without the CA (a directory from before it: one key served by every node) is refused."""
    ca = _public_key(ssh_dir / HOST_CA_NAME)
    if ca is not None:
        return f"@cert-authority * {ca}"
    if _public_key(ssh_dir / HOST_KEY_NAME) is not None:
        raise ConfigError(
            f"{ssh_dir} pins one host key for every node ({HOST_KEY_NAME}, no {HOST_CA_NAME}: a key "
            'directory from before the host CA); fix: make keys NAMES="<the nodes\' names>", then mount '
            ".keys/master on the master and .keys/nodes/NAME on each node"
        )
    return None


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
    """Open one background master connection per node (all at once) for the sessions to share;
    returns the hosts where that failed (their sessions then connect on their own). An idle one ends
    by itself after CONTROL_PERSIST_S, should the master die before closing it."""
    options = ["-o", "ControlMaster=yes", "-o", f"ControlPersist={CONTROL_PERSIST_S}", "-N", "-f"]
    commands = {host: ["ssh", "-F", str(config), *options, "--", host] for host in hosts}
    # No pipes: the backgrounded master process would hold them open for as long as it lives.
    finished = parallel.run_all(commands, timeout_s, capture=False)
    return [host for host, done in finished.items() if done.returncode != 0]


def close_connections(hosts: Iterable[str], config: Path, how: str = "exit") -> None:
    """End the shared connections, all at once (`ssh -O` talks to the local master process only: it
    never waits on an unreachable node). how="exit": at once, with any session riding them; "stop":
    each stops taking sessions and ends with its last one (a later session connects on its own)."""
    commands = {host: ["ssh", "-F", str(config), "-O", how, "--", host] for host in hosts}
    parallel.run_all(commands, timeout_s=5)


# Writes each file of a JSON {name: text} on stdin into the directory argv[1], owner-only, atomically:
# a directory someone else made (or one open to others, or a symlink) is refused, each file is new
# (O_EXCL|O_NOFOLLOW: never a planted file or link), as rank/jobdir does on the master.
_WRITE_FILES = (
    "import json, os, secrets, stat, sys\n"
    "directory = sys.argv[1]\n"
    "os.makedirs(os.path.dirname(directory), mode=0o755, exist_ok=True)\n"
    "try:\n"
    "    os.mkdir(directory, 0o700)\n"
    "except FileExistsError:\n"
    "    pass\n"
    "st = os.lstat(directory)\n"
    "if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:\n"
    "    sys.exit(f'{directory} is not a directory of ours closed to others; fix: remove it')\n"
    "for name, text in json.load(sys.stdin).items():\n"
    "    path = os.path.join(directory, name)\n"
    "    part = f'{path}.{secrets.token_hex(8)}.part'\n"
    "    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)\n"
    "    with os.fdopen(fd, 'w') as out:\n"
    "        out.write(text)\n"
    "    os.replace(part, path)\n"
)


def share_client_config(hosts: Sequence[str], config: Path, python: str, port: int) -> dict[str, str]:
    """Copy the job's ssh config and the known_hosts it names to the same paths on every host, for
    an ssh started there (Open MPI's tree spawn starts daemons from other nodes with the master's
    ssh arguments, `-F` this config included); returns why, by host, where that failed."""
    files = {config.name: config.read_text()}
    known_hosts = config.parent / "known_hosts"
    if known_hosts.is_file():
        files[known_hosts.name] = known_hosts.read_text()
    remote = [python, "-c", _WRITE_FILES, str(config.parent)]
    results = run_on_hosts(hosts, remote, config, timeout_s=30, stdin=json.dumps(files))
    return {host: explain_ssh_failure(r, port) for host, r in results.items() if not r.ok}

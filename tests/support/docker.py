"""Docker CLI wrappers for the tests: labelled containers, polling with deadlines, the image lock."""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from gaudi_cluster_dev.localcluster import node_keys

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "cpu-image.txt"
SSH_DIR = "/run/secrets/gaudi-cluster"
BASE_IMAGE = "gaudi-cluster/debian:bookworm"  # the cpu flavor's base (make base-image)
SESSION = uuid.uuid4().hex[:8]
LABEL = f"gaudi-cluster.test={SESSION}"


def docker(*args: str, check: bool = True, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """Run the docker CLI; return the completed process (text mode)."""
    proc = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )
    if check and proc.returncode != 0:
        pytest.fail(f"docker {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    """Poll predicate until it is true or timeout seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def lock_pins() -> dict[str, str]:
    """The lock's pins, keyed by normalised name."""
    pins = {}
    for raw in LOCK.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[normalize(name)] = version
    return pins


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def health(name: str) -> str:
    return docker("inspect", "-f", "{{.State.Health.Status}}", name, check=False).stdout.strip()


# Docker's own health status, refreshed every second rather than every 15 s: the image's HEALTHCHECK
# command, run by Docker, without a test waiting out the interval (test_image checks the interval itself).
FAST_HEALTH = ("--health-interval", "1s")


def passes_health_check(name: str) -> bool:
    """The image's health check, run now (Docker itself runs it only every 15 s)."""
    return docker("exec", name, "/opt/gaudi-cluster/entrypoint/healthcheck.sh", check=False).returncode == 0


def running(name: str) -> bool:
    return docker("inspect", "-f", "{{.State.Running}}", name, check=False).stdout.strip() == "true"


class Containers:
    """Starts labelled containers; removes them (and prints their logs on failure) at the end."""

    def __init__(self, image: str, keys: Path, network: str = "") -> None:
        self.image = image
        self.keys = keys
        self.names: list[str] = []
        # A second pool in one session (another image) needs its own network name.
        self.network = network or f"gc-test-{SESSION}"
        docker("network", "create", "--label", LABEL, self.network)

    def run(
        self,
        *args: str,
        role: str | None = "worker",
        env: dict[str, str] | None = None,
        keys: Path | bool | None = True,
        name: str | None = None,
        mounts: list[str] | None = None,
        run_args: Sequence[str] = (),
    ) -> str:
        """docker run -d [run_args] IMAGE [role] [args] on the test network; returns the container name."""
        name = name or f"gc-{SESSION}-{uuid.uuid4().hex[:6]}"
        cmd = ["run", "-d", "--name", name, "--hostname", name, "--network", self.network, "--label", LABEL]
        if keys:
            # make keys' part for this container, never the whole directory (it holds the host CA, which
            # the entrypoint refuses): a worker its own nodes/<name>/ (its own host key, certified for
            # the name it is reached by), anything else master/ (client key, host key and certificate).
            if keys is not True:
                source = keys
            elif role == "worker" and (self.keys / "ca").is_dir():
                source = node_keys(self.keys, name)
            else:
                source = self.keys / "master" if (self.keys / "master").is_dir() else self.keys
            cmd += ["-v", f"{source}:{SSH_DIR}:ro"]
        for key, value in (env or {}).items():
            cmd += ["-e", f"{key}={value}"]
        for mount in mounts or []:
            cmd += ["-v", mount]
        cmd += [*run_args, self.image]
        if role:
            cmd.append(role)
        cmd += list(args)
        docker(*cmd)
        self.names.append(name)
        return name

    def logs(self, name: str) -> str:
        proc = docker("logs", name, check=False)
        return proc.stdout + proc.stderr

    def remove_all(self, show_logs: bool) -> None:
        for name in self.names:
            if show_logs:
                print(f"\n----- docker logs {name} -----\n{self.logs(name)}")
            docker("rm", "-f", "-v", name, check=False)
        leftovers = docker("ps", "-aq", "--filter", f"label={LABEL}", check=False).stdout.split()
        if leftovers:
            docker("rm", "-f", "-v", *leftovers, check=False)
        docker("network", "rm", self.network, check=False)


def run_once(
    image: str,
    *args: str,
    env: dict[str, str] | None = None,
    mounts: list[str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess:
    """docker run --rm IMAGE args (foreground), labelled; returns the completed process."""
    cmd = ["run", "--rm", "--label", LABEL]
    for key, value in (env or {}).items():
        cmd += ["-e", f"{key}={value}"]
    for mount in mounts or []:
        cmd += ["-v", mount]
    return docker(*cmd, image, *args, check=False, timeout=timeout)

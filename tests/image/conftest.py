"""Fixtures for the cpu image tests: a real Docker engine, the built image, a test key, containers.

The image tag comes from GAUDI_CLUSTER_IMAGE (default gaudi-cluster:cpu; `make test-image` builds it).
No engine, or no image, fails the tests loudly: they never skip.
Every container and network carries the label gaudi-cluster.test=<session id> and is removed in a
finalizer, even when a test fails; the logs of the session's containers are printed on failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import testinfra
from image_helpers import ROOT, SSH_DIR, Containers, docker, health, wait_until


@pytest.fixture(scope="session")
def image() -> str:
    """The image under test; fails (never skips) without an engine or the image."""
    tag = os.environ.get("GAUDI_CLUSTER_IMAGE", "gaudi-cluster:cpu")
    if shutil.which("docker") is None:
        pytest.fail("the docker CLI is not installed; the image tests need a Docker engine")
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("`docker info` timed out: no Docker engine answers")
    if info.returncode != 0:
        pytest.fail(f"no Docker engine answers (`docker info` failed): {info.stderr.strip()}")
    if docker("image", "inspect", tag, check=False).returncode != 0:
        pytest.fail(f"image {tag} not found; fix: make image-cpu (or set GAUDI_CLUSTER_IMAGE)")
    return tag


@pytest.fixture(scope="session")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cluster key pair made by scripts/make-keys.sh (dir 0700, private 0600)."""
    path = tmp_path_factory.mktemp("keys") / "keys"
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "make-keys.sh"), str(path)], check=True, capture_output=True
    )
    return path


@pytest.fixture(scope="session")
def containers(request: pytest.FixtureRequest, image: str, keys: Path) -> Iterator[Containers]:
    pool = Containers(image, keys)
    request.addfinalizer(lambda: pool.remove_all(show_logs=request.session.testsfailed > 0))
    yield pool


@pytest.fixture(scope="session")
def worker(containers: Containers) -> str:
    """A worker container started with the test key, running and healthy."""
    name = containers.run(role="worker")
    # Docker's own status, not the script run by hand: this proves the HEALTHCHECK instruction works.
    if not wait_until(lambda: health(name) == "healthy", timeout=60):
        pytest.fail(f"worker {name} did not turn healthy ({health(name)}):\n{containers.logs(name)}")
    return name


@pytest.fixture(scope="session")
def host(worker: str) -> testinfra.host.Host:
    """testinfra over `docker exec` into the worker."""
    return testinfra.get_host(f"docker://root@{worker}")


@pytest.fixture(scope="session")
def client(containers: Containers) -> str:
    """A long-running container of the image (pass-through command) holding the client key."""
    script = (
        f"install -d -m 0700 /root/.ssh && install -m 0600 {SSH_DIR}/id_ed25519 /root/.ssh/id_ed25519"
        " && exec sleep infinity"
    )
    name = containers.run("bash", "-c", script, role=None)
    if not wait_until(
        lambda: docker("exec", name, "test", "-s", "/root/.ssh/id_ed25519", check=False).returncode == 0, 20
    ):
        pytest.fail(f"client container {name} did not start:\n{containers.logs(name)}")
    return name

"""Fixtures for the cpu image tests: containers of the image (the image and the key come from
tests/conftest.py; no engine, or no image, fails the tests loudly: they never skip).

Every container and network carries the label gaudi-cluster.test=<session id> and is removed in a
finalizer, even when a test fails; the logs of the session's containers are printed on failure.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import testinfra

from tests.support.docker import FAST_HEALTH, SSH_DIR, Containers, docker, health, wait_until


@pytest.fixture(scope="session")
def containers(request: pytest.FixtureRequest, image: str, cluster_keys: Path) -> Iterator[Containers]:
    pool = Containers(image, cluster_keys)
    request.addfinalizer(lambda: pool.remove_all(show_logs=request.session.testsfailed > 0))
    yield pool


@pytest.fixture(scope="session")
def worker(containers: Containers) -> str:
    """A worker container started with the test key, running and healthy."""
    name = containers.run(role="worker", run_args=FAST_HEALTH)
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

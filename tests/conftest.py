"""Shared fixtures: the Docker engine, the image and a cluster key (never skipped: no engine is a loud
failure), and the per-phase test reports that fixtures read to print logs on failure."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.support.docker import ROOT, docker
from tests.support.ports import held_port


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)


# Tests that must share one pytest-xdist worker (make test, --dist loadgroup), by path. pytest 9's node
# ids no longer take the `@group` suffix that xdist 3.8 adds for xdist_group marks, so the groups are
# made here, where the controller schedules. tests/image: one worker, one set of its containers. The
# second stage runs on two workers, one lane each: the timed lane holds the cluster tests that bound
# how fast a fault is named or a slow rank is seen, one job at a time as they ran serially; the other
# holds what bounds no time (trainings, the Kubernetes contract, set-up checks) and Slurm, whose one
# bound (a killed node named in < 15 s, ~10 s today) holds with a core busy elsewhere. It fills the
# time the timed lane spends waiting on heartbeats and teardowns: 832 s and 431 s of test time ran in
# 841 s (1,159 s serially; 12-06, 2 cores). With the checkpoint chain (188 s) moved to the other lane
# the stage took 823 s: both cores were then busy throughout and every timed test ran slower.
GROUPS = {
    "tests/image/": "image",
    "tests/train/": "untimed",
    "tests/ohabana/": "untimed",
    "tests/slurm/": "untimed",
    "tests/k8s/test_contract.py": "untimed",
    "tests/cluster/test_short_jobs.py": "untimed",
    "tests/cluster/test_quickstart.py": "untimed",
    "tests/cluster/test_preflight.py": "untimed",
    "tests/cluster/test_hpu_shaped.py": "untimed",
    "tests/cluster/": "timed",
}


def group_of(nodeid: str) -> str:
    """The worker group of a test (its first matching path in GROUPS), else the test alone."""
    return next((group for path, group in GROUPS.items() if nodeid.startswith(path)), nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class PathGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return PathGroupScheduling(config, log)


@pytest.fixture(scope="session")
def docker_engine() -> None:
    try:
        done = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        pytest.fail(f"no Docker engine answers ({error}); fix: scripts/start-docker-engine.sh", pytrace=False)
    if done.returncode != 0:
        pytest.fail(
            "no Docker engine answers (`docker info` failed); fix: scripts/start-docker-engine.sh "
            f"(.ci/run does it). {done.stderr.strip()[:300]}",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def image(docker_engine) -> str:
    """The image under test: GAUDI_CLUSTER_IMAGE, default gaudi-cluster:cpu (`make image-cpu`)."""
    name = os.environ.get("GAUDI_CLUSTER_IMAGE", "gaudi-cluster:cpu")
    if docker("image", "inspect", name, check=False).returncode != 0:
        pytest.fail(
            f"image {name} is missing; fix: make image-cpu (or set GAUDI_CLUSTER_IMAGE)", pytrace=False
        )
    return name


@pytest.fixture(scope="session")
def cluster_keys(tmp_path_factory) -> Path:
    """A cluster key pair made by scripts/make-keys.sh (dir 0700, private key 0600)."""
    directory = tmp_path_factory.mktemp("keys") / "keys"
    subprocess.run([str(ROOT / "scripts" / "make-keys.sh"), str(directory)], check=True, capture_output=True)
    return directory


@pytest.fixture
def hold_port() -> Iterator[Callable[[], int]]:
    """held_port() for the whole test: one call per port a child process binds (tests/support/ports.py)."""
    with ExitStack() as stack:
        yield lambda: stack.enter_context(held_port())


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary directory short enough to hold a job root: a job's status socket must fit AF_UNIX's
    108 bytes, which pytest-xdist's tmp_path (…/pytest-N/popen-gwN/<test name>/) can exceed."""
    path = Path(tempfile.mkdtemp(prefix="gc-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)

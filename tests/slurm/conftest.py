"""Fixtures of the Slurm tests: the test-only Slurm image and one Slurm cluster per module
(tests/support/slurm.py). Starting a cluster takes seconds; its jobs take most of the time, so the
tests share one, and the test that kills a node runs last."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.docker import docker
from tests.support.slurm import SLURM_TEST_DIR, SlurmCluster, slurm_image_tag


@pytest.fixture(scope="session")
def slurm_image(image: str) -> str:
    """The test-only Slurm layer on top of the image under test (built here; cached by Docker)."""
    tag = slurm_image_tag(image)
    started = time.monotonic()
    docker("build", "-q", "-t", tag, "--build-arg", f"BASE_IMAGE={image}", str(SLURM_TEST_DIR), timeout=900)
    print(f"\nslurm test image {tag} built in {time.monotonic() - started:.1f}s")
    return tag


@pytest.fixture(scope="module")
def slurm(request, slurm_image: str, cluster_keys: Path, tmp_path_factory) -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(slurm_image, cluster_keys, tmp_path_factory.mktemp("slurm"))
    began = time.monotonic()
    try:
        cluster.start()
        yield cluster
    finally:
        if request.session.testsfailed:
            print(cluster.all_logs())
        cluster.remove()
        total = time.monotonic() - began
        print(f"\nSlurm tests: cluster start {cluster.start_seconds:.1f}s, whole module {total:.1f}s")


@pytest.fixture(autouse=True)
def _cancel_leftover_jobs(request) -> Iterator[None]:
    """One failed test must not fail the next by holding the shared nodes."""
    yield
    if "slurm" in request.fixturenames:
        request.getfixturevalue("slurm").cancel_leftovers()

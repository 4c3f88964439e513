"""Shared fixtures: the Docker engine and image (never skipped: no engine is a loud failure)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)


@pytest.fixture(scope="session")
def docker_engine() -> None:
    done = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.fail(
            "no Docker engine answers (`docker info` failed); fix: scripts/start-docker-engine.sh "
            f"(.ci/run does it). {done.stderr.strip()[:300]}",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def image(docker_engine) -> str:
    name = os.environ.get("GAUDI_CLUSTER_IMAGE", "gaudi-cluster:cpu")
    if subprocess.run(["docker", "image", "inspect", name], capture_output=True, check=False).returncode != 0:
        pytest.fail(f"image {name} is missing; fix: make image-cpu", pytrace=False)
    return name


@pytest.fixture(scope="session")
def cluster_keys(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("keys") / "keys"
    subprocess.run([str(ROOT / "scripts" / "make-keys.sh"), str(directory)], check=True, capture_output=True)
    return directory

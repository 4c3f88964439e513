"""scripts/prune-builds.sh on a real engine: after a build, only the newest per-commit tags of the built
image's series stay, so a developer's or CI's Docker disk does not fill up build after build."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.image import build_args, git_rev
from tests.support.docker import BASE_IMAGE, docker

ROOT = Path(__file__).resolve().parents[2]
PRUNE = ROOT / "scripts" / "prune-builds.sh"


@pytest.fixture
def repo(tmp_path: Path) -> Iterator[str]:
    name = f"gc-prune-{uuid.uuid4().hex[:8]}"
    yield name
    listed = docker("images", name, "--format", "{{.Repository}}:{{.Tag}}", check=False).stdout.split()
    if listed:
        docker("rmi", "-f", *listed, check=False)


def build(tmp_path: Path, n: int, *tags: str) -> None:
    """A distinct tiny image (its own label), tagged as given; a second apart, since Docker's creation
    time, by which the script orders builds, counts whole seconds."""
    (tmp_path / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nLABEL gc-prune-test={n}\n")
    docker("build", "-q", *[arg for tag in tags for arg in ("-t", tag)], str(tmp_path))
    time.sleep(1.1)


def tags(repo: str) -> set[str]:
    return set(docker("images", repo, "--format", "{{.Tag}}").stdout.split())


def prune(image: str, rev: str, keep: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"KEEP_BUILDS": keep} if keep else {})}
    return subprocess.run(
        ["bash", str(PRUNE), image, rev], capture_output=True, text=True, check=False, env=env
    )


def test_only_the_newest_builds_of_the_series_keep_their_tags(tmp_path, repo):
    for n, rev in enumerate(["aaaaaaa", "bbbbbbb", "ccccccc"]):
        build(tmp_path, n, f"{repo}:0.1.0-cpu-{rev}")
    # Another series, and a tag that only looks like one of the cpu series (a dash after the prefix).
    build(tmp_path, 3, f"{repo}:0.1.0-gaudi-1.24.1-aaaaaaa", f"{repo}:0.1.0-cpu-ccccccc-build-stage")
    build(tmp_path, 4, f"{repo}:cpu", f"{repo}:0.1.0-cpu-ddddddd")

    done = prune(f"{repo}:cpu", "ddddddd")
    assert done.returncode == 0, done.stderr
    assert "removed 2 older build tag(s)" in done.stderr
    assert tags(repo) == {
        "cpu", "0.1.0-cpu-ddddddd", "0.1.0-cpu-ccccccc",
        "0.1.0-gaudi-1.24.1-aaaaaaa", "0.1.0-cpu-ccccccc-build-stage",
    }  # fmt: skip

    done = prune(f"{repo}:cpu", "ddddddd", keep="1")
    assert done.returncode == 0, done.stderr
    assert "0.1.0-cpu-ccccccc" not in tags(repo) and "0.1.0-cpu-ddddddd" in tags(repo)


def test_bad_input_is_one_line_and_changes_nothing(tmp_path, repo):
    build(tmp_path, 0, f"{repo}:0.1.0-cpu-aaaaaaa")
    build(tmp_path, 1, f"{repo}:cpu", f"{repo}:0.1.0-cpu-bbbbbbb")
    before = tags(repo)
    for image, keep, culprit in [
        (f"{repo}:cpu", "0", "KEEP_BUILDS=0"),
        (f"{repo}:absent", None, f"no image {repo}:absent"),
    ]:
        done = prune(image, "bbbbbbb", keep)
        assert done.returncode == 1
        assert done.stderr.count("\n") == 1 and culprit in done.stderr and "fix:" in done.stderr
    assert tags(repo) == before


def test_a_cached_build_tags_its_own_venv_stage(tmp_path, image):
    """A stray dangling image with the venv stage's label (what an older or failed build leaves) is not
    taken for this build's stage: the stage tag names the real cached stage, which therefore survives
    the prune that ends the build, and the stray goes. (Picking the stage by label did the opposite, so
    every other build remade the venv and copied it into a new 1.5 GB layer.)"""
    (tmp_path / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nLABEL io.gaudi-cluster.stage=build gc-prune-test=stray-{tmp_path.name}\n"
    )
    stray = docker("build", "-q", str(tmp_path)).stdout.strip()
    tag = f"{image}-prunetest"
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-image.sh"), tag, *build_args(git_rev())],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=900,
    )  # fmt: skip
    try:
        assert done.returncode == 0, done.stderr[-3000:]
        stage = docker("image", "inspect", "-f", "{{.Id}}", f"{tag}-build-stage").stdout.strip()
        assert stage == docker("image", "inspect", "-f", "{{.Id}}", f"{image}-build-stage").stdout.strip()
        assert docker("image", "inspect", stray, check=False).returncode != 0, "the stray stage stayed"
    finally:
        docker("rmi", f"{tag}-build-stage", tag, check=False)
        docker("rmi", stray, check=False)

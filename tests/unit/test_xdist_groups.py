"""make test's xdist groups (tests/conftest.py GROUPS): every path they name exists, and a test lands in
the group of its first matching path, else runs alone."""

from __future__ import annotations

from tests.conftest import GROUPS, group_of
from tests.support.docker import ROOT


def test_every_grouped_path_exists():
    missing = [path for path in GROUPS if not (ROOT / path).exists()]
    assert not missing, f"GROUPS names paths that are gone: {missing}"


def test_a_test_goes_to_its_first_matching_group_else_alone():
    assert group_of("tests/image/test_image.py::test_sshd_runs") == "image"
    assert group_of("tests/cluster/test_preflight.py::test_x[a]") == "untimed"
    assert group_of("tests/cluster/test_reliability.py::test_y[direct]") == "timed"
    assert group_of("tests/slurm/test_slurm.py::test_z") == "untimed"
    assert group_of("tests/unit/test_version.py::test_v") == "tests/unit/test_version.py::test_v"

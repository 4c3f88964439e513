"""The job directory's private file: owner-only from the first byte, read back by the agent."""

from __future__ import annotations

import os

from gaudi_cluster.rank import jobdir


def test_private_file_is_owner_only_and_round_trips(tmp_path):
    old = os.umask(0)  # even with a permissive umask
    try:
        directory = jobdir.stage(tmp_path / "jobs", "j1", {"env": {"HF_TOKEN": "hf_x", "N": 1}})
    finally:
        os.umask(old)
    assert directory.stat().st_mode & 0o777 == 0o700
    private = directory / jobdir.PRIVATE_FILE
    assert private.stat().st_mode & 0o777 == 0o600
    assert jobdir.private_env(jobdir.read_private(directory)) == {"HF_TOKEN": "hf_x", "N": "1"}
    assert not list(directory.glob(".private*"))


def test_no_private_file_means_nothing_private(tmp_path):
    assert jobdir.read_private(tmp_path) == {}
    (tmp_path / jobdir.PRIVATE_FILE).write_text("not json")
    assert jobdir.read_private(tmp_path) == {}
    assert jobdir.private_env({"env": ["not", "a", "dict"]}) == {}

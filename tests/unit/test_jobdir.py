"""The job directory's private file: owner-only from the first byte, typed, read back by the agent."""

from __future__ import annotations

import json
import os

import pytest
from gaudi_cluster.rank import jobdir
from gaudi_cluster.wire.private_payload import PrivatePayload, PrivatePayloadError


def test_private_file_is_owner_only_and_round_trips(tmp_path):
    payload = PrivatePayload(node="worker-1", token="k" * 64, env={"HF_TOKEN": "hf_x", "N": 1})
    old = os.umask(0)  # even with a permissive umask
    try:
        directory = jobdir.stage(tmp_path / "jobs", "j1", payload)
    finally:
        os.umask(old)
    assert directory.stat().st_mode & 0o777 == 0o700
    private = directory / jobdir.PRIVATE_FILE
    assert private.stat().st_mode & 0o777 == 0o600
    back = jobdir.read_private(directory)
    assert back == payload and dict(back.env) == {"HF_TOKEN": "hf_x", "N": "1"}
    assert not list(directory.glob(".private*"))


def test_no_values_in_the_payloads_repr():
    text = repr(PrivatePayload(node="w1", token="tok-secret", env={"HF_TOKEN": "hf_secret"}))
    assert "w1" in text and "secret" not in text


def test_no_or_foreign_private_file_means_nothing_private(tmp_path):
    assert jobdir.read_private(tmp_path) is None
    for text in ("not json", json.dumps({"token": "tok-xyz", "node": "n"}), "[" * 5000):
        (tmp_path / jobdir.PRIVATE_FILE).write_text(text)
        assert jobdir.read_private(tmp_path) is None


@pytest.mark.parametrize(
    "data, culprit",
    [
        ({"schema": 1, "node": "", "token": "tok-xyz", "env": {}}, "'node' and 'token'"),
        ({"schema": 1, "node": "n", "token": "tok-xyz", "env": ["HF_TOKEN"]}, "'env'"),
        ({"schema": 1, "node": "n", "token": "tok-xyz", "env": {"N": 1}}, "'env'"),
        ({"schema": 2, "node": "n", "token": "tok-xyz", "env": {}}, "same image"),
    ],
)
def test_a_bad_payload_names_its_field_and_never_its_values(data, culprit):
    with pytest.raises(PrivatePayloadError) as error:
        PrivatePayload.from_json(json.dumps(data))
    assert culprit in str(error.value) and "tok-xyz" not in str(error.value)

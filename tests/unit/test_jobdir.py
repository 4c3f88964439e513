"""The job directory's private file: owner-only from the first byte, typed, read back by the agent."""

from __future__ import annotations

import json
import os
import secrets

import pytest
from gaudi_cluster.errors import ConfigError
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


PAYLOAD = PrivatePayload(node="worker-1", token="k" * 64, env={"HF_TOKEN": "hf_planted"})


def test_a_symlinked_job_directory_is_refused_and_nothing_lands_in_its_target(tmp_path):
    """Someone who can write the job root plants the job's directory as a link to theirs."""
    target = tmp_path / "attacker"
    target.mkdir()
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "j1").symlink_to(target)
    with pytest.raises(ConfigError) as error:
        jobdir.stage(tmp_path / "jobs", "j1", PAYLOAD)
    message = str(error.value)
    assert "\n" not in message and "a symlink" in message and "fix: remove" in message
    assert list(target.iterdir()) == []


def test_a_job_directory_made_by_someone_else_or_open_to_others_is_refused(tmp_path):
    root = tmp_path / "jobs"
    (root / "theirs").mkdir(parents=True)
    os.chown(root / "theirs", 4321, 4321)  # the tests run as root: another user's directory
    (root / "open").mkdir(mode=0o777)
    (root / "open").chmod(0o777)
    for name in ("theirs", "open"):
        with pytest.raises(ConfigError, match=f"job directory {root / name} was not made by us"):
            jobdir.create(root, name)
        assert list((root / name).iterdir()) == []
    assert jobdir.create(root, "ours").stat().st_mode & 0o777 == 0o700
    assert jobdir.create(root, "ours").is_dir()  # ours, again (the agent after the probe): kept


def test_a_job_root_others_can_write_is_refused_unless_sticky(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigError) as error:
        jobdir.create(shared, "j1")
    assert "job root" in str(error.value) and "chmod go-w" in str(error.value)
    assert not (shared / "j1").exists()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    os.chown(foreign, 4321, 4321)
    with pytest.raises(ConfigError, match="owner uid 4321"):
        jobdir.create(foreign, "j1")
    shared.chmod(0o1777)  # like /tmp: others cannot rename or remove what we make in it
    assert jobdir.create(shared, "j1").stat().st_mode & 0o777 == 0o700


def test_a_planted_link_at_the_private_file_is_replaced_not_followed(tmp_path):
    directory = jobdir.create(tmp_path / "jobs", "j1")
    outside = tmp_path / "outside.json"
    outside.write_text("theirs")
    (directory / jobdir.PRIVATE_FILE).symlink_to(outside)
    jobdir.write_private(directory, PAYLOAD)
    assert outside.read_text() == "theirs"
    private = directory / jobdir.PRIVATE_FILE
    assert not private.is_symlink() and private.stat().st_mode & 0o777 == 0o600
    assert jobdir.read_private(directory) == PAYLOAD


def test_the_temporary_file_is_never_one_that_was_there(tmp_path, monkeypatch):
    """O_EXCL|O_NOFOLLOW: a link planted at the temporary name is refused, its target untouched."""
    directory = jobdir.create(tmp_path / "jobs", "j1")
    outside = tmp_path / "outside.json"
    outside.write_text("theirs")
    monkeypatch.setattr(secrets, "token_hex", lambda _n: "fixed")  # jobdir imports it where used
    (directory / f".{jobdir.PRIVATE_FILE}.{os.getpid()}.fixed").symlink_to(outside)
    with pytest.raises(FileExistsError):
        jobdir.write_private(directory, PAYLOAD)
    assert outside.read_text() == "theirs"
    assert not (directory / jobdir.PRIVATE_FILE).exists()


def test_a_pid_file_is_never_seen_half_written(tmp_path):
    """A reap reading a rank's pid file while its agent writes it must find the whole line: an empty
    read (a plain write's truncation) would skip that rank and leave it running."""
    import threading

    path = tmp_path / "rank0.pid"
    jobdir.write_pid_file(path, 100, 200)
    stop = threading.Event()

    def rewrite() -> None:
        while not stop.is_set():
            jobdir.write_pid_file(path, 100, 200)

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        seen = {path.read_text() for _ in range(5_000)}
    finally:
        stop.set()
        writer.join()
    assert seen == {"100 200\n"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.pid"]  # no temporary left, none a *.pid

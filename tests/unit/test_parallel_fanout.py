"""Fan-out to every node at once from one thread (nodes/parallel), through a fake ssh on PATH."""

from __future__ import annotations

import json
import os
import shlex
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from gaudi_cluster.nodes import parallel, ssh

# The fake takes ssh's argv (-F CONFIG [-o ...] -- HOST COMMAND); what it does depends on the host.
FAKE_SSH = """#!/bin/sh
while [ "$1" != "--" ]; do
    [ "$1" = "-O" ] && echo "$2" >>"$FAKE_SSH_LOG.ops"
    shift
done
host="$2"
echo "$host" >>"$FAKE_SSH_LOG"
case "$host" in
    refused*) echo "ssh: connect to host $host port 3022: Connection refused" >&2; exit 255 ;;
    hangs*) exec sleep 600 ;;
    stdin*) cat; exit 0 ;;
    record*) cat >"$FAKE_SSH_LOG.$host.stdin"; printf '%s' "$3" >"$FAKE_SSH_LOG.$host.cmd"; exit 0 ;;
esac
sleep "${FAKE_SSH_SLEEP:-0}"
echo "ran on $host: $3"
"""


@pytest.fixture
def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "ssh"
    script.write_text(FAKE_SSH)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_SSH_LOG", str(log))
    return log


@pytest.mark.timeout(60)  # 200 hosts one after another, or in rounds of a pool of 64, would take 400 s or 8 s
def test_two_hundred_slow_hosts_finish_together(fake_ssh: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FAKE_SSH_SLEEP", "2")
    hosts = [f"node-{i}" for i in range(198)] + ["refused-1", "refused-2"]
    results = ssh.run_on_hosts(hosts, ["reap", "--job-id", "j 1"], Path("/cfg"), timeout_s=20)
    assert list(results) == hosts
    assert all(
        results[h].ok and results[h].stdout == f"ran on {h}: reap --job-id 'j 1'\n" for h in hosts[:198]
    )
    assert [h for h, r in results.items() if not r.ok] == ["refused-1", "refused-2"]
    assert "Connection refused" in ssh.explain_ssh_failure(results["refused-2"], 3022) or (
        "nothing listens on port 3022" in ssh.explain_ssh_failure(results["refused-2"], 3022)
    )
    assert sorted(fake_ssh.read_text().split()) == sorted(hosts)


@pytest.mark.timeout(60)
def test_a_window_smaller_than_the_hosts_still_runs_each_once(
    fake_ssh: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("FAKE_SSH_SLEEP", "0.2")
    commands = {f"node-{i}": ["ssh", "-F", "/cfg", "--", f"node-{i}", "x"] for i in range(30)}
    results = parallel.run_all(commands, timeout_s=20, window=4)
    assert {key: r.stdout for key, r in results.items()} == {key: f"ran on {key}: x\n" for key in commands}
    assert sorted(fake_ssh.read_text().split()) == sorted(commands)


@pytest.mark.timeout(60)
def test_each_host_gets_its_own_stdin_and_a_hung_one_is_cut_at_its_deadline(fake_ssh: Path):
    hosts = ["stdin-a", "stdin-b", "hangs-1", "node-1"]
    big = "x" * 300_000  # more than a pipe holds: written without blocking, a piece at a time
    results = ssh.run_on_hosts(hosts, ["probe"], Path("/cfg"), timeout_s=3, stdin=lambda h: f"{h}:{big}")
    assert results["stdin-a"].stdout == f"stdin-a:{big}" and results["stdin-b"].stdout == f"stdin-b:{big}"
    assert results["hangs-1"].returncode == 124 and "timed out after 3s" in results["hangs-1"].stderr
    assert "is up and reachable" in ssh.explain_ssh_failure(results["hangs-1"], 3022)
    assert results["node-1"].ok


@pytest.mark.timeout(60)
def test_connections_open_and_close_on_every_host(fake_ssh: Path):
    hosts = [f"node-{i}" for i in range(50)] + ["refused-1"]
    assert ssh.open_connections(hosts, Path("/cfg"), timeout_s=10) == ["refused-1"]
    ssh.close_connections(hosts, Path("/cfg"))
    assert Path(f"{fake_ssh}.ops").read_text().split().count("exit") == len(hosts)


def test_a_missing_program_is_a_result_not_an_exception():
    results = parallel.run_all({"a": ["/nonexistent/ssh", "x"]}, timeout_s=5)
    assert results["a"].returncode == 127 and "could not start" in results["a"].stderr


def _fake_sshd(greeting: bytes) -> tuple[int, threading.Event]:
    server = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.sendall(greeting)
            conn.close()
        server.close()

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1], done


@pytest.mark.timeout(60)
def test_greeters_tells_an_sshd_from_a_silent_port_and_a_bad_name():
    sshd_port, stop_sshd = _fake_sshd(b"SSH-2.0-OpenSSH_9.6\r\n")
    other_port, stop_other = _fake_sshd(b"HTTP/1.1 400\r\n")
    try:
        assert parallel.greeters(["127.0.0.1", "localhost"], sshd_port) == {"127.0.0.1", "localhost"}
        assert parallel.greeters(["127.0.0.1", "no-such-host.invalid"], other_port, timeout_s=1) == set()
        began = time.monotonic()
        assert ssh.wait_for_sshd(["127.0.0.1"], sshd_port, deadline=began + 30) == []
        assert ssh.wait_for_sshd(["127.0.0.1"], other_port, deadline=time.monotonic()) == ["127.0.0.1"]
    finally:
        stop_sshd.set()
        stop_other.set()


@pytest.mark.timeout(60)
def test_the_job_ssh_config_is_staged_at_the_same_path_on_other_nodes(fake_ssh: Path, tmp_path: Path):
    job_dir = tmp_path / "jobs" / "j1"
    job_dir.mkdir(parents=True)
    config = ssh.write_ssh_config(job_dir, 3022, None, host_trust="@cert-authority * ssh-ed25519 AAAAkey")
    failed = ssh.share_client_config(["record-1", "refused-1"], config, sys.executable, 3022)
    assert list(failed) == ["refused-1"] and "nothing listens on port 3022" in failed["refused-1"]
    # What reached record-1, run here into another directory: both files, owner-only, same text.
    remote = shlex.split(Path(f"{fake_ssh}.record-1.cmd").read_text())
    assert remote[-1] == str(job_dir)
    elsewhere = tmp_path / "node-1" / "jobs" / "j1"
    stdin = Path(f"{fake_ssh}.record-1.stdin").read_text()
    subprocess.run([*remote[:-1], str(elsewhere)], input=stdin, text=True, check=True)
    for name in ("ssh_config", "known_hosts"):
        assert (elsewhere / name).read_text() == (job_dir / name).read_text()
        assert (elsewhere / name).stat().st_mode & 0o077 == 0
    assert (elsewhere / "known_hosts").read_text() == "@cert-authority * ssh-ed25519 AAAAkey\n"


def test_the_staging_script_refuses_a_planted_directory_and_writes_nothing_through_a_link(tmp_path: Path):
    """What share_client_config runs on a node, run here: a job directory that is a symlink (or open to
    others) is refused before anything is written, so the file never lands in the link's target."""
    target = tmp_path / "attacker"
    target.mkdir()
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "j1").symlink_to(target)
    files = json.dumps({"known_hosts": "@cert-authority * ssh-ed25519 AAAAkey\n"})
    done = subprocess.run(
        [sys.executable, "-c", ssh._WRITE_FILES, str(tmp_path / "jobs" / "j1")],
        input=files, text=True, capture_output=True, check=False,
    )  # fmt: skip
    assert done.returncode == 1 and "fix: remove it" in done.stderr
    assert list(target.iterdir()) == []

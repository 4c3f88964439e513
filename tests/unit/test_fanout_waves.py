"""The direct launcher's fan-out (launch.fanout) over a recording stand-in for ssh: the sessions of
nodes that hand over are opened in waves, the others all at once, and a failure starts no new wave."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from gaudi_cluster.launch import fanout
from gaudi_cluster.wire.node_spec import FANOUT_MODULE, FanoutSpec, NodeEntry, NodeSpec

SPEC = NodeSpec(
    node_rank=0, nnodes=1, first_rank=0, slots=(0,), world_size=1, master_addr="10.0.0.1",
    master_port=29500, cwd="/w", env={}, python="/p", agent_args=("--", "prog"),
)  # fmt: skip

# Each session marks itself open, notes how many are open, holds HOLD_S (or, with WAIT_ALL, until
# every session of the launch has started), closes its mark and ends: 3 for a host named bad-*.
SESSION = """#!/bin/sh
for last; do :; done
while [ $# -gt 1 ]; do case $1 in --) shift; break ;; esac; shift; done
host=$1
cat >"$REC/spec-$host.json"
: >"$REC/open/$host"
ls "$REC/open" | wc -l >>"$REC/counts"
: >"$REC/started/$host"
if [ -n "$WAIT_ALL" ]; then
  i=0
  while [ "$(ls "$REC/started" | wc -l)" -lt "$WAIT_ALL" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done
else
  sleep "$HOLD_S"
fi
rm -f "$REC/open/$host"
case $host in bad-*) exit 3 ;; esac
exit 0
"""


def fake(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    bin_dir, rec = tmp_path / "bin", tmp_path / "rec"
    for folder in (bin_dir, rec / "open", rec / "started"):
        folder.mkdir(parents=True)
    ssh = bin_dir / "ssh"
    ssh.write_text(SESSION)
    ssh.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "REC": str(rec), "HOLD_S": "0.3"}
    return rec, env


def launch(hosts: list[str], hand_over: bool) -> FanoutSpec:
    spec = dataclasses.replace(SPEC, hand_over=hand_over)
    nodes = tuple(NodeEntry(h, False, spec) for h in hosts)
    return FanoutSpec(python="/p", ssh_config="/j/ssh_config", nodes=nodes)


def run(spec: FanoutSpec, env: dict[str, str], wave: int) -> int:
    """The fan-out in its own process (it waits for any child), with `wave` sessions at a time."""
    code = (f"import sys; from {FANOUT_MODULE} import launch_all;"
            " from gaudi_cluster.wire.node_spec import FanoutSpec;"
            f" sys.exit(launch_all(FanoutSpec.from_json(sys.stdin.read()), {wave}))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], input=spec.to_json(), text=True, env=env, timeout=60,
                          capture_output=True, check=False)  # fmt: skip
    return done.returncode


def counts(rec: Path) -> list[int]:
    return [int(line) for line in (rec / "counts").read_text().split()]


def test_handing_over_sessions_open_a_wave_at_a_time_and_every_node_gets_its_spec(tmp_path):
    rec, env = fake(tmp_path)
    hosts = [f"n{i}" for i in range(10)]
    assert run(launch(hosts, hand_over=True), env, wave=3) == 0
    assert sorted(os.listdir(rec / "started")) == sorted(hosts)
    assert max(counts(rec)) == 3  # never more than the wave, and the wave was filled
    assert all(json.loads((rec / f"spec-{h}.json").read_text())["hand_over"] for h in hosts)


def test_sessions_that_hold_for_the_job_all_start_at_once(tmp_path):
    rec, env = fake(tmp_path)
    hosts = [f"n{i}" for i in range(6)]
    env["WAIT_ALL"] = "6"  # each session ends only once all six have started: a wave of 3 would hang
    assert run(launch(hosts, hand_over=False), env, wave=3) == 0
    assert max(counts(rec)) == 6


def test_a_failed_session_starts_no_further_wave_and_its_code_is_the_launchs(tmp_path):
    rec, env = fake(tmp_path)
    hosts = ["bad-0", *(f"n{i}" for i in range(1, 10))]
    assert run(launch(hosts, hand_over=True), env, wave=2) == 3
    started = os.listdir(rec / "started")
    assert "bad-0" in started and len(started) < len(hosts)


def test_the_default_wave_bounds_a_thousand_nodes_sessions_under_the_fleet_budget():
    """1,000 control masters and a wave of sessions at a real client's RSS stay under 4 GB."""
    measured = json.loads((Path(__file__).parents[2] / "bench" / "results" / "ssh_client.json").read_text())
    peak = 1000 * measured["control_master"]["rss_mb"] + fanout.LAUNCH_WAVE * measured["session"]["rss_mb"]
    assert fanout.LAUNCH_WAVE >= 16 and peak < 4096 - 128

"""The rank agent's output directory: named by the master (--output-dir), else read off the program."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from gaudi_cluster.rank import agent
from gaudi_cluster.rank.conventions import output_dir_in


@pytest.mark.parametrize(
    ("program", "found"),
    [
        pytest.param(["p.py", "--output_dir", "/out", "--lr", "1"], "/out", id="spaced"),
        pytest.param(["p.py", "--output_dir=/out", "--lr", "1"], "/out", id="equals"),
        pytest.param(["p.py", "--output_dir=/a=b"], "/a=b", id="equals-in-value"),
        pytest.param(["p.py", "--lr", "1"], None, id="absent"),
        pytest.param(["p.py", "--output_dir"], None, id="no-value"),
        pytest.param(["p.py", "--output_dir_extra", "/x"], None, id="other-flag"),
    ],
)
def test_output_dir_in_reads_both_spellings(program, found):
    assert output_dir_in(program) == found


def rank_agent(tmp_path: Path, program: list[str], output_dir: str | None) -> agent.RankAgent:
    return agent.RankAgent("j1", program, None, tmp_path / "jobs", 10.0, output_dir=output_dir)


def test_the_masters_output_dir_wins_over_the_programs(tmp_path):
    named = rank_agent(tmp_path, ["p.py", "--output_dir=/from-program"], "/from-master")
    assert named.output_dir == "/from-master"
    assert rank_agent(tmp_path, ["p.py", "--output_dir=/from-program"], None).output_dir == "/from-program"
    assert rank_agent(tmp_path, ["p.py"], None).output_dir == os.getcwd()


def test_a_full_disk_is_named_where_the_job_writes(tmp_path, monkeypatch):
    rank = rank_agent(tmp_path, ["p.py", "--output_dir=/elsewhere"], str(tmp_path))
    asked, said = [], []
    monkeypatch.setattr(rank, "say", said.append)

    def disk_usage(path: str) -> SimpleNamespace:
        asked.append(path)
        return SimpleNamespace(total=1 << 30, used=(1 << 30) - 100, free=100)

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    rank._note_full_disk()
    assert asked == [str(tmp_path)]
    assert said == [f"No space left on device: {tmp_path} has less than 1 MiB free on {rank.host}"]


def test_main_passes_output_dir_to_the_agent(monkeypatch, tmp_path):
    seen: dict[str, object] = {}

    class Recorder:
        def __init__(self, *args: object, **kwargs: object) -> None:
            seen.update(args=args, **kwargs)

        def run(self) -> int:
            return 0

    monkeypatch.setattr(agent, "RankAgent", Recorder)
    argv = ["--job-id", "j1", "--job-root", str(tmp_path), "--heartbeat-timeout", "10"]
    assert agent.main([*argv, "--output-dir", "/out dir", "--", "p.py", "--output_dir=/x"]) == 0
    assert seen["output_dir"] == "/out dir"
    assert seen["args"][1] == ["p.py", "--output_dir=/x"]
    assert agent.main([*argv, "--", "p.py"]) == 0
    assert seen["output_dir"] is None


def test_an_agent_in_the_node_process_runs_with_the_given_environment_and_directory(tmp_path):
    """In the node process (launch/node under srun) the agent takes its rank's environment and
    directory as given, not the process's, and touches no process-wide signal handler."""
    import signal

    before = signal.getsignal(signal.SIGTERM)
    work = tmp_path / "work"
    work.mkdir()
    program = ["sh", "-c", 'echo "$RANK $LOCAL_RANK $PWD" > seen']
    env = {"PATH": os.environ["PATH"], "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}
    argv = [
        "--job-id",
        "j1",
        "--job-root",
        str(tmp_path / "jobs"),
        "--heartbeat-timeout",
        "10",
        "--",
        *program,
    ]
    built = agent.build(argv, env=env, cwd=str(work), in_node=True)
    assert built.run() == 0
    assert (work / "seen").read_text().split() == ["5", "1", str(work)]
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_forwarded_before_the_rank_starts_keeps_it_from_starting(tmp_path):
    import signal

    program = ["sh", "-c", "touch started"]
    argv = [
        "--job-id",
        "j1",
        "--job-root",
        str(tmp_path / "jobs"),
        "--heartbeat-timeout",
        "10",
        "--",
        *program,
    ]
    env = {"PATH": os.environ["PATH"], "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    built = agent.build(argv, env=env, cwd=str(tmp_path), in_node=True)
    built.on_signal(signal.SIGTERM)  # the node process forwards scancel's SIGTERM
    assert built.run() == 128 + signal.SIGTERM
    assert not (tmp_path / "started").exists()


def test_the_ranks_deepspeed_shm_buffer_goes_when_it_exits(tmp_path, monkeypatch):
    """DeepSpeed's CPU all-reduce buffer (67 MB in /dev/shm, never unlinked by DeepSpeed) goes with
    its rank; another rank's, or another job's, stays."""
    monkeypatch.setattr(agent, "SHM_DIR", tmp_path / "shm")
    (tmp_path / "shm").mkdir()
    env = {"PATH": os.environ["PATH"], "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29611"}  # fmt: skip
    prefix = f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1"
    mine, peer, other_job = f"{prefix}_29611_1", f"{prefix}_29611_0", f"{prefix}_29612_1"
    program = ["sh", "-c", f"touch {' '.join(str(tmp_path / 'shm' / n) for n in (mine, peer, other_job))}"]
    argv = ["--job-id", "j1", "--job-root", str(tmp_path / "jobs"), "--heartbeat-timeout", "10", "--"]
    assert agent.build([*argv, *program], env=env, cwd=str(tmp_path), in_node=True).run() == 0
    assert sorted(p.name for p in (tmp_path / "shm").iterdir()) == sorted([peer, other_job])

"""Pure pieces of the master flow: the job's program, the device kind, env policy, outcome and restarts."""

from __future__ import annotations

import dataclasses

import pytest
from gaudi_cluster.env.jobenv import auto_preset, collective_timeouts, job_env
from gaudi_cluster.launch.program import (
    DEFAULT_SCRIPT,
    default_program,
    output_dir,
    program_from_args,
    required_paths,
    resolve_accelerator,
)
from gaudi_cluster.settings import config as config_module
from gaudi_cluster.settings.config import ClusterConfig, parse_bool
from gaudi_cluster.supervise.outcome import JobOutcome, JobState, RankFailure, should_restart

PY = "/opt/venv/bin/python"


@pytest.mark.parametrize(
    ("requested", "environ", "report", "expected"),
    [
        ("hpu", {"DS_ACCELERATOR": "cpu"}, {"accelerator": "cpu"}, "hpu"),
        ("auto", {"DS_ACCELERATOR": "hpu"}, {"accelerator": "cpu"}, "cpu"),
        ("auto", {"DS_ACCELERATOR": "hpu"}, None, "hpu"),
        ("auto", {}, {}, "cpu"),
    ],
)
def test_resolve_accelerator(requested, environ, report, expected):
    assert resolve_accelerator(requested, environ, report) == expected


def test_default_program_per_device():
    cpu = default_program(PY, "cpu", {"GAUDI_CLUSTER_OUTPUT_DIR": "/out"})
    assert cpu[:3] == [PY, "-u", str(DEFAULT_SCRIPT)]
    assert "ds_cpu" in cpu and "/out" in cpu and "--use_habana" not in cpu
    hpu = default_program(PY, "hpu", {})
    assert "ds_zero1_bf16" in hpu and "/workspace/output" in hpu
    assert hpu[-4:] == ["--use_habana", "--use_lazy_mode", "--gaudi_config_name", "Habana/gpt2"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["train.py", "--a"], [PY, "-u", "/w/train.py", "--a"]),
        (["--", "-m", "pkg.mod", "x"], [PY, "-u", "-m", "pkg.mod", "x"]),
        (["bash", "-c", "true"], ["bash", "-c", "true"]),
    ],
)
def test_program_from_args(argv, expected, monkeypatch):
    monkeypatch.chdir("/")
    monkeypatch.setattr("os.path.abspath", lambda p: "/w/" + p)
    assert program_from_args(argv, PY, "cpu", {}) == expected


def test_required_paths_are_the_cwd_script_and_absolute_program():
    assert required_paths([PY, "-u", "/w/a.py", "b.py"], "/w") == ["/w", "/w/a.py", PY]
    assert required_paths(["bash", "-c", "x"], "/w") == ["/w"]


def test_output_dir_is_the_programs_then_the_clusters_then_the_working_dir(monkeypatch, tmp_path):
    assert output_dir([PY, "t.py", "--output_dir", "/o"], {"GAUDI_CLUSTER_OUTPUT_DIR": "/c"}) == "/o"
    assert output_dir([PY, "t.py", "--output_dir=/o"], {}) == "/o"
    assert output_dir([PY, "t.py"], {"GAUDI_CLUSTER_OUTPUT_DIR": "/c"}) == "/c"
    # In the image the output volume exists; on a host it does not and is never created for a report.
    monkeypatch.setattr("gaudi_cluster.launch.program.DEFAULT_OUTPUT", str(tmp_path / "output"))
    assert output_dir([PY, "t.py"], {}, cwd="/home/u/job") == "/home/u/job"
    (tmp_path / "output").mkdir()
    assert output_dir([PY, "t.py"], {}, cwd="/home/u/job") == str(tmp_path / "output")


@pytest.mark.parametrize(
    ("accelerator", "report", "preset"),
    [
        ("cpu", {}, "cpu"),
        ("hpu", {"uverbs_devices": ["/dev/infiniband/uverbs0"], "efa_provider": True}, "efa"),
        ("hpu", {"uverbs_devices": ["/dev/infiniband/uverbs0"], "efa_provider": False}, "gaudinic"),
        ("hpu", {}, "gaudinic"),
        ("cuda", {}, "none"),
    ],
)
def test_auto_preset(accelerator, report, preset):
    assert auto_preset(accelerator, report) == preset


def test_collective_timeouts_and_job_env():
    assert collective_timeouts("cpu")["DEEPSPEED_TIMEOUT"] == "5"
    assert collective_timeouts("hpu")["DEEPSPEED_TIMEOUT"] == "30"
    env = job_env(
        preset="auto",
        accelerator="cpu",
        master_report={},
        environ={"HCCL_X": "1"},
        socket_ifname="eth0",
        extra={"DEEPSPEED_TIMEOUT": "9"},
    ).as_dict()
    assert env == {
        "DEEPSPEED_TIMEOUT": "9",
        "DS_ACCELERATOR": "cpu",
        "GLOO_SOCKET_IFNAME": "eth0",
        "HCCL_X": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }


FAILURE = RankFailure("worker-1", 2, "exited with code 3", 3)


def test_outcomes_carry_their_state_and_code():
    assert JobOutcome.succeeded({}).state is JobState.SUCCEEDED
    failed = JobOutcome.failed(FAILURE, {0: "a"})
    assert (failed.state, failed.exit_code, failed.leaves_processes) == (JobState.FAILED, 3, True)
    stopped = JobOutcome.stopped(15, {})
    assert (stopped.state, stopped.exit_code, stopped.stop_signal) == (JobState.STOPPED, 143, 15)
    assert not JobOutcome.succeeded({}).leaves_processes


@pytest.mark.parametrize(
    ("outcome", "attempt", "max_restarts", "again"),
    [
        (JobOutcome.failed(FAILURE, {}), 1, 1, True),
        (JobOutcome.failed(FAILURE, {}), 2, 1, False),
        (JobOutcome.failed(FAILURE, {}), 1, 0, False),
        # A rank that died by SIGTERM (OOM killer, a stopped worker) is a failure, not the user's stop.
        (JobOutcome.failed(RankFailure("w", 1, "was killed by SIGTERM", 143), {}), 1, 1, True),
        (JobOutcome.stopped(15, {}), 1, 3, False),
        (JobOutcome.stopped(1, {}), 1, 3, False),  # SIGHUP: a stop, never a restart
        (JobOutcome.succeeded({}), 1, 3, False),
    ],
)
def test_restart_policy_reads_the_state(outcome, attempt, max_restarts, again):
    assert should_restart(outcome, attempt, max_restarts) is again


def test_every_setting_is_declared_once_with_its_metadata():
    for field in dataclasses.fields(ClusterConfig):
        assert {"parse", "help", "example", "switch"} <= set(field.metadata), field.name
    assert [s.name for s in config_module.SETTINGS] == [f.name for f in dataclasses.fields(ClusterConfig)]
    assert {s.name: s.default for s in config_module.SETTINGS} == dataclasses.asdict(ClusterConfig())


@pytest.mark.parametrize(
    ("word", "value"), [("1", True), ("YES", True), (" on", True), ("0", False), ("", False)]
)
def test_one_set_of_true_words(word, value):
    assert parse_bool(word) is value


def test_examples_parse_with_their_own_parser():
    for setting in config_module.SETTINGS:
        setting.parse(setting.example)

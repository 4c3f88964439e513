"""Pure pieces of the master flow: the job's program, the device kind, env policy, outcome and restarts."""

from __future__ import annotations

import dataclasses

import pytest
from gaudi_cluster.env.jobenv import choose_preset, collective_timeouts, job_env
from gaudi_cluster.launch.program import (
    DEFAULT_OUTPUT,
    DEFAULT_SCRIPT,
    default_program,
    output_dir,
    program_from_args,
    required_paths,
)
from gaudi_cluster.nodes.devices import resolve_accelerator
from gaudi_cluster.settings import config as config_module
from gaudi_cluster.settings.config import ClusterConfig, parse_bool
from gaudi_cluster.supervise.outcome import FailureCause, JobOutcome, JobState, RankFailure, should_restart
from gaudi_cluster.wire.node_report import NodeReport

from tests.support.reports import as_report

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
    assert resolve_accelerator(requested, environ, None if report is None else as_report(report)) == expected


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
def test_program_from_args(argv, expected):
    assert program_from_args(argv, PY, "cpu", {}, "/w") == expected
    assert program_from_args(["../x/t.py"], PY, "cpu", {}, "/w/a")[2] == "/w/x/t.py"


def test_required_paths_are_the_cwd_script_and_absolute_program():
    assert required_paths([PY, "-u", "/w/a.py", "b.py"], "/w") == ["/w", "/w/a.py", PY]
    assert required_paths(["bash", "-c", "x"], "/w") == ["/w"]


def test_output_dir_is_the_programs_then_the_clusters_then_the_working_dir():
    here = "/home/u/job"
    assert (
        output_dir([PY, "t.py", "--output_dir", "/o"], {"GAUDI_CLUSTER_OUTPUT_DIR": "/c"}, here, True) == "/o"
    )
    assert output_dir([PY, "t.py", "--output_dir=/o"], {}, here, True) == "/o"
    assert output_dir([PY, "t.py"], {"GAUDI_CLUSTER_OUTPUT_DIR": "/c"}, here, True) == "/c"
    # In the image the output volume exists; on a host it does not and is never created for a report.
    assert output_dir([PY, "t.py"], {}, here, output_volume=False) == here
    assert output_dir([PY, "t.py"], {}, here, output_volume=True) == DEFAULT_OUTPUT


UVERBS = ("/dev/infiniband/uverbs0",)


@pytest.mark.parametrize(
    ("accelerator", "report", "preset"),
    [
        ("cpu", None, "cpu"),
        ("hpu", NodeReport("hpu", 8, uverbs_devices=UVERBS, fi_providers={"efa": True}), "efa"),
        ("hpu", NodeReport("hpu", 8, uverbs_devices=UVERBS, fi_providers={"efa": False}), "gaudinic"),
        ("hpu", NodeReport("hpu", 8), "gaudinic"),
        ("hpu", None, "gaudinic"),
        ("cuda", None, "none"),
    ],
)
def test_auto_preset(accelerator, report, preset):
    assert choose_preset("auto", accelerator, report)[0] == preset


def test_collective_timeouts_and_job_env():
    assert collective_timeouts("cpu")["DEEPSPEED_TIMEOUT"] == "5"
    assert collective_timeouts("hpu")["DEEPSPEED_TIMEOUT"] == "30"
    env = job_env(
        preset="auto",
        accelerator="cpu",
        master_report=None,
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


FAILURE = RankFailure.exited("worker-1", 2, 3)


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
        (JobOutcome.failed(RankFailure.signalled("w", 1, 15, 143), {}), 1, 1, True),
        (JobOutcome.stopped(15, {}), 1, 3, False),
        (JobOutcome.stopped(1, {}), 1, 3, False),  # SIGHUP: a stop, never a restart
        (JobOutcome.succeeded({}), 1, 3, False),
    ],
)
def test_restart_policy_reads_the_state(outcome, attempt, max_restarts, again):
    assert should_restart(outcome, attempt, max_restarts) is again


@pytest.mark.parametrize(
    ("failure", "cause", "what", "code"),
    [
        (RankFailure.exited("w", 1, 3), FailureCause.EXITED, "exited with code 3", 3),
        (RankFailure.signalled("w", 1, 9, 137), FailureCause.SIGNALLED, "was killed by SIGKILL", 137),
        (
            RankFailure.lost("w", 1, "connection closed"),
            FailureCause.LOST_CONTACT,
            "lost contact: connection closed",
            1,
        ),
        (
            RankFailure.stuck("w", 1, 7, 601.2, 600),
            FailureCause.STUCK,
            "is stuck at step 7: no progress for 601s (GAUDI_CLUSTER_STUCK_TIMEOUT=600)",
            1,
        ),
        (RankFailure.stuck("w", 1, None, 9, 5), FailureCause.STUCK, "is stuck: no progress for 9s", 1),
        (
            RankFailure.never_started("w (1 of 2)", 1, 2, 120),
            FailureCause.NEVER_STARTED,
            "ranks never checked in within 120s (1 of 2 did)",
            1,
        ),
        (
            RankFailure.launcher_ended(255, 1, 2),
            FailureCause.LAUNCHER,
            "launcher exited with code 255 after 1 of 2 ranks finished",
            255,
        ),
        (
            RankFailure.launcher_ended(0, 1, 2),
            FailureCause.LAUNCHER,
            "launcher ended but only 1 of 2 ranks reported success",
            1,
        ),
        (RankFailure.launcher_ended(-9, 0, 2), FailureCause.LAUNCHER, "launcher exited with code -9", 1),
    ],
)
def test_each_failure_names_its_cause_and_keeps_its_words(failure, cause, what, code):
    assert failure.cause is cause and failure.what.startswith(what) and failure.exit_code == code
    assert failure.lost_contact is (cause is FailureCause.LOST_CONTACT)


def test_only_a_lost_contact_names_the_host_the_master_lost():
    assert JobOutcome.failed(RankFailure.lost("w2", 3, "no heartbeat for 9s"), {}).lost_host == "w2"
    assert JobOutcome.failed(FAILURE, {}).lost_host is None
    assert JobOutcome.stopped(15, {}).lost_host is None
    assert JobOutcome.succeeded({}).lost_host is None


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

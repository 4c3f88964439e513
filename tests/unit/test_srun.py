"""Under Slurm, Slurm starts the processes: the pure parts (nodes/srun), the bundle each task picks
from, and the worker that follows its master without sshd."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gaudi_cluster.engines.auto import MasterWatch
from gaudi_cluster.errors import ClusterNotReady, ConfigError
from gaudi_cluster.launch.node import read_spec
from gaudi_cluster.nodes import srun
from gaudi_cluster.nodes.handover import send_checkpoint
from gaudi_cluster.nodes.reach import LocalReach, SrunReach, SshReach
from gaudi_cluster.nodes.srun import SrunStep
from gaudi_cluster.nodes.survey import NodeSurvey
from gaudi_cluster.wire.node_report import NodeReport
from gaudi_cluster.wire.node_spec import FanoutSpec, NodeEntry, NodeSpec
from gaudi_cluster.wire.private_payload import PayloadBundle, PrivatePayload, PrivatePayloadError

JOB = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[1-3]", "SLURM_JOB_NUM_NODES": "3"}


@pytest.mark.parametrize(
    ("env", "srun_path", "mode"),
    [
        pytest.param(JOB, "/usr/bin/srun", srun.SRUN, id="inside-with-srun"),
        pytest.param(JOB, None, srun.SSH, id="inside-without-srun"),  # docker and pyxis modes
        pytest.param({}, "/usr/bin/srun", srun.SSH, id="outside"),
        pytest.param({**JOB, srun.LAUNCH_VARIABLE: "ssh"}, "/usr/bin/srun", srun.SSH, id="forced-ssh"),
        pytest.param({**JOB, srun.LAUNCH_VARIABLE: "srun"}, "/usr/bin/srun", srun.SRUN, id="forced-srun"),
        pytest.param({**JOB, srun.LAUNCH_VARIABLE: " "}, "/usr/bin/srun", srun.SRUN, id="blank-is-auto"),
    ],
)
def test_the_launch_mode_is_srun_inside_an_allocation_with_srun(env, srun_path, mode):
    assert srun.launch_mode(env, srun_path) == mode


@pytest.mark.parametrize(
    ("env", "srun_path", "match"),
    [
        (
            {**JOB, srun.LAUNCH_VARIABLE: "pdsh"},
            "/usr/bin/srun",
            "GAUDI_CLUSTER_SLURM_LAUNCH='pdsh'.*fix: auto",
        ),
        ({**JOB, srun.LAUNCH_VARIABLE: "srun"}, None, "no srun on PATH; fix:"),
        ({srun.LAUNCH_VARIABLE: "srun"}, "/usr/bin/srun", "not inside a Slurm allocation; fix:"),
    ],
)
def test_a_launch_mode_that_cannot_be_is_one_line_with_the_fix(env, srun_path, match):
    with pytest.raises(ConfigError, match=match):
        srun.launch_mode(env, srun_path)


def test_the_step_is_one_task_per_node_overlapping_the_main_step():
    argv = SrunStep("/usr/bin/srun", 42).argv(["node2", "node3"], "gc-probe", stdin=True, label=True)
    assert argv[0] == "/usr/bin/srun"
    for flag in ("--overlap", "--whole", "--jobid=42", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1"):
        assert flag in argv
    assert "--nodelist=node2,node3" in argv and "--input=all" in argv and "--label" in argv
    # One failed node must not kill the probe of the others; the master judges.
    assert "--kill-on-bad-exit=0" in argv
    quiet = SrunStep("/usr/bin/srun", 42).argv(["node2"], "gc-reap")
    assert "--input=none" in quiet and "--label" not in quiet
    with pytest.raises(ValueError):
        SrunStep("/usr/bin/srun", 42).argv([], "gc-reap")


def test_the_step_crosses_as_json():
    step = SrunStep("/usr/bin/srun", 7)
    assert SrunStep.from_json(step.to_json()) == step
    with pytest.raises(ValueError):
        SrunStep.from_json(json.dumps({"srun": "srun", "job_id": True}))


def test_step_for_follows_the_mode():
    assert srun.step_for(JOB, "/usr/bin/srun") == SrunStep("/usr/bin/srun", 42)
    assert srun.step_for(JOB, None) is None


LABELLED = """\
 1: gaudi-cluster-node node3
 1: {"host": "node3"}
srun: warning: something of srun's own
 0: warning from a library
 0: gaudi-cluster-node node1
 0: {"host": "node1"}
10: gaudi-cluster-node node11
10: not: a json line
10: {"host": "node11"}
"""


def test_labelled_output_is_split_by_the_node_each_task_names():
    assert sorted(srun.split_labelled(LABELLED)) == [0, 1, 10]
    found = srun.outputs_by_node(LABELLED)
    # Task 1 ran on node3: the order of the tasks is Slurm's, the names are the tasks' own.
    assert found == {
        "node3": ['{"host": "node3"}'],
        "node1": ['{"host": "node1"}'],
        "node11": ["not: a json line", '{"host": "node11"}'],
    }


def test_a_task_that_never_named_its_node_is_absent():
    assert srun.outputs_by_node(" 0: Traceback (most recent call last)\n 0: boom\n") == {}


def test_sruns_own_verdicts_are_read_by_node():
    stderr = (
        "srun: error: node3: task 2: Exited with exit code 1\n"
        "srun: error: node2: tasks 0-1: Killed\n"
        "srun: Job step aborted\n"
    )
    assert srun.task_errors(stderr) == {"node3": "Exited with exit code 1", "node2": "Killed"}


def test_a_task_picks_its_own_entry_by_its_slurm_node_name():
    entries = {"node1": 1, "node2": 2}
    assert srun.pick_own(entries, {"SLURMD_NODENAME": "node2"}) == "node2"
    assert srun.pick_own(entries, {"SLURMD_NODENAME": "node2.cluster.local"}) == "node2"
    with pytest.raises(ConfigError, match="no SLURMD_NODENAME here; fix:"):
        srun.pick_own(entries, {})
    with pytest.raises(ConfigError, match=r"node9.*not among the 2 nodes"):
        srun.pick_own(entries, {"SLURMD_NODENAME": "node9"})


def test_the_bundle_carries_each_node_its_payload_and_shows_no_key():
    bundle = PayloadBundle(
        {
            "node1": PrivatePayload("node1", "key-one", {"HF_TOKEN": "s1"}),
            "node2": PrivatePayload("node2", "key-two"),
        }
    )
    again = PayloadBundle.from_json(bundle.to_json())
    own = again.payloads[srun.pick_own(again.payloads, {"SLURMD_NODENAME": "node2"})]
    assert (own.node, own.token, dict(own.env)) == ("node2", "key-two", {})
    assert "key-one" not in repr(again) and "key-two" not in repr(again) and "s1" not in repr(again)
    for bad in ("{", json.dumps({"schema": 9, "nodes": {}}), json.dumps({"schema": 1, "nodes": {}})):
        with pytest.raises(PrivatePayloadError) as caught:
            PayloadBundle.from_json(bad)
        assert "key-" not in str(caught.value)


def _spec(node_rank: int) -> NodeSpec:
    return NodeSpec(
        node_rank=node_rank, nnodes=2, first_rank=node_rank, slots=(0,), world_size=2, master_addr="node1",
        master_port=61042, cwd="/w", env={}, python="/usr/bin/python3", agent_args=("--", "x"),
    )  # fmt: skip


def test_a_node_task_of_the_launch_step_takes_its_own_spec():
    launch = FanoutSpec(
        "/usr/bin/python3",
        "(none)",
        (NodeEntry("node1", False, _spec(0)), NodeEntry("node2", False, _spec(1))),
        srun=("/usr/bin/srun", "--overlap"),
    )
    text = launch.to_json()
    assert FanoutSpec.from_json(text).srun == ("/usr/bin/srun", "--overlap")
    assert read_spec(text, True, {"SLURMD_NODENAME": "node2"}).node_rank == 1
    assert read_spec(_spec(0).to_json(), False, {}).node_rank == 0
    with pytest.raises(ConfigError):
        read_spec(text, True, {"SLURMD_NODENAME": "node7"})


def test_a_worker_under_srun_never_knocks_and_never_times_out_on_its_own():
    watch = MasterWatch("node1", started_at=0.0, startup_timeout_s=10, gone_after_s=5, knocks=False)
    assert not watch.should_knock(agents_running=False)
    assert watch.observe(10_000.0, released=False, agents_running=False, master_answers=None) is None
    stopped = watch.observe(
        10_001.0, released=False, agents_running=False, master_answers=None, stop_requested=True
    )
    assert stopped is not None and stopped.exit_code == 0
    released = watch.observe(10_002.0, released=True, agents_running=True, master_answers=None)
    assert released is not None and released.exit_code == 0
    # Stopped while ranks still save their checkpoint: it waits for them.
    assert (
        watch.observe(1.0, released=False, agents_running=True, master_answers=None, stop_requested=True)
        is None
    )


def _survey(step: SrunStep | None, local: bool = False) -> NodeSurvey:
    reach = (
        SrunReach(step) if step else LocalReach() if local else SshReach(Path("/nonexistent/ssh_config"), 22)
    )
    return NodeSurvey(
        job_id="j", job_dir=Path("/nonexistent"), master_addr="node1", local_addr="10.0.0.1",
        socket_ifname=None, hosts=("node1", "node2"), requested_slots={}, paths=(),
        reports={h: NodeReport("cpu", 1, hostname=h) for h in ("node1", "node2")}, unreachable={},
        local=local, reach=reach,
    )  # fmt: skip


def test_the_survey_says_how_the_nodes_were_reached():
    assert _survey(SrunStep("/usr/bin/srun", 42)).reached_by() == "by srun (Slurm job 42)"
    assert _survey(None).reached_by() == "over ssh"
    assert _survey(None, local=True).reached_by() == "locally"


def test_a_newcomer_under_srun_stops_the_restart_with_the_fix_and_loses_no_checkpoint():
    # The copy from a remaining node is an ssh pipe: refused before anything is touched.
    with pytest.raises(ClusterNotReady, match=r"node2 take.*fix: GAUDI_CLUSTER_SLURM_LAUNCH=ssh"):
        send_checkpoint(_survey(SrunStep("/usr/bin/srun", 42)), ["node2"], "/out")
    assert send_checkpoint(_survey(SrunStep("/usr/bin/srun", 42)), [], "/out") == []

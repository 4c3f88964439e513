"""Which nodes the next attempt gets, and how its batch follows (launch/attempts, issue 28)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gaudi_cluster.errors import ClusterNotReady, ConfigError
from gaudi_cluster.launch.attempts import (
    AttemptPlan,
    BatchPlan,
    NodeSet,
    batch_plan,
    flag_value,
    plan_next,
    renamed,
    trainer_job,
    with_accumulation,
    zero_problem,
)
from gaudi_cluster.launch.restart import zero_stage
from gaudi_cluster.nodes.find import FoundNodes, with_spares
from gaudi_cluster.nodes.survey import NodeSurvey
from gaudi_cluster.settings.config import resolve_config
from gaudi_cluster.view.report import AttemptRecord
from gaudi_cluster.wire.node_report import NodeReport

SLOTS = {host: 8 for host in ("m", "a", "b", "c", "s1", "s2")}
TRAINER = ("python", "run_clm.py", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2")


def test_a_spare_takes_the_lost_nodes_place_in_its_rank_position_and_the_world_size_stays():
    plan = plan_next(NodeSet(("m", "a", "b"), ("s1", "s2")), {"a"}, None, SLOTS, TRAINER)
    assert plan.nodes == NodeSet(("m", "s1", "b"), ("s2",), ("a",))
    assert plan.replaced == (("a", "s1"),) and plan.dropped == () and plan.batch is None
    assert plan.newcomers == ("s1",)


def test_a_lost_spare_is_out_and_no_one_replaces_it():
    plan = plan_next(NodeSet(("m", "a"), ("s1", "s2")), {"s1"}, None, SLOTS)
    assert plan.nodes == NodeSet(("m", "a"), ("s2",), ("s1",)) and plan.newcomers == ()


def test_with_no_spare_left_the_job_shrinks_to_min_nodes_keeping_the_global_batch():
    plan = plan_next(NodeSet(("m", "a", "b", "c"), ("s1",)), {"a", "c"}, 2, SLOTS, TRAINER)
    assert plan.nodes.active == ("m", "s1", "b") and plan.dropped == ("c",)
    # 4 x 2 x 32 = 256 over 24 ranks: no whole accumulation keeps it (2.67 -> 3: 288)
    assert plan.batch == BatchPlan(4, 2, 3, 32, 24) and not plan.batch.exact
    assert "global batch 256 changed to 288" in plan.batch.line()


def test_halving_the_nodes_doubles_the_accumulation_exactly():
    plan = plan_next(NodeSet(("m", "a", "b", "c")), {"b", "c"}, 2, SLOTS, TRAINER)
    assert plan.batch == BatchPlan(4, 2, 4, 32, 16) and plan.batch.exact
    assert plan.batch.line().endswith("global batch 256 kept")


def test_below_min_nodes_stops_naming_every_lost_node():
    first = plan_next(NodeSet(("m", "a", "b")), {"a"}, 2, SLOTS)
    with pytest.raises(
        ClusterNotReady, match=r"lost node\(s\) worker-a, worker-b: 1 node\(s\) left, --min-nodes 2"
    ):
        plan_next(first.nodes, {"b"}, 2, SLOTS, names={"a": "worker-a", "b": "worker-b"})


def test_without_min_nodes_a_lost_node_and_no_spare_stops_at_once_rather_than_waiting_for_it():
    with pytest.raises(ClusterNotReady, match=r"the job may not shrink.*fix:.*--min-nodes"):
        plan_next(NodeSet(("m", "a")), {"a"}, None, SLOTS)


def test_a_rank_failure_without_a_lost_node_keeps_the_same_nodes():
    plan = plan_next(NodeSet(("m", "a"), ("s1",)), set(), None, SLOTS)
    assert plan.nodes == NodeSet(("m", "a"), ("s1",)) and plan.line().startswith(
        "next attempt on 2 nodes (same"
    )


def test_take_back_queues_a_lost_node_as_the_last_spare_instead_of_excluding_it():
    plan = plan_next(NodeSet(("m", "a")), {"a"}, None, SLOTS, take_back=True)
    assert plan.nodes == NodeSet(("m", "a"), (), ()) and plan.replaced == (("a", "a"),)


def test_names_of_unknown_hosts_are_ignored_and_the_plan_is_shown_by_node_name():
    plan = plan_next(NodeSet(("m", "10.0.0.3"), ("10.0.0.9",)), {"10.0.0.3", "elsewhere"}, None, SLOTS)
    shown = renamed(plan, {"10.0.0.3": "worker-1", "10.0.0.9": "worker-3"})
    assert shown.line() == "next attempt on 2 nodes (worker-1 replaced by spare worker-3); spares left: 0"


def test_batch_flags_are_read_as_argparse_keeps_them_and_set_by_appending():
    argv = ("run.py", "--gradient_accumulation_steps=3", "--gradient_accumulation_steps", "5")
    assert flag_value(argv, "--gradient_accumulation_steps") == "5"
    assert flag_value(with_accumulation(argv, 7), "--gradient_accumulation_steps") == "7"
    assert batch_plan(("run.py",), 2, 1) == BatchPlan(8, 1, 2, 2, 1)  # transformers' defaults
    assert trainer_job(TRAINER) and not trainer_job(("python", "train.py", "--lr", "1"))


def test_plans_and_records_cross_as_json():
    plan = plan_next(NodeSet(("m", "a", "b"), ("s1",)), {"a", "b"}, 1, SLOTS, TRAINER)
    assert AttemptPlan.from_json(plan.to_json()) == plan
    record = AttemptRecord(2, "j", "succeeded", 0, 8, ("m", "s1"), (), (("a", "s1"),), ("b",), "x", 3.5, 1.0)
    assert AttemptRecord.from_json(record.to_json()) == record
    assert AttemptRecord.from_json({"attempt": 1, "job": "j", "state": "failed", "exit_code": 1}).nodes == ()


def test_time_lost_runs_from_the_last_attempts_end_to_this_ones_first_step():
    earlier = AttemptRecord(1, "j1", "failed", 1, 0, ended_at=100.0)
    events = [
        {"event": "first_step", "t": 50.0},
        {"event": "resume", "step": 8},
        {"event": "first_step", "t": 112.5},
    ]
    record = AttemptRecord.of(2, "j2", "succeeded", 0, events, None, [earlier])
    assert record.time_lost_s == 12.5 and record.resumed_from_step == 8


def test_the_last_nodes_found_are_the_spares_and_the_first_always_runs_ranks():
    found = FoundNodes(("m", "a", "b"), "m", {"m": None, "a": None, "b": None})
    assert with_spares(found, 1) == FoundNodes(("m", "a"), "m", found.requested_slots, ("b",))
    with pytest.raises(ConfigError, match="--spares 3 leaves no node"):
        with_spares(found, 3)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"min_nodes": "4", "nodes": "3", "max_restarts": "1"}, "--min-nodes 4 is above the job's 3 nodes"),
        ({"spares": "1"}, "--max-restarts is 0; fix: --max-restarts 1"),
        ({"spares": "-1"}, "--spares"),
        ({"min_nodes": "0"}, "--min-nodes"),
    ],
)
def test_bad_elastic_settings_are_one_line_naming_the_flag(flags, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        resolve_config(flags, {})


def test_elastic_settings_have_environment_equivalents():
    config = resolve_config(
        {}, {"GAUDI_CLUSTER_SPARES": "2", "GAUDI_CLUSTER_MIN_NODES": "3", "GAUDI_CLUSTER_MAX_RESTARTS": "2",
             "GAUDI_CLUSTER_TAKE_BACK": "1"}
    )  # fmt: skip
    assert (config.spares, config.min_nodes, config.take_back) == (2, 3, True)


def test_zero_partitions_that_cannot_follow_the_new_nodes_stop_the_job_with_what_to_do():
    replaced = plan_next(NodeSet(("m", "a"), ("s1",)), {"a"}, None, SLOTS)
    shrunk = plan_next(NodeSet(("m", "a", "b")), {"a"}, 2, SLOTS, TRAINER)
    same = plan_next(NodeSet(("m", "a")), set(), None, SLOTS)
    assert zero_problem(0, True, replaced) is None and zero_problem(0, False, shrunk) is None
    assert "saved only on its own disk" in (zero_problem(2, True, replaced) or "")
    assert zero_problem(1, False, replaced) is None  # shared storage, same world size: DeepSpeed loads it
    assert "ds_to_universal.py" in (zero_problem(3, False, shrunk) or "")
    assert zero_problem(3, True, same) is None


def test_the_zero_stage_is_read_from_the_jobs_deepspeed_config(tmp_path):
    config = tmp_path / "ds.json"
    config.write_text('{"zero_optimization": {"stage": 2}}')
    assert zero_stage(("python", "x.py", "--deepspeed", str(config))) == 2
    assert zero_stage(("python", "x.py", "--deepspeed", str(tmp_path / "missing.json"))) == 0
    assert zero_stage(("python", "x.py")) == 0


def test_a_spare_is_named_by_its_probe_like_every_other_node():
    survey = NodeSurvey(
        job_id="j", job_dir=Path("/nonexistent"), master_addr="10.0.0.1",
        local_addr="10.0.0.1",
        socket_ifname=None, hosts=("10.0.0.1",), requested_slots={}, paths=(),
        reports={"10.0.0.1": NodeReport("cpu", 1, hostname="master")}, unreachable={},
        spares=("10.0.0.4",), spare_reports={"10.0.0.4": NodeReport("cpu", 1, hostname="worker-3")},
    )  # fmt: skip
    assert [survey.node_name(host) for host in ("10.0.0.1", "10.0.0.4", "10.0.0.9")] == [
        "master",
        "worker-3",
        "10.0.0.9",
    ]

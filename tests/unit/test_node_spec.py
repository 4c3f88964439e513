"""The direct launcher's hand-offs (wire.node_spec): a spec survives JSON, and a bad one is named."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from gaudi_cluster.wire.node_spec import (
    AGENT_MODULE,
    FANOUT_MODULE,
    NODE_MODULE,
    SCHEMA_VERSION,
    FanoutSpec,
    NodeEntry,
    NodeRelaySpec,
    NodeSpec,
    NodeSpecError,
)

SPEC = NodeSpec(
    node_rank=1,
    nnodes=2,
    first_rank=2,
    slots=(0, 1),
    world_size=4,
    master_addr="10.0.0.1",
    master_port=29500,
    cwd="/w",
    env={"HCCL_X": "1", "EMPTY": ""},
    python="/opt/venv/bin/python",
    agent_args=("--job-id", "j1", "--", "prog", "a b", ""),
)
LAUNCH = FanoutSpec(
    python="/opt/venv/bin/python",
    ssh_config="/j/ssh_config",
    nodes=(NodeEntry("10.0.0.1", True, SPEC), NodeEntry("10.0.0.2", False, SPEC)),
)


RELAY = NodeRelaySpec("j1", "/run/gaudi-cluster/jobs", "10.0.0.1:29400", 10.0)


def spec_dict(**over: object) -> dict[str, object]:
    return {**SPEC.to_dict(), **over}


def test_the_entry_modules_are_the_real_ones():
    import importlib.util

    for module in (AGENT_MODULE, FANOUT_MODULE, NODE_MODULE):
        assert importlib.util.find_spec(module) is not None, module


def test_a_node_spec_survives_json():
    assert NodeSpec.from_json(SPEC.to_json()) == SPEC
    with_relay = dataclasses.replace(SPEC, relay=RELAY)
    assert NodeSpec.from_json(with_relay.to_json()) == with_relay
    assert json.loads(SPEC.to_json())["schema"] == SCHEMA_VERSION


def test_a_launch_survives_json():
    again = FanoutSpec.from_json(LAUNCH.to_json())
    assert again == LAUNCH
    assert [node.here for node in again.nodes] == [True, False]
    assert again.nodes[1].spec.agent_args == SPEC.agent_args


def test_a_spec_is_frozen_and_keeps_no_caller_list():
    slots = [0, 1]
    env = {"A": "1"}
    spec = NodeSpec(**{**SPEC.__dict__, "slots": slots, "env": env})
    slots.append(2)
    env["B"] = "2"
    assert spec.slots == (0, 1) and dict(spec.env) == {"A": "1"}
    with pytest.raises(AttributeError):
        spec.nnodes = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.env["C"] = "3"  # type: ignore[index]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        pytest.param(spec_dict(schema=1), "schema 1, this end reads 6", id="other-schema"),
        pytest.param({k: v for k, v in spec_dict().items() if k != "schema"}, "schema None", id="no-schema"),
        pytest.param(
            {k: v for k, v in spec_dict().items() if k != "cwd"}, r"missing field\(s\) cwd", id="missing"
        ),
        pytest.param(spec_dict(extra=1), r"unknown field\(s\) extra", id="unknown"),
        pytest.param(spec_dict(node_rank="1"), "'node_rank' must be an integer", id="string-int"),
        pytest.param(spec_dict(nnodes=True), "'nnodes' must be an integer", id="bool-int"),
        pytest.param(spec_dict(nnodes=0), "'nnodes' must be an integer of at least 1", id="no-nodes"),
        pytest.param(
            spec_dict(first_rank=-1), "'first_rank' must be an integer of at least 0", id="negative"
        ),
        pytest.param(spec_dict(slots=[]), "'slots' must be a non-empty list", id="no-slots"),
        pytest.param(spec_dict(slots=[0, "1"]), "'slots' must be an integer", id="string-slot"),
        pytest.param(spec_dict(master_port=70000), "'master_port' must be at most 65535", id="port"),
        pytest.param(spec_dict(master_addr=""), "'master_addr' must be a non-empty string", id="empty-addr"),
        pytest.param(spec_dict(cwd=None), "'cwd' must be a non-empty string", id="null-cwd"),
        pytest.param(spec_dict(env={"A": 1}), "'env' must map names to strings", id="env-int"),
        pytest.param(spec_dict(env=["A=1"]), "'env' must map names to strings", id="env-list"),
        pytest.param(spec_dict(agent_args="--job-id j1"), "'agent_args' must be a list", id="args-string"),
        pytest.param(spec_dict(preimport="0"), "'preimport' must be true or false", id="preimport-string"),
        pytest.param(
            spec_dict(preimport_keep_s=-1), "'preimport_keep_s' must be a number of seconds", id="keep-<0"
        ),
        pytest.param(spec_dict(preimport_keep_s=True), "'preimport_keep_s' must be a number", id="keep-bool"),
        pytest.param(
            spec_dict(agent_args=["--x", 1]), "'agent_args' must be a list of strings", id="args-int"
        ),
        pytest.param(spec_dict(node_rank=2), "node_rank 2 is not below nnodes 2", id="rank-past-nodes"),
        pytest.param(spec_dict(first_rank=3), r"ranks 3\.\.4 exceed world_size 4", id="rank-past-world"),
        pytest.param([1, 2], "expected a JSON object, got list", id="not-object"),
        pytest.param(
            spec_dict(relay={"job_id": "j1"}), r"node relay: missing field\(s\) control", id="relay"
        ),
        pytest.param(
            spec_dict(hand_over=True, relay=RELAY.to_dict()), "hands its ranks over cannot run", id="both"
        ),
    ],
)
def test_a_malformed_node_spec_is_named(data, match):
    with pytest.raises(NodeSpecError, match=match):
        NodeSpec.from_json(json.dumps(data))


def test_not_json_is_a_spec_error_and_a_value_error():
    with pytest.raises(NodeSpecError, match="node spec: not JSON"):
        NodeSpec.from_json("{'node_rank': 1")
    assert issubclass(NodeSpecError, ValueError)
    with pytest.raises(NodeSpecError, match="not JSON"):
        NodeSpec.from_json("[" * 100_000)  # deeper than the parser recurses


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        pytest.param(lambda d: d.update(nodes=[]), "'nodes' must be a non-empty list", id="no-nodes"),
        pytest.param(lambda d: d.update(ssh_config=7), "'ssh_config' must be a non-empty string", id="ssh"),
        pytest.param(lambda d: d["nodes"][0].update(here="yes"), "'here' must be true or false", id="here"),
        pytest.param(lambda d: d["nodes"][0].pop("host"), r"node entry: missing field\(s\) host", id="host"),
        pytest.param(lambda d: d["nodes"][1]["spec"].pop("slots"), r"missing field\(s\) slots", id="spec"),
        pytest.param(lambda d: d.pop("schema"), "launch: schema None", id="no-schema"),
    ],
)
def test_a_malformed_launch_is_named(mutate, match):
    data = LAUNCH.to_dict()
    mutate(data)
    with pytest.raises(NodeSpecError, match=match):
        FanoutSpec.from_json(json.dumps(data))


@pytest.mark.parametrize(
    ("module", "what"),
    [(NODE_MODULE, "bad node spec"), (FANOUT_MODULE, "bad launch")],
    ids=["node", "fanout"],
)
def test_the_processes_refuse_a_bad_spec_in_one_line(module, what):
    done = subprocess.run(
        [sys.executable, "-m", module],
        input=json.dumps(spec_dict(slots="0,1")),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.startswith(f"gaudi-cluster[{module.rsplit('.', 1)[1]}]: error: {what} on stdin (")
    assert done.stdout.rstrip().endswith("fix: let the master start it") and done.stderr == ""

"""The direct launcher's plan and the environment each node gives its ranks (pure parts)."""

from __future__ import annotations

import json

import pytest
from gaudi_cluster.errors import ConfigError
from gaudi_cluster.launch.fanout import node_command
from gaudi_cluster.launch.launchers import plan_for
from gaudi_cluster.launch.node import agent_command, rank_environments
from gaudi_cluster.launch.plan import AgentSettings, PlanInputs
from gaudi_cluster.nodes.hostfile import HostEntry, Hostfile
from gaudi_cluster.wire.node_spec import FanoutSpec

PY = "/opt/venv/bin/python"
AGENT = AgentSettings("j1", "/run/gaudi-cluster/jobs", 10.0, "10.0.0.1:29400")


def inputs(**over) -> PlanInputs:
    base = dict(
        hostfile=Hostfile((HostEntry("10.0.0.1", 2), HostEntry("10.0.0.2", 2))),
        hostfile_path="/j/hostfile",
        env={"HCCL_X": "1"},
        env_path="/j/deepspeed_env",
        ssh_config_path="/j/ssh_config",
        ssh_port=3022,
        master_addr="10.0.0.1",
        master_port=29500,
        program=(PY, "-u", "/w/train.py", "--lr", "1"),
        python=PY,
        agent=AGENT,
        this_node="10.0.0.1",
        cwd="/w",
    )
    base.update(over)
    return PlanInputs(**base)


def test_the_plan_is_one_fanout_with_a_spec_per_node():
    plan = plan_for("direct", inputs())
    assert plan.argv == (PY, "-u", "-m", "gaudi_cluster.launch.fanout")
    launch = FanoutSpec.from_json(plan.stdin)
    assert [(n.host, n.here) for n in launch.nodes] == [("10.0.0.1", True), ("10.0.0.2", False)]
    second = launch.nodes[1].spec
    assert (second.node_rank, second.nnodes, second.first_rank, second.slots) == (1, 2, 2, (0, 1))
    assert second.agent_args[-6:] == ("--", PY, "-u", "/w/train.py", "--lr", "1")
    assert node_command(launch.nodes[0], launch) == [PY, "-u", "-m", "gaudi_cluster.launch.node"]
    assert node_command(launch.nodes[1], launch) == [
        "ssh", "-T", "-F", "/j/ssh_config", "--", "10.0.0.2", f"{PY} -u -m gaudi_cluster.launch.node",
    ]  # fmt: skip


def test_inside_slurm_the_launcher_is_the_srun_step_itself():
    """No fan-out interpreter under Slurm: the master starts the step, each task takes its entry."""
    srun = ("/usr/bin/srun", "--overlap", "--jobid=42")
    plan = plan_for("direct", inputs(srun=srun))
    assert plan.argv == (*srun, PY, "-u", "-m", "gaudi_cluster.launch.node", "--from-launch")
    launch = FanoutSpec.from_json(plan.stdin)
    assert launch.srun == srun
    assert [node.spec.hand_over for node in launch.nodes] == [False, False]  # each task lives with its ranks
    assert all(node.spec.relay is not None for node in launch.nodes)


def test_the_wire_format_keeps_its_fields_and_gains_a_schema():
    """What crosses to the fanout and the nodes, as JSON: the fields and their meaning of before."""
    launch = json.loads(plan_for("direct", inputs()).stdin)
    # Schema 2: the launch gained `srun` (empty outside Slurm: ssh as before); 3: a node's `preimport`;
    # 4: how long its zygote stays warm (`preimport_keep_s`); 5: `hand_over` (a node reached over ssh ends
    # its session once its ranks are seated, their output on the relay: the agents' --output-relay);
    # 6: `relay` (a node process that outlives its ranks runs their relay itself).
    assert (launch["schema"], launch["python"], launch["ssh_config"]) == (6, PY, "/j/ssh_config")
    assert launch["srun"] == []
    assert [(n["host"], n["here"]) for n in launch["nodes"]] == [("10.0.0.1", True), ("10.0.0.2", False)]
    second = launch["nodes"][1]["spec"]
    assert second == {
        "schema": 6, "node_rank": 1, "nnodes": 2, "first_rank": 2, "slots": [0, 1], "world_size": 4,
        "master_addr": "10.0.0.1", "master_port": 29500, "cwd": "/w", "env": {"HCCL_X": "1"}, "python": PY,
        "agent_args": [*AGENT.args(("PROGRAM",))[:-2], "--output-relay", "--", PY, "-u", "/w/train.py",
                       "--lr", "1"],
        "preimport": True, "preimport_keep_s": 0.0, "hand_over": True, "relay": None,
    }  # fmt: skip
    assert launch["nodes"][0]["spec"]["hand_over"] is False  # this machine: no ssh session to end
    # ... and its node process outlives its ranks: it runs their relay, as the agents would be told.
    assert launch["nodes"][0]["spec"]["relay"] == {
        "job_id": AGENT.job_id, "job_root": AGENT.job_root, "control": AGENT.control,
        "heartbeat_timeout_s": AGENT.heartbeat_timeout_s,
    }  # fmt: skip


def test_only_nodes_reached_over_ssh_hand_over_and_the_plan_says_so():
    assert plan_for("direct", inputs()).hands_over
    local = plan_for("direct", inputs(local=True, this_node=None, ssh_config_path=None))
    assert not local.hands_over
    assert not any(node.spec.hand_over for node in FanoutSpec.from_json(local.stdin).nodes)


def test_deepspeed_runner_flags_need_deepspeed():
    with pytest.raises(ConfigError, match="--launcher deepspeed"):
        plan_for("direct", inputs(runner_args=("--include", "a")))


def test_each_rank_gets_what_deepspeeds_launch_py_sets():
    spec = FanoutSpec.from_json(plan_for("direct", inputs()).stdin).nodes[1].spec
    envs = rank_environments(spec, {"PATH": "/bin", "PYTHONPATH": "/opt/app"})
    assert [{k: e[k] for k in ("RANK", "LOCAL_RANK")} for e in envs] == [
        {"RANK": "2", "LOCAL_RANK": "0"},
        {"RANK": "3", "LOCAL_RANK": "1"},
    ]
    for env in envs:
        assert env["WORLD_SIZE"] == "4" and env["LOCAL_SIZE"] == "2"
        assert (env["CROSS_RANK"], env["CROSS_SIZE"]) == ("1", "2")
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29500")
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert env["PYTHONPATH"] == "/w:/opt/app" and env["HCCL_X"] == "1" and env["PATH"] == "/bin"
    assert agent_command(spec)[:4] == [PY, "-u", "-m", "gaudi_cluster.rank.agent"]


def test_a_local_job_starts_every_node_here():
    plan = plan_for("direct", inputs(local=True, this_node=None, ssh_config_path=None))
    launch = FanoutSpec.from_json(plan.stdin)
    assert all(node.here for node in launch.nodes)
    assert launch.ssh_config == "(the job's ssh config)"  # a dry run's placeholder: nothing uses it here

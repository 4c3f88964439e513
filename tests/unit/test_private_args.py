"""Token-like program arguments reach no launcher's argv: hidden on the master, staged in the private
file, put back by the rank agent just before the program starts (issue 36)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from gaudi_cluster.env.envfile import hide_secret_arguments
from gaudi_cluster.launch.launchers import LAUNCHERS, plan_for
from gaudi_cluster.launch.plan import AgentSettings, PlanInputs, render_shell
from gaudi_cluster.launch.prepare import staged_values
from gaudi_cluster.nodes.hostfile import HostEntry, Hostfile
from gaudi_cluster.rank import agent, jobdir
from gaudi_cluster.wire import private_args
from gaudi_cluster.wire.private_payload import PrivatePayload

from tests.unit.test_plan import plan_inputs

SECRET = "hf_" + "q7Zx" * 6
PROGRAM = (
    "/opt/venv/bin/python",
    "-u",
    "/w/train.py",
    "--hub_token",
    SECRET,
    f"--token={SECRET}-b",
    f"hub_token={SECRET}-c",
    "--data",
    f"https://user:{SECRET}-d@data.example/x",
    "--epochs",
    "1",
)


def test_every_token_like_argument_is_replaced_and_comes_back_verbatim():
    hidden = hide_secret_arguments(PROGRAM)
    assert not any(SECRET in word for word in hidden.argv)
    assert hidden.argv[:4] == PROGRAM[:4] and hidden.argv[-2:] == ("--epochs", "1")
    assert hidden.argv[5].startswith("--token=") and hidden.argv[6].startswith("hub_token=")
    assert hidden.names == ("--hub_token", "--token", "hub_token", "--data")
    assert sorted(hidden.values) == [private_args.variable(i) for i in range(4)]
    assert all(private_args.is_private_argument(name) for name in hidden.values)
    assert private_args.restore(hidden.argv, hidden.values) == list(PROGRAM)
    assert SECRET not in repr(hidden)


def test_a_program_without_secrets_is_left_alone():
    program = ("train.py", "--tokenizer_name", "gpt2", "--max_tokens", "5", "--output_dir", "/o")
    hidden = hide_secret_arguments(program)
    assert hidden.argv == program and dict(hidden.values) == {} and hidden.names == ()


def test_a_placeholder_without_its_value_names_the_fix():
    with pytest.raises(private_args.MissingPrivateArgument, match="fix: start ranks through gaudi-cluster"):
        private_args.restore(["p.py", "--hub_token", private_args.placeholder(0)], {})


def test_the_hidden_values_are_staged_in_every_nodes_private_file():
    hidden = hide_secret_arguments(PROGRAM)
    staged = staged_values((), {}, hidden.values)
    payload = PrivatePayload.from_json(staged.payload("node-1").to_json())
    assert {name: payload.env[name] for name in hidden.values} == dict(hidden.values)


def _inputs(local: bool, hosts: int) -> PlanInputs:
    return plan_inputs(
        hostfile=Hostfile(tuple(HostEntry(f"h{i}", 2) for i in range(hosts))),
        program=hide_secret_arguments(PROGRAM).argv,
        python="/opt/venv/bin/python",
        agent=AgentSettings(job_id="j1", job_root="/run/j", heartbeat_timeout_s=10, control="m:29400"),
        local=local,
        this_node="h0",
    )


# torchrun runs one node only (its plan refuses more: test_plan).
CASES = [
    (name, local) for name in sorted(LAUNCHERS) for local in (True, False) if local or name != "torchrun"
]


@pytest.mark.parametrize(("launcher", "local"), CASES)
def test_no_launchers_command_line_environment_or_stdin_holds_the_secret(launcher, local):
    plan = plan_for(launcher, _inputs(local, 1 if local else 3))
    shown = render_shell(plan)  # argv, the added environment and stdin (the direct launcher's specs)
    assert SECRET not in shown
    assert private_args.placeholder(0) in shown  # the program still gets its --hub_token


def _agent(tmp_path: Path, env: dict[str, str], program: list[str]) -> agent.RankAgent:
    jobdir.stage(tmp_path / "jobs", "j1", PrivatePayload(node="n", token="k", env=env))
    return agent.RankAgent("j1", program, None, tmp_path / "jobs", 10.0, output_dir=str(tmp_path))


def test_the_agent_gives_the_program_its_values_and_not_the_variables(tmp_path, capfd):
    hidden = hide_secret_arguments(["--hub_token", SECRET, f"--token={SECRET}-b"])
    show = "import json, os, sys; print(json.dumps([sys.argv[1:], [k for k in os.environ if 'ARG_' in k]]))"
    rank = _agent(tmp_path, dict(hidden.values), [sys.executable, "-c", show, *hidden.argv])
    assert rank.run() == 0
    printed = capfd.readouterr().out.strip().split("] ", 1)[1]
    assert json.loads(printed) == [["--hub_token", SECRET, f"--token={SECRET}-b"], []]


def test_the_agent_without_the_value_starts_nothing_and_exits_2(tmp_path, capfd):
    marker = tmp_path / "started"
    program = [
        sys.executable,
        "-c",
        f"open({str(marker)!r}, 'w')",
        "--hub_token",
        private_args.placeholder(0),
    ]
    rank = _agent(tmp_path, {}, program)
    assert rank.run() == 2
    assert not marker.exists()
    assert "GAUDI_CLUSTER_PRIVATE_ARG_0, which this node's private file lacks" in capfd.readouterr().out

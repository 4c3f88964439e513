from __future__ import annotations

import argparse
import json
import os
import subprocess

import pytest
from gaudi_cluster.errors import ConfigError
from gaudi_cluster.launch.launchers import (
    LAUNCHERS,
    MPIRUN,
    OPENMPI,
    PDSH,
    SSH,
    Launcher,
    deepspeed_plan,
    launcher_named,
    mpirun_plan,
    plan_for,
    torchrun_plan,
)
from gaudi_cluster.launch.plan import (
    AgentSettings,
    LaunchPlan,
    MpiBinding,
    OnPath,
    PlanInputs,
    PythonModule,
    mpi_binding,
    quote_for_pdsh,
    rank_command,
    render_shell,
)
from gaudi_cluster.nodes.hostfile import HostEntry, Hostfile

from tests.support import ds_reference as ds
from tests.support.host_tools import require

PY = "/opt/venv/bin/python"
AGENT = AgentSettings(
    job_id="j1", job_root="/run/gaudi-cluster/jobs", heartbeat_timeout_s=10.0, control="10.0.0.1:29400"
)
AGENT_ARGS = ("--job-id", "j1", "--job-root", "/run/gaudi-cluster/jobs", "--heartbeat-timeout", "10")
PROGRAM = [PY, "-u", "/opt/gaudi-cluster/app/train/run_clm.py", "--flag", "value with space"]
HARD_ARGS = [
    "value with space",
    "it's",
    'say "hi"',
    "$HOME",
    "cost $5 and `id`",
    "back\\slash",
    "trailing\\",
    "a\\ b",
    "%n %h %u %% 100%",
    "50%",
    "",
    " ",
    "tab\there",
    "semi;colon && echo pwned",
    "*.json",
    "~/x",
    "multi\nline text",
    "--lr=4e-04",
    "{a,b}",
    "!history",
    "(paren)",
    "new\nline",
    "café ✓",
    "-",
    "--",
]


def ds_kwargs(**over):
    base = dict(
        hostfile_path="/run/gaudi-cluster/jobs/j1/hostfile",
        master_addr="10.0.0.1",
        master_port=29500,
        ssh_port=3022,
        env_file_path="/run/gaudi-cluster/jobs/j1/deepspeed_env",
        program=PROGRAM,
        python=PY,
        ssh_config_path="/run/gaudi-cluster/jobs/j1/ssh_config",
        agent=AGENT,
    )
    base.update(over)
    return base


def test_rank_command_golden():
    assert rank_command(AGENT, ["prog", "a"], PY) == [
        PY, "-u", "-m", "gaudi_cluster.rank.agent", *AGENT_ARGS,
        "--control", "10.0.0.1:29400", "--", "prog", "a",
    ]  # fmt: skip
    unsupervised = AgentSettings("j1", "/run/gaudi-cluster/jobs", 10.0, None)
    assert rank_command(unsupervised, ["prog"], PY) == [
        PY, "-u", "-m", "gaudi_cluster.rank.agent", *AGENT_ARGS, "--", "prog",
    ]  # fmt: skip


def test_rank_command_names_the_output_dir_for_the_agent():
    agent = AgentSettings("j1", "/run/gaudi-cluster/jobs", 10.0, None, output_dir="/out dir")
    assert rank_command(agent, ["prog", "--output_dir=/elsewhere"], PY) == [
        PY, "-u", "-m", "gaudi_cluster.rank.agent", *AGENT_ARGS,
        "--output-dir", "/out dir", "--", "prog", "--output_dir=/elsewhere",
    ]  # fmt: skip


def test_rank_command_needs_program():
    with pytest.raises(ConfigError, match="no program"):
        rank_command(AGENT, [], PY)


def test_deepspeed_plan_golden():
    plan = deepspeed_plan(**ds_kwargs())
    assert plan.launcher == "deepspeed"
    assert plan.argv == (
        PY, "-m", "deepspeed.launcher.runner",
        "--hostfile", "/run/gaudi-cluster/jobs/j1/hostfile",
        "--master_addr", "10.0.0.1", "--master_port", "29500", "--ssh_port", "3022",
        "--no_ssh_check", "--no_local_rank", "--force_multi", "--module", "gaudi_cluster.rank.agent",
        *AGENT_ARGS, "--control", "10.0.0.1:29400", "--",
        PY, "-u", "/opt/gaudi-cluster/app/train/run_clm.py", "--flag", "value with space",
    )  # fmt: skip
    assert dict(plan.env) == {
        "DS_ENV_FILE": "/run/gaudi-cluster/jobs/j1/deepspeed_env",
        "PDSH_SSH_ARGS_APPEND": "-F /run/gaudi-cluster/jobs/j1/ssh_config",
    }


def test_deepspeed_plan_without_ssh_config_or_control():
    unsupervised = AgentSettings("j1", "/run/gaudi-cluster/jobs", 10.0, None)
    plan = deepspeed_plan(**ds_kwargs(ssh_config_path=None, agent=unsupervised, program=["p"]))
    assert dict(plan.env) == {"DS_ENV_FILE": "/run/gaudi-cluster/jobs/j1/deepspeed_env"}
    assert plan.argv[-9:] == ("gaudi_cluster.rank.agent", *AGENT_ARGS, "--", "p")


@pytest.mark.parametrize(
    ("over", "match"),
    [
        pytest.param({"env_file_path": "deepspeed_env"}, "relative", id="relative-env-file"),
        pytest.param({"env_file_path": "/a b/env"}, "whitespace", id="env-file-space"),
        pytest.param({"ssh_config_path": "/a b/cfg"}, "whitespace", id="ssh-config-space"),
        pytest.param({"program": []}, "no program", id="no-program"),
    ],
)
def test_deepspeed_plan_errors(over, match):
    with pytest.raises(ConfigError, match=match) as exc:
        deepspeed_plan(**ds_kwargs(**over))
    assert "fix:" in str(exc.value)


def test_ds_env_file_absolute_path_wins_over_search_dirs():
    # runner.py: os.path.join(dir, DS_ENV_FILE) for dir in [~, '.']
    path = "/run/gaudi-cluster/jobs/j1/deepspeed_env"
    assert {os.path.join(d, path) for d in (os.path.expanduser("~"), ".")} == {path}
    runner = ds.deepspeed_launcher_file("runner.py")
    if runner is not None:
        src = runner.read_text()
        assert 'os.getenv("DS_ENV_FILE", ".deepspeed_env")' in src
        assert "os.path.join(environ_path, DEEPSPEED_ENVIRONMENT_NAME)" in src


def _ds_runner_parser() -> argparse.ArgumentParser:
    """The shape of DeepSpeed's runner/launch parsers: flags, a script, then REMAINDER."""
    p = argparse.ArgumentParser()
    for flag in ("--hostfile", "--master_addr", "--master_port", "--ssh_port"):
        p.add_argument(flag)
    for flag in ("--no_ssh_check", "--no_local_rank", "--force_multi", "--module", "--no_python"):
        p.add_argument(flag, action="store_true")
    p.add_argument("user_script")
    p.add_argument("user_args", nargs=argparse.REMAINDER)
    return p


def test_runner_argparse_keeps_agent_args_and_double_dash():
    plan = deepspeed_plan(**ds_kwargs(program=["p", "--", "--help", "-h"]))
    ns = _ds_runner_parser().parse_args(list(plan.argv[3:]))
    assert ns.module and ns.force_multi and ns.no_local_rank
    assert ns.user_script == "gaudi_cluster.rank.agent"
    assert ns.user_args == [*AGENT_ARGS, "--control", "10.0.0.1:29400", "--", "p", "--", "--help", "-h"]


def test_quote_for_pdsh_each_arg_survives(tmp_path):
    printer = ds.make_printer(tmp_path)
    cmd = [printer, *ds.ds_parse_user_args([quote_for_pdsh(a) for a in HARD_ARGS])]
    assert ds.run_remote(cmd, "node-1", 3, tmp_path)["argv"] == HARD_ARGS


def test_naive_args_would_be_mangled(tmp_path):
    # Guards the test itself: without quote_for_pdsh these arguments do not survive.
    printer = ds.make_printer(tmp_path)
    naive = ["$HOME", "50%n"]
    cmd = [printer, *ds.ds_parse_user_args(naive)]
    assert ds.run_remote(cmd, "node-1", 3, tmp_path)["argv"] != naive


def test_program_arrives_verbatim_through_deepspeed_pdsh_and_shell(tmp_path):
    """The full remote line DeepSpeed's PDSH runner builds, run by bash as sshd would."""
    program = [PY, "-u", "/opt/gaudi-cluster/app/train/run_clm.py", *HARD_ARGS]
    plan = deepspeed_plan(**ds_kwargs(program=program))
    printer = ds.make_printer(tmp_path)
    args = ds.pdsh_command_args(
        exports={"A": '"x y"'}, cwd=str(tmp_path), python=printer, runner_argv=plan.argv
    )
    out = ds.run_remote(args, "node-1", 1, tmp_path)
    assert out["env"]["A"] == "x y"
    assert out["cwd"] == str(tmp_path)
    argv = out["argv"]
    assert argv[:5] == ["-u", "-m", "deepspeed.launcher.launch", "--world_info=e30=", "--node_rank=1"]
    tail = argv[argv.index("--no_local_rank") + 1 :]
    assert tail == rank_command(AGENT, program, PY)[3:]


def test_program_arrives_verbatim_through_real_pdsh(tmp_path):
    require("pdsh")
    program = ["/x/run_clm.py", *HARD_ARGS]
    plan = deepspeed_plan(**ds_kwargs(program=program))
    printer = ds.make_printer(tmp_path)
    # DeepSpeed always exports at least PYTHONPATH (pdsh with an empty first word runs nothing).
    args = ds.pdsh_command_args(
        exports={"PYTHONPATH": "/x"}, cwd=str(tmp_path), python=printer, runner_argv=plan.argv
    )
    bindir = ds.make_fake_ssh(tmp_path)
    env = {
        **os.environ,
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "PDSH_RCMD_TYPE": "ssh",
        "FAKE_SSH_HOST": "node-7",
        "PDSH_SSH_ARGS_APPEND": "-p 3022",
    }
    done = subprocess.run(
        ["pdsh", "-S", "-w", "node-7", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # pdsh prefixes every output line with "host: "; the JSON is on one line.
    argv = json.loads(done.stdout.split(": ", 1)[1])["argv"]
    assert argv[argv.index("--node_rank=0")] == "--node_rank=0"
    assert argv[argv.index("--no_local_rank") + 1 :] == rank_command(AGENT, program, PY)[3:]


def test_quoting_matches_installed_deepspeed_or_model():
    # The rule quote_for_pdsh relies on: only arguments containing a space are re-quoted.
    assert ds.ds_parse_user_args(["a b", "c", 'd "e"']) == ['"a b"', "c", '"d \\"e\\""']


def hostfile2() -> Hostfile:
    return Hostfile((HostEntry("10.0.0.1", 2), HostEntry("10.0.0.2", 2)))


def mpi_kwargs(**over):
    base = dict(
        hostfile=hostfile2(),
        master_addr="10.0.0.1",
        master_port=29500,
        ssh_port=3022,
        ssh_config_path="/j/ssh_config",
        env={"HCCL_OVER_OFI": "1", "A": "x y", "MASTER_ADDR": "ignored"},
        program=["prog", "a b"],
        python=PY,
        agent=AGENT,
        mpi_root=None,
        openmpi_major=4,
    )
    base.update(over)
    return base


RANK_TAIL = (
    PY,
    "-u",
    "-m",
    "gaudi_cluster.rank.agent",
    *AGENT_ARGS,
    "--control",
    "10.0.0.1:29400",
    "--",
    "prog",
    "a b",
)


def test_mpirun_plan_openmpi4_golden():
    plan = mpirun_plan(**mpi_kwargs(mpi_root="/usr/local/openmpi", socket_ifname="eth0"))
    assert plan.launcher == "mpirun"
    assert dict(plan.env) == {}
    assert plan.argv == (
        "mpirun", "--allow-run-as-root", "--prefix", "/usr/local/openmpi",
        "-n", "4", "-H", "10.0.0.1:2,10.0.0.2:2", "--bind-to", "none",
        "--mca", "plm_rsh_args", "-p 3022 -F /j/ssh_config", "--mca", "plm_rsh_no_tree_spawn", "1",
        "--mca", "btl", "^openib",
        "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
        "-x", "A=x y", "-x", "HCCL_OVER_OFI=1", "-x", "MASTER_ADDR=10.0.0.1", "-x", "MASTER_PORT=29500",
        *RANK_TAIL,
    )  # fmt: skip


def test_mpirun_plan_openmpi5_golden():
    plan = mpirun_plan(**mpi_kwargs(openmpi_major=5, ssh_config_path=None, env={}, socket_ifname="ens5"))
    assert plan.argv == (
        "mpirun", "--allow-run-as-root",
        "-n", "4", "-H", "10.0.0.1:2,10.0.0.2:2", "--bind-to", "none",
        "--prtemca", "plm_ssh_args", "-p 3022", "--prtemca", "plm_ssh_no_tree_spawn", "1",
        "--mca", "btl_tcp_if_include", "ens5", "--prtemca", "oob_tcp_if_include", "ens5",
        "-x", "MASTER_ADDR=10.0.0.1", "-x", "MASTER_PORT=29500",
        *RANK_TAIL,
    )  # fmt: skip


def test_mpirun_leaves_tree_spawn_to_open_mpi_only_when_asked():
    """A tree starts daemons over ssh from other nodes, where workers hold no client key (make keys):
    off unless the master's environment sets Open MPI's parameter (every node holds the key)."""
    asked = mpirun_plan(**mpi_kwargs(tree_spawn=True)).argv
    assert "plm_rsh_no_tree_spawn" not in asked and "-p 3022 -F /j/ssh_config" in asked
    assert not any("tree_spawn" in word for word in mpirun_plan(**mpi_kwargs(local=True)).argv)


def test_mpirun_plan_rejects_unknown_openmpi():
    with pytest.raises(ConfigError, match=r"Open MPI 3.*fix:"):
        mpirun_plan(**mpi_kwargs(openmpi_major=3))


@pytest.mark.parametrize(
    ("ranks", "topology", "map_by", "expected"),
    [
        (8, (2, 16), "socket", MpiBinding("socket", 4)),  # a 2 x 16-core server, 8 cards
        (8, (2, 48), "socket", MpiBinding("socket", 12)),
        (2, (1, 2), "socket", MpiBinding("socket", 1)),
        (4, (8, 1), "socket", MpiBinding("slot", 2)),  # one core per socket: optimum-habana maps by slot
        (3, (2, 16), "slot", MpiBinding("slot", 10)),  # floor, as DistributedRunner's //
        (8, None, "socket", None),  # no lscpu: nothing to compute, nothing bound
    ],
)
def test_mpi_binding_as_optimum_habana_computes_it(ranks, topology, map_by, expected):
    assert mpi_binding(ranks, topology, map_by) == expected


def test_mpi_binding_refuses_what_mpirun_would():
    with pytest.raises(ConfigError, match=r"8 ranks on 4 cores .*PE=0.*fix:"):
        mpi_binding(8, (1, 4))
    with pytest.raises(ConfigError, match="not an mpirun mapping object"):
        mpi_binding(8, (2, 16), "socket:PE=2")


@pytest.mark.parametrize(("major", "rank_by"), [(4, "core"), (5, "slot")])
def test_mpirun_plan_binds_with_each_open_mpis_spelling(major, rank_by):
    plan = mpirun_plan(**mpi_kwargs(openmpi_major=major, local=True, binding=MpiBinding("socket", 4)))
    words = list(plan.argv)
    at = words.index("--bind-to")
    assert words[at : at + 7] == [
        "--bind-to", "core", "--map-by", "socket:PE=4", "--rank-by", rank_by, "--report-bindings",
    ]  # fmt: skip
    assert "none" not in words[: words.index("-x")]


def test_torchrun_plan_golden():
    plan = torchrun_plan(
        nproc_per_node=8,
        master_port=29501,
        program=["prog", "a b"],
        python=PY,
        agent=AGENT,
    )
    assert plan.launcher == "torchrun"
    assert plan.argv == (
        PY, "-m", "torch.distributed.run", "--nnodes", "1", "--node_rank", "0", "--nproc_per_node", "8",
        "--master_addr", "127.0.0.1", "--master_port", "29501",
        "--module", "gaudi_cluster.rank.agent",
        *AGENT_ARGS, "--control", "10.0.0.1:29400", "--", "prog", "a b",
    )  # fmt: skip
    with pytest.raises(ConfigError):
        torchrun_plan(nproc_per_node=0, master_port=1, program=["p"], python=PY, agent=AGENT)


def test_render_shell_round_trips_through_sh():
    plan = LaunchPlan(("prog", "a b", "it's", "$X"), {"B": "2 3", "A": "1"}, "x")
    line = render_shell(plan)
    assert line == "A=1 B='2 3' prog 'a b' 'it'\"'\"'s' '$X'"
    assert render_shell(LaunchPlan(("p",), {}, "x")) == "p"


def test_launch_plan_env_is_read_only():
    plan = LaunchPlan(("p",), {"A": "1"}, "x")
    with pytest.raises(TypeError):
        plan.env["B"] = "2"  # type: ignore[index]


def plan_inputs(**over) -> PlanInputs:
    base = dict(
        hostfile=hostfile2(),
        hostfile_path="/j/hostfile",
        env={"A": "1"},
        env_path="/j/deepspeed_env",
        ssh_config_path="/j/ssh_config",
        ssh_port=3022,
        master_addr="10.0.0.1",
        master_port=29500,
        program=("prog",),
        python=PY,
        agent=AGENT,
    )
    base.update(over)
    return PlanInputs(**base)


def test_plan_for_picks_one_launcher_class_per_name():
    inputs = plan_inputs()
    assert plan_for("deepspeed", inputs).argv[:3] == (PY, "-m", "deepspeed.launcher.runner")
    assert dict(plan_for("deepspeed", inputs).env)["A"] == "1"
    assert plan_for("mpirun", inputs).argv[:2] == ("mpirun", "--allow-run-as-root")
    with pytest.raises(ConfigError, match="one node only"):
        plan_for("torchrun", inputs)
    with pytest.raises(ConfigError, match="unknown"):
        plan_for("srun", inputs)


def test_every_launcher_is_a_launcher_and_named_by_its_name():
    for name, cls in LAUNCHERS.items():
        launcher = launcher_named(name)
        assert isinstance(launcher, cls) and isinstance(launcher, Launcher) and launcher.name == name
        assert launcher.requires(plan_inputs(local=True, this_node=None))
    with pytest.raises(ConfigError, match=r"unknown; fix: use one of direct, deepspeed, mpirun, torchrun"):
        launcher_named("srun")


def test_each_launcher_requires_the_tools_its_plan_runs():
    multi, local = plan_inputs(this_node="10.0.0.1"), plan_inputs(local=True, this_node=None)
    needs = {name: launcher_named(name).requires(multi) for name in LAUNCHERS}
    tools = {name: [n.tool for n in need if isinstance(n, OnPath)] for name, need in needs.items()}
    modules = {name: [n.module for n in need if isinstance(n, PythonModule)] for name, need in needs.items()}
    assert tools == {"direct": [PY, "ssh"], "deepspeed": [PY, "pdsh"], "mpirun": ["mpirun"], "torchrun": [PY]}
    assert modules == {"direct": [], "deepspeed": ["deepspeed"], "mpirun": [], "torchrun": ["torch"]}
    assert needs["mpirun"] == (MPIRUN, OPENMPI) and OPENMPI.majors == (4, 5)
    assert PDSH in needs["deepspeed"] and SSH in needs["direct"]
    # One node, no ssh: neither pdsh (DeepSpeed's runner starts launch.py itself) nor ssh is needed.
    assert PDSH not in launcher_named("deepspeed").requires(local)
    assert SSH not in launcher_named("direct").requires(local)
    # Every node of a direct launch on this machine (its hostfile names only this one): no ssh either.
    one_here = plan_inputs(hostfile=Hostfile((HostEntry("10.0.0.1", 2),)), this_node="10.0.0.1")
    assert SSH not in launcher_named("direct").requires(one_here)
    # What a plan starts first is what its launcher requires first on PATH.
    for name in ("direct", "deepspeed", "mpirun"):
        first_tool = next(n.tool for n in needs[name] if isinstance(n, OnPath))
        assert plan_for(name, multi).argv[0] == first_tool


def test_requires_needs_no_program():
    # The check may come before planning, where a missing program is reported on its own.
    for name in LAUNCHERS:
        assert launcher_named(name).requires(plan_inputs(program=()))

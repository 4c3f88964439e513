from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from gaudi_cluster.compat.translate import (
    SpawnRequest,
    config_for_spawn,
    options_for_spawn,
    parse_gaudi_spawn_args,
)
from gaudi_cluster.errors import ConfigError
from gaudi_cluster.launch.plan import MpiBinding
from gaudi_cluster.launch.tools import openmpi_major
from gaudi_cluster.nodes.hostfile import parse_hostfile
from gaudi_cluster.settings import profiles
from gaudi_cluster.settings.config import resolve_config
from gaudi_cluster.spawn import DistributedRunner, commands_from_list, main, parse_spawn_args

REPO = Path(__file__).resolve().parents[2]

SEED_ARGS = [
    "--model_name_or_path", "gpt2-xl", "--gaudi_config_name", "Habana/gpt2",
    "--dataset_name", "wikitext", "--dataset_config_name", "wikitext-2-raw-v1",
    "--do_train", "--output_dir", "/tmp/gpt2_xl_multi_node", "--learning_rate", "4e-04",
    "--per_device_train_batch_size", "16", "--gradient_checkpointing", "--num_train_epochs", "1",
    "--use_habana", "--use_lazy_mode", "--throughput_warmup_steps", "3", "--deepspeed", "ds.json",
]  # fmt: skip

HOSTFILES = {"H": "a slots=8\nb slots=8\n", "H1": "a slots=2\n"}


def exists(path):
    return path in ("run_clm.py", "train.py", "eval.py")


def load(path):
    return parse_hostfile(HOSTFILES[path], path)


def parse(argv):
    return parse_gaudi_spawn_args(argv, exists=exists, load_hostfile=load, cwd="/w").request


def test_seed_command():
    req = parse(["--hostfile", "H", "--use_deepspeed", "run_clm.py", *SEED_ARGS])
    assert req == SpawnRequest(
        script="run_clm.py",
        script_args=tuple(SEED_ARGS),
        world_size=16,
        hostfile="H",
        use_mpi=False,
        use_deepspeed=True,
        master_port=29500,
        world_size_explicit=False,
    )


@pytest.mark.parametrize(
    ("argv", "fields"),
    [
        pytest.param(["run_clm.py"], {"world_size": 1, "use_mpi": False, "hostfile": None}, id="single-card"),
        pytest.param(
            ["--world_size=8", "--use_mpi", "run_clm.py", "--a", "b"],
            {"world_size": 8, "use_mpi": True, "script_args": ("--a", "b"), "world_size_explicit": True},
            id="mpi",
        ),
        pytest.param(
            ["--world_size", "8", "--use_deepspeed", "--master_port", "29600", "run_clm.py"],
            {"world_size": 8, "use_deepspeed": True, "master_port": 29600},
            id="ds-single-node",
        ),
        pytest.param(
            ["--hostfile", "H", "--use_deepspeed", "--world_size", "16", "run_clm.py"],
            {"world_size": 16, "world_size_explicit": True},
            id="world-size-matches",
        ),
        pytest.param(
            ["--hostfile", "H1", "--use_deepspeed", "run_clm.py"], {"world_size": 2}, id="from-hostfile"
        ),
        pytest.param(
            ["run_clm.py", "--world_size", "4", "--use_mpi"],
            {"world_size": 1, "script_args": ("--world_size", "4", "--use_mpi")},
            id="flags-after-script",
        ),
        pytest.param(
            ["run_clm.py", "--text", "a b", "$X", "it's"],
            {"script_args": ("--text", "a b", "$X", "it's")},
            id="verbatim",
        ),
    ],
)
def test_parse_ok(argv, fields):
    req = parse(argv)
    for name, value in fields.items():
        assert getattr(req, name) == value, name


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        pytest.param(
            ["--use_mpi", "--use_deepspeed", "run_clm.py"], "--use_mpi and --use_deepspeed", id="both"
        ),
        pytest.param(["--hostfile", "H", "run_clm.py"], "needs --use_deepspeed", id="hostfile-no-ds"),
        pytest.param(
            ["--hostfile", "H", "--use_deepspeed", "--world_size", "8", "run_clm.py"],
            "--world_size 8 contradicts hostfile H, whose slots add up to 16",
            id="world-size-conflict",
        ),
        pytest.param(
            ["--hostfile", "H1", "--use_deepspeed", "--world_size", "1", "run_clm.py"],
            "contradicts",
            id="explicit-one-conflicts",
        ),
        pytest.param(["--use_deepspeed", "missing.py"], "script 'missing.py' does not exist", id="no-script"),
        pytest.param(["--use_deepspeed"], "training_script", id="script-not-given"),
        pytest.param(["--world_size", "x", "run_clm.py"], "invalid int value", id="bad-int"),
        pytest.param(["--world_size", "0", "run_clm.py"], "--world_size 0", id="zero-world"),
        pytest.param(["--master_port", "70000", "run_clm.py"], "--master_port 70000", id="bad-port"),
        pytest.param(["--bogus", "run_clm.py"], "unrecognized", id="unknown-flag"),
    ],
)
def test_parse_errors(argv, match):
    with pytest.raises(ConfigError, match=match) as exc:
        parse(argv)
    assert "fix:" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_errors_are_also_value_errors():
    with pytest.raises(ValueError):
        parse(["--use_mpi", "--use_deepspeed", "run_clm.py"])


def test_missing_hostfile_is_config_error(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("")
    with pytest.raises(ConfigError, match="does not exist"):
        parse_spawn_args(["--hostfile", str(tmp_path / "nope"), "--use_deepspeed", str(script)])


def test_command_from_list():
    assert commands_from_list(["train.py --a b", "eval.py --text 'x y' \"q r\""]) == [
        ["train.py", "--a", "b"],
        ["eval.py", "--text", "x y", "q r"],
    ]


@pytest.mark.parametrize(("cmds", "match"), [(["   "], r"command_list\[0\] is empty"), (["a 'b"], "quotes")])
def test_command_from_list_errors(cmds, match):
    with pytest.raises(ConfigError, match=match):
        commands_from_list(cmds)


class RecordingRunner:
    """Stands in for the launch: records each request and answers with the queued exit codes."""

    def __init__(self) -> None:
        self.calls: list[tuple[SpawnRequest, bool]] = []
        self.codes: list[int | None] = []

    def __call__(self, request: SpawnRequest, dry_run: bool) -> int | None:
        self.calls.append((request, dry_run))
        return self.codes.pop(0) if self.codes else 0


@pytest.fixture
def fake_launch(monkeypatch):
    monkeypatch.chdir(REPO)
    return RecordingRunner()


@pytest.fixture
def scripts(tmp_path, monkeypatch):
    for name in ("train.py", "eval.py", "third.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "H").write_text(HOSTFILES["H"])
    return tmp_path


def test_runner_runs_in_order_and_returns_none_as_optimum_habana(fake_launch, scripts, monkeypatch):
    calls = fake_launch.calls
    monkeypatch.chdir(scripts)
    code = DistributedRunner(["train.py --a 1", "eval.py"], world_size=8, use_mpi=True, run=fake_launch).run()
    assert code is None
    assert [(r.script, r.script_args, r.world_size, r.use_mpi) for r, _ in calls] == [
        ("train.py", ("--a", "1"), 8, True),
        ("eval.py", (), 8, True),
    ]


def test_runner_stops_at_first_failure(fake_launch, scripts, monkeypatch):
    calls, codes = fake_launch.calls, fake_launch.codes
    codes.extend([0, 3, 0])
    monkeypatch.chdir(scripts)
    assert DistributedRunner(["train.py", "eval.py", "third.py"], run=fake_launch).run() == 3
    assert [r.script for r, _ in calls] == ["train.py", "eval.py"]


def test_runner_none_from_launcher_is_success(fake_launch, scripts, monkeypatch):
    fake_launch.codes.append(None)
    monkeypatch.chdir(scripts)
    assert DistributedRunner(["train.py"], run=fake_launch).run() is None


def test_runner_hostfile_and_options(fake_launch, scripts, monkeypatch):
    calls = fake_launch.calls
    monkeypatch.chdir(scripts)
    code = DistributedRunner(
        ["train.py"],
        hostfile=scripts / "H",
        use_deepspeed=True,
        master_port=29700,
        use_env=True,
        map_by="slot",
        run=fake_launch,
    ).run()
    assert code is None
    req = calls[0][0]
    assert (req.hostfile, req.world_size, req.master_port, req.use_env, req.map_by) == (
        str(scripts / "H"),
        16,
        29700,
        True,
        "slot",
    )


def test_runner_dry_run_passed(fake_launch, scripts, monkeypatch):
    calls = fake_launch.calls
    monkeypatch.chdir(scripts)
    DistributedRunner(["train.py"], dry_run=True, run=fake_launch).run()
    assert calls[0][1] is True


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"use_mpi": True, "use_deepspeed": True}, "use_mpi and use_deepspeed"),
        ({"hostfile": "H"}, "needs use_deepspeed=True"),
    ],
)
def test_runner_constructor_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DistributedRunner(["train.py"], **kwargs)


def test_runner_multi_hls_deprecated():
    with pytest.warns(DeprecationWarning, match="multi_hls"):
        DistributedRunner(["train.py"], multi_hls=True)


def test_runner_default_command_list_runs_nothing(fake_launch):
    assert DistributedRunner(run=fake_launch).run() is None
    assert fake_launch.calls == []


def test_spawn_main(fake_launch, scripts, monkeypatch):
    calls, codes = fake_launch.calls, fake_launch.codes
    codes.append(7)
    monkeypatch.chdir(scripts)
    assert (
        main(
            ["--dry-run", "--world_size", "2", "--use_mpi", "train.py", "x"],
            "gaudi_spawn.py",
            run=fake_launch,
        )
        == 7
    )
    assert calls[0][0].script_args == ("x",) and calls[0][1] is True


def test_gaudi_spawn_script_reports_config_error(tmp_path):
    done = subprocess.run(
        [sys.executable, str(REPO / "app" / "gaudi_spawn.py"), "--use_mpi", "--use_deepspeed", "x.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("gaudi_spawn.py: error: --use_mpi and --use_deepspeed")
    assert done.stderr.count("\n") == 1


LSCPU_2X16 = """Architecture:            x86_64
CPU(s):                  64
Thread(s) per core:      2
Core(s) per socket:      16
Socket(s):               2
"""


def test_use_mpi_dry_run_prints_optimum_habanas_binding_on_a_2x16_node(tmp_path):
    """gaudi_spawn.py --world_size 8 --use_mpi on 2 sockets x 16 cores: PE=4 per rank, reported."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "lscpu").write_text(f"#!/bin/sh\ncat <<'EOF'\n{LSCPU_2X16}EOF\n")
    (tools / "lscpu").chmod(0o755)
    (tmp_path / "train.py").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAUDI_CLUSTER_")}
    env["PATH"] = f"{tools}:{env['PATH']}"
    done = subprocess.run(
        [sys.executable, str(REPO / "app" / "gaudi_spawn.py"), "--dry-run", "--world_size", "8", "--use_mpi",
         "train.py", "--lr", "1"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    command = done.stdout.split("# command\n", 1)[1]
    major = profiles.load().dialect(openmpi_major())
    assert (
        f"mpirun --allow-run-as-root -n 8 -H localhost:8 --bind-to core --map-by socket:PE=4 "
        f"--rank-by {major.rank_by} --report-bindings"
    ) in command


def test_use_mpi_on_one_card_is_one_plain_process_and_binds_nothing():
    """optimum-habana runs a single card as `python script` whatever the launcher flag."""
    request = SpawnRequest("train.py", (), 1, None, True, False, 29500)
    assert config_for_spawn(request, resolve_config({}, {}), False).launcher == "direct"
    assert options_for_spawn(request, (2, 16)).mpi_binding is None
    eight = SpawnRequest("train.py", (), 8, None, True, False, 29500)
    assert options_for_spawn(eight, (2, 16)).mpi_binding == MpiBinding("socket", 4)
    assert options_for_spawn(eight, None).mpi_binding is None


@pytest.mark.parametrize("use_env", [False, True])
def test_use_env_concerns_the_torch_distributed_run_and_no_rank_gets_local_rank(use_env):
    """torch.distributed.run never passes --local-rank (what use_env asks for), and refuses the --use_env
    flag optimum-habana appends: either value gives the ranks LOCAL_RANK in their environment only."""
    request = SpawnRequest("train.py", (), 4, None, False, False, 29500, use_env=use_env)
    assert config_for_spawn(request, resolve_config({}, {}), False).launcher == "torchrun"
    assert options_for_spawn(request).local_rank_arg is False

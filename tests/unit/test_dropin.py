"""The habits of optimum-habana, DeepSpeed and torchrun users: the forms they type must work."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from gaudi_cluster.compat.translate import SpawnRequest, options_for_spawn
from gaudi_cluster.spawn import DistributedRunner, command_words, parse_spawn_args

ROOT = Path(__file__).resolve().parents[2]


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[SpawnRequest, bool]] = []

    def __call__(self, request: SpawnRequest, dry_run: bool) -> int:
        self.calls.append((request, dry_run))
        return 0


def test_distributed_runner_is_exported_at_the_package_top():
    import gaudi_cluster
    from gaudi_cluster import DistributedRunner as Exported

    assert Exported is DistributedRunner
    assert "DistributedRunner" in gaudi_cluster.__all__


def test_runner_errors_are_value_errors():
    with pytest.raises(ValueError, match="use_mpi and use_deepspeed"):
        DistributedRunner(["x.py"], use_mpi=True, use_deepspeed=True)


def test_a_bare_string_command_list_gets_a_clear_error():
    with pytest.raises(ValueError, match=r"command_list is one string, not a list of strings; fix:"):
        DistributedRunner("train.py --lr 1")  # type: ignore[arg-type]


def test_commands_are_expanded_by_bash_like_optimum_does(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text("{}")
    monkeypatch.setenv("HOME", "/home/me")
    monkeypatch.setenv("LR", "3e-4")
    assert command_words("t.py --cfg *.json --lr $LR --out ~/o '$LITERAL' \"$LR\"", 0) == [
        "t.py", "--cfg", "a.json", "b.json", "--lr", "3e-4", "--out", "/home/me/o", "$LITERAL", "3e-4",
    ]  # fmt: skip
    assert command_words("t.py --text 'a b' c", 1) == ["t.py", "--text", "a b", "c"]


@pytest.mark.parametrize("command", ["t.py; rm -rf /", "t.py | tee log", "t.py > out", "t.py && e.py"])
def test_shell_operators_are_refused(command):
    with pytest.raises(ValueError, match="shell operator"):
        command_words(command, 0)


def test_dry_run_goes_anywhere_among_the_launcher_flags_but_not_after_the_script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text("")
    for argv in (["--dry-run", "--world_size", "2", "s.py"], ["--world_size", "2", "--dry-run", "s.py"]):
        parsed = parse_spawn_args(argv)
        assert parsed.dry_run and parsed.request.script_args == ()
    after = parse_spawn_args(["--world_size", "2", "s.py", "--dry-run"])
    assert not after.dry_run and after.request.script_args == ("--dry-run",)


def test_master_port_in_both_spellings_and_no_abbreviations(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text("")
    assert parse_spawn_args(["--master-port", "29611", "s.py"]).request.master_port == 29611
    assert parse_spawn_args(["--master_port", "29612", "s.py"]).request.master_port == 29612
    with pytest.raises(ValueError, match="unrecognized arguments: --master"):
        parse_spawn_args(["--master", "1234", "s.py"])


def test_deepspeed_runner_flags_keep_deepspeeds_meaning(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text("")
    (tmp_path / "H").write_text("n1 slots=4\nn2 slots=4\nn3 slots=2\n")
    request = parse_spawn_args(
        ["--hostfile", "H", "--use_deepspeed", "--include", "n1:0,1@n3", "--bind_cores_to_rank", "s.py"]
    ).request
    assert request.world_size == 4
    assert options_for_spawn(request).runner_args() == ("--include", "n1:0,1@n3", "--bind_cores_to_rank")
    nodes = parse_spawn_args(["--hostfile", "H", "--use_deepspeed", "--num_nodes", "2", "s.py"]).request
    assert nodes.world_size == 8
    gpus = parse_spawn_args(["--hostfile", "H", "--use_deepspeed", "--num_gpus", "1", "s.py"]).request
    assert gpus.world_size == 3
    single = parse_spawn_args(["--nproc_per_node", "4", "s.py"]).request
    assert single.world_size == 4


def spawn_dry_run(argv: list[str], cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAUDI_CLUSTER_")}
    env["GAUDI_CLUSTER_JOB_ROOT"] = str(cwd / "jobs")
    done = subprocess.run(
        [sys.executable, "-m", "gaudi_cluster", "spawn", "--dry-run", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_golden_deepspeed_command_with_runner_flags(tmp_path):
    (tmp_path / "s.py").write_text("")
    (tmp_path / "H").write_text("n1 slots=4\nn2 slots=4\n")
    out = spawn_dry_run(
        ["--hostfile", "H", "--use_deepspeed", "--exclude", "n2:3", "--master_addr", "10.9.9.9", "--ssh_port",
         "2222", "--launcher_args", "-f 64", "--bind_core_list", "0-7", "s.py", "--lr", "1"],
        tmp_path,
    )  # fmt: skip
    command = out.split("# command\n", 1)[1]
    want = (
        f"-m deepspeed.launcher.runner --hostfile {tmp_path}/jobs/dry-run/hostfile --master_addr 10.9.9.9 "
        "--master_port 29500 --ssh_port 2222 --no_ssh_check --no_local_rank --force_multi "
        "--exclude n2:3 --bind_core_list 0-7 --launcher_args '-f 64' --module gaudi_cluster.rank.agent"
    )
    assert want in command
    assert command.rstrip().endswith(f"-- {sys.executable} -u {tmp_path}/s.py --lr 1")
    assert "7 ranks on 2 nodes" not in out  # a dry run launches nothing


def test_dry_runs_leave_nothing_behind(tmp_path):
    (tmp_path / "s.py").write_text("")
    before = set(os.listdir(tempfile.gettempdir()))
    out = spawn_dry_run(["--world_size", "2", "--use_deepspeed", "s.py"], tmp_path)
    assert "# hostfile" in out and "localhost slots=2" in out
    new = set(os.listdir(tempfile.gettempdir())) - before
    assert not [name for name in new if name.startswith(("gaudi-cluster", "gc-"))], new
    assert not (tmp_path / "jobs").exists()
    assert "ssh_config" not in out


def help_of(*argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "gaudi_cluster", *argv, "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("command", ["master", "doctor", "probe", "reap", "hostfile", "spawn"])
def test_every_subcommand_has_a_description_and_examples(command):
    text = help_of(command)
    assert "examples:" in text
    description = text.split("\n\n")[1]
    assert len(description.split()) >= 8, description


def test_help_shows_real_defaults_choices_and_no_example_values_as_defaults():
    text = help_of("master")
    assert "--launcher {direct,deepspeed,mpirun,torchrun}" in text
    assert "--ssh-port SSH_PORT" in text and "default 3022" in text
    assert "--master_port" not in text  # the underscore spelling works but is not listed twice
    usage = text.split("\n\n")[0]
    assert "worker-1,worker-2" not in usage and "2222" not in usage
    spawn_help = " ".join(help_of("spawn").split())
    assert "--dry-run" in spawn_help and "whatever follows the script, --dry-run included" in spawn_help


def test_doctor_help_lists_only_what_the_doctor_uses():
    text = help_of("doctor")
    assert "--peers-dns" in text and "--json" in text
    for launch_only in ("--max-restarts", "--stop-grace", "--dry-run", "--hold", "--tee"):
        assert launch_only not in text
    # What `doctor --fabric-check` launches its ranks with, and the node filter its advice names.
    for fabric_flag in ("--fabric-check", "--launcher", "--master-port", "--include", "--exclude"):
        assert fabric_flag in text


def test_hostfile_prints_a_summary_on_stderr(tmp_path):
    (tmp_path / "H").write_text("a slots=2\nb slots=3\n")
    done = subprocess.run(
        [sys.executable, "-m", "gaudi_cluster", "hostfile", str(tmp_path / "H")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout == "a slots=2\nb slots=3\n"
    assert done.stderr.strip() == f"{tmp_path / 'H'}: 2 nodes, 5 slots"


def test_master_takes_a_module_job_without_double_dash(tmp_path):
    (tmp_path / "H").write_text("n1 slots=1\nn2 slots=1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAUDI_CLUSTER_")}
    env["GAUDI_CLUSTER_JOB_ROOT"] = str(tmp_path / "jobs")
    done = subprocess.run(
        [sys.executable, "-m", "gaudi_cluster", "master", "--dry-run", "--launcher", "deepspeed",
         "--hostfile", "H", "-m", "mypkg.train", "--lr", "1"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith(f"-- {sys.executable} -u -m mypkg.train --lr 1")


def test_nodes_below_the_hostfile_take_the_first_and_slots_override(tmp_path):
    (tmp_path / "H").write_text("n1 slots=4\nn2 slots=4\nn3 slots=4\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAUDI_CLUSTER_")}
    env["GAUDI_CLUSTER_JOB_ROOT"] = str(tmp_path / "jobs")
    done = subprocess.run(
        [sys.executable, "-m", "gaudi_cluster", "master", "--dry-run", "--hostfile", "H", "--nodes", "2",
         "--slots", "2", "x.py"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    hostfile = done.stdout.split("\n# env file")[0].splitlines()[1:]
    assert hostfile == ["n1 slots=2", "n2 slots=2"]
    assert "using the first 2 of the 3 nodes" in done.stderr
    assert "--slots 2 overrides the slots in the hostfile" in done.stderr

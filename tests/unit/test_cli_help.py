"""The command line as a user reads and follows it: --help grouped with readable defaults, the
job root every node-side command reads, the product's own advice as commands that work as printed,
`make help`, `gaudi-cluster profiles`, spawn's two spellings and its dry run without torch."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gaudi_cluster import cli, spawn
from gaudi_cluster.aws import cli as aws_cli
from gaudi_cluster.compat.translate import parse_gaudi_spawn_args, spawn_parser
from gaudi_cluster.errors import GaudiClusterError
from gaudi_cluster.settings.config import SETTINGS, resolve_config
from gaudi_cluster.settings.flags import GROUPS, resolve_setting
from gaudi_cluster.view import fabric
from gaudi_cluster.wire.private_payload import PrivatePayload

from tests.support import fix_commands

ROOT = Path(__file__).resolve().parents[2]


def gaudi_cluster(argv: list[str], cwd: Path, env: dict[str, str] | None = None, stdin: str = ""):
    base = {k: v for k, v in os.environ.items() if not k.startswith("GAUDI_CLUSTER_")}
    return subprocess.run(
        [sys.executable, "-m", "gaudi_cluster", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**base, **(env or {})},
        input=stdin,
        timeout=60,
        check=False,
    )


# --- --help ---


def test_every_setting_is_in_exactly_one_help_group():
    grouped = [name for _, names in GROUPS for name in names]
    assert sorted(grouped) == sorted(s.name for s in SETTINGS)


def test_master_help_is_grouped_and_its_defaults_read_as_a_user_writes_them():
    text = cli._parsers()[1]["master"].format_help()
    titles = [title for title, _ in GROUPS]
    assert [t for t in titles if f"\n{t}:\n" in text] == titles
    flat = " ".join(text.split())
    assert "default 64M" in flat and "67108864" not in flat  # --min-free-disk
    assert "default )" not in flat and "default -" not in flat and "default ;" not in flat
    assert "default 120)" in flat and "120.0" not in flat  # --wait-timeout


def test_aws_help_shows_every_default():
    parser = aws_cli._parser()
    for name in ("plan", "up", "down", "status"):
        sub = fix_commands._aws_subparser([name])
        for action in sub._actions:
            if action.option_strings and action.default not in (None, False, "==SUPPRESS==") and action.help:
                assert "default" in action.help, (name, action.option_strings)
    assert parser.prog == "gaudi-cluster aws"


# --- the job root: read the same way by every command, and never left ---


def test_status_reap_and_probe_read_the_job_root_variable(tmp_path, short_tmp):
    root = short_tmp / "jr"
    (root / "j1").mkdir(parents=True)
    env = {"GAUDI_CLUSTER_JOB_ROOT": str(root)}
    reaped = gaudi_cluster(["reap", "--job-id", "j1"], tmp_path, env)
    assert reaped.returncode == 0 and "job j1: 0 leftover" in reaped.stderr, reaped.stderr
    status = gaudi_cluster(["status"], tmp_path, env)
    assert status.returncode == 3 and f"no running job under {root}" in status.stderr, status.stderr
    payload = PrivatePayload("n1", "token").to_json()
    probed = gaudi_cluster(["probe", "--stage", "j2"], tmp_path, env, stdin=payload)
    assert probed.returncode == 0, probed.stderr
    assert (root / "j2" / "private.json").exists()
    # The flag wins over the variable, as for the master.
    other = tmp_path / "other"
    (other / "j3").mkdir(parents=True)
    assert gaudi_cluster(["reap", "--job-id", "j3", "--job-root", str(other)], tmp_path, env).returncode == 0


def test_reap_of_a_path_out_of_the_root_kills_nothing_and_deletes_nothing(tmp_path):
    outside = tmp_path / "fakejob"
    outside.mkdir()
    (outside / "private.json").write_text("{}")
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        (outside / "rank-0.pid").write_text(f"{victim.pid}\n")
        (tmp_path / "root").mkdir()
        argv = ["reap", "--job-id", "../fakejob", "--job-root", str(tmp_path / "root")]
        done = gaudi_cluster(argv, tmp_path)
        assert done.returncode == 2 and "is not a job id" in done.stderr, done.stderr
        time.sleep(0.2)
        assert victim.poll() is None  # still running
        assert (outside / "private.json").exists() and (outside / "rank-0.pid").exists()
    finally:
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()


def test_a_peer_or_hostfile_error_is_the_only_line(tmp_path):
    (tmp_path / "H0").write_text("n1 slots=0\n")
    env = {"GAUDI_CLUSTER_JOB_ROOT": str(tmp_path / "jobs")}
    for argv in (
        ["master", "--dry-run", "--hostfile", "nope"],
        ["master", "--dry-run", "--hostfile", "H0"],
        ["master", "--peers", "a:0"],
        ["master", "--dry-run", "--peers-dns", "bad name!"],
    ):
        done = gaudi_cluster(argv, tmp_path, env)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, (argv, done.stderr)
        assert "effective configuration" not in done.stderr


def test_the_effective_configuration_is_still_logged_once_the_nodes_are_found(tmp_path):
    env = {"GAUDI_CLUSTER_JOB_ROOT": str(tmp_path / "jobs")}
    done = gaudi_cluster(["master", "--dry-run", "--stop-grace", "9"], tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("effective configuration: ") == 1 and "stop_grace=9.0" in done.stderr


# --- the product's advice, parsed by the real parsers ---


def test_the_fix_checker_catches_advice_that_fails():
    assert fix_commands.problems("fix: --exclude a,b", "master")  # DeepSpeed joins nodes with @
    assert fix_commands.problems("fix: --frobnicate 1", "master")
    assert fix_commands.problems("fix: --launcher deepspeed", "status")
    assert fix_commands.problems("fix: run gaudi-cluster doctor --tee", "master")
    assert not fix_commands.problems("fix: --exclude a@b:0,1", "master")
    assert not fix_commands.problems("fix: --launcher deepspeed", "doctor")


def _fabric_report(pairs: list[dict]) -> dict:
    return {"world": 4, "backend": "gloo", "timeout_s": 20.0, "pairs": pairs}


def test_the_fabric_checks_advice_works_on_master_and_doctor():
    hosts = {0: "master", 1: "worker-1", 2: "worker-2", 3: "worker-3"}
    size = 8 << 20
    timed = ((0, 1, 0.01), (2, 3, 0.5), (1, 2, 0.5))
    slow = [{"ranks": [a, b], "bytes": size, "seconds": s} for a, b, s in timed]
    silent = [{"ranks": [0, 1], "bytes": size, "seconds": 0.01}, {"ranks": [2, 3], "error": "Timed out"},
              {"ranks": [1, 2], "error": "Timed out"}]  # fmt: skip
    lines = []
    for pairs in (slow, silent):
        lines += fabric.figures(_fabric_report(pairs), hosts).problems
        lines += fabric.figures(_fabric_report(pairs), hosts, {"worker-2": "10.0.0.3"}).problems
    assert lines and all("--exclude" in line for line in lines), lines
    for line in lines:
        for command in ("master", "doctor"):
            assert not fix_commands.problems(fix_commands.fix_of(line), command), line


CANDIDATES = ("not-a-value!", "-5", "0", "99999", "x;y", "=")


@pytest.mark.parametrize("setting", [s for s in SETTINGS if not s.switch], ids=lambda s: s.name)
def test_every_settings_bad_value_fix_parses_as_printed(setting):
    for bad in CANDIDATES:
        for flags, environ in (({setting.name: bad}, {}), ({}, {setting.env: bad})):
            try:
                resolve_config(flags, environ)
            except GaudiClusterError as error:
                fix = fix_commands.fix_of(str(error))
                assert not fix_commands.problems(fix, "master"), str(error)
                for name, value in re.findall(r"(GAUDI_CLUSTER_[A-Z_]+)=(\S+)", fix):
                    named = next(s for s in SETTINGS if s.env == name)  # the variable's form works too
                    resolve_setting(named.name, None, {name: value.strip("'")})


# --- spawn ---


def test_spawn_takes_underscores_and_hyphens_alike_and_documents_one(tmp_path):
    (tmp_path / "run.py").write_text("")
    kwargs = {"exists": os.path.exists, "load_hostfile": None, "cwd": str(tmp_path)}
    run = str(tmp_path / "run.py")
    spell = "--world_size", "--master_port", "--dry_run"
    under = parse_gaudi_spawn_args([spell[0], "2", spell[1], "29600", spell[2], run], **kwargs)
    hy = [word.replace("_", "-") for word in spell]
    hyphen = parse_gaudi_spawn_args([hy[0], "2", hy[1], "29600", hy[2], run], **kwargs)
    assert under == hyphen and under.request.master_port == 29600 and under.dry_run
    usage = spawn_parser().format_usage()
    assert "--master_port" in usage and "--master-port" not in usage and "--world-size" not in usage


def test_spawn_dry_run_needs_no_torch(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # find_spec then finds no torch
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GAUDI_CLUSTER_JOB_ROOT", str(tmp_path / "jobs"))
    (tmp_path / "run.py").write_text("")
    assert spawn.main(["--dry-run", "--world_size", "2", "run.py"], "gaudi_spawn.py") == 0
    assert "-m torch.distributed.run" in capsys.readouterr().out


# --- make help, gaudi-cluster profiles ---


def test_make_help_lists_every_target_and_variable():
    done = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True)
    makefile = (ROOT / "Makefile").read_text()
    targets = re.findall(r"^([a-zA-Z0-9_.-]+):.*?## ", makefile, re.M)
    assert "test-k8s" in targets and "image-dl1" in targets
    listed = {line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ")}
    assert set(targets) <= listed
    variables = re.findall(r"^(?:export )?([A-Z][A-Z0-9_]*) \?=", makefile, re.M)
    assert "PROFILE" in variables and set(variables) <= listed


def test_gaudi_cluster_profiles_is_the_profiles_tool(tmp_path):
    done = gaudi_cluster(["profiles", "get", "dl1", "synapse.version"], tmp_path)
    module = subprocess.run(
        [sys.executable, "-m", "gaudi_cluster.settings.profiles_cli", "get", "dl1", "synapse.version"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout == module.stdout and done.stdout.strip()
    assert "gaudi-cluster profiles" in gaudi_cluster(["profiles", "--help"], tmp_path).stdout

"""Bad input on every CLI path: exit 2 (or 3), one error line naming the culprit and a fix, no traceback,
nothing launched. Each case runs the real console command in a fresh process; the last tests pin, in
process, the one mapping from errors to exit codes that every entry point ends with."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import NoReturn

import pytest
from gaudi_cluster import cli, spawn
from gaudi_cluster.aws import cli as aws_cli
from gaudi_cluster.aws.calls import AwsCallFailed
from gaudi_cluster.compat.translate import SpawnConfigError
from gaudi_cluster.engines import nodewatch
from gaudi_cluster.errors import (
    ClusterNotReady,
    ConfigError,
    GaudiClusterError,
    error_line,
    exit_code_for,
    signal_exit_code,
)

from tests.support import fix_commands
from tests.support.fix_commands import fix_of

ROOT = Path(__file__).resolve().parents[2]
GAUDI_SPAWN = ROOT / "app" / "gaudi_spawn.py"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("cli")
    (work / "run.py").write_text("print('ran')\n")
    (work / "H").write_text("n1 slots=4\nn2 slots=4\nn3 slots=2\n")
    (work / "H_bom").write_bytes("\ufeffn1 slots=1\n".encode())
    (work / "H_nul").write_bytes(b"n1 slots=1\nn2\x00 slots=1\n")
    (work / "H_zero").write_text("n1 slots=0\n")
    (work / "H_big").write_text("n1 slots=99999999999999999999\n")
    (work / "H_esc").write_text("n1 slots=2\x1b]0;title\x07 \x1b[2J\n")
    return work


def run_cli(argv: list[str], workdir: Path, env: dict[str, str] | None = None, spawn: bool = False):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GAUDI_CLUSTER_", "DS_ENV_FILE"))}
    base.update({"GAUDI_CLUSTER_JOB_ROOT": str(workdir / "jobs"), "HOME": str(workdir)}, **(env or {}))
    command = [sys.executable, str(GAUDI_SPAWN)] if spawn else [sys.executable, "-m", "gaudi_cluster"]
    return subprocess.run(
        [*command, *argv], capture_output=True, text=True, cwd=workdir, env=base, timeout=60, check=False
    )


BAD = [
    # (argv, extra env, culprit named in the one error line)
    (["-v", "spawn", "missing.py"], {}, "missing.py"),
    (["spawn", "--hostfile", "H", "--use_deepspeed", "run.py"], {"GAUDI_CLUSTER_DRY_RUN": "maybe"},
     "GAUDI_CLUSTER_DRY_RUN"),
    (["probe", "--accelerator", "gaudi"], {}, "--accelerator"),
    (["probe", "--slots", "0"], {}, "--slots"),
    (["-v", "probe", "--slots", "x"], {}, "--slots"),
    (["master", "--hostfile="], {}, "--hostfile"),
    (["master", "--heartbeat-timeout", "nan"], {}, "--heartbeat-timeout"),
    (["master", "--heartbeat-timeout", "inf"], {}, "--heartbeat-timeout"),
    (["master", "--stop-grace", "-1"], {}, "--stop-grace"),
    (["master", "--master-port", "29400"], {}, "--control-port"),
    (["master", "--master_port", "29401", "--control-port", "29401"], {}, "--master-port"),
    (["master", "--env", "HF_TOKEN=x"], {}, "--env-pass HF_TOKEN"),
    (["master", "--env", "NOEQUALS"], {}, "--env"),
    (["master", "--env", "MASTER_ADDR=x"], {}, "MASTER_ADDR"),
    (["master", "--env", "A=1", "--env", "X=$HOME"], {}, "--env"),
    (["master"], {"GAUDI_CLUSTER_ENV": "1A=2"}, "GAUDI_CLUSTER_ENV"),
    (["master", "--env-pass", "NOT_SET_ANYWHERE", "--dry-run"], {}, "NOT_SET_ANYWHERE"),
    (["master", "--env-pass", "bad name"], {}, "--env-pass"),
    (["master", "--nodes", "5", "--peers", "a,b"], {}, "--nodes"),
    (["master", "--nodes", "4", "--hostfile", "H"], {}, "--nodes 4"),
    (["master", "--nodes", "0"], {}, "--nodes"),
    (["master", "--peers", "a:0"], {}, "a:0"),
    (["master", "--peers", "root@a"], {}, "root@a"),
    (["master", "--dry-run", "--hostfile", "H_zero"], {}, "H_zero:1"),
    (["master", "--slots", "99999999999999999999"], {}, "--slots"),
    (["master", "--dry-run", "--hostfile", "H_big"], {}, "H_big:1"),
    (["spawn", "--hostfile", "H_big", "--use_deepspeed", "run.py"], {}, "H_big:1"),
    (["hostfile", "H_big"], {}, "H_big:1"),
    (["hostfile", "H_esc"], {}, "\\x1b]0;title\\x07"),
    (["master", "--nodes", "9" * 3000], {}, "(3000 characters)"),
    (["master", "--peers", "root@w1"], {}, "--peers="),
    (["master", "--peers", "w1:99999999999"], {}, "--peers="),
    (["master"], {"GAUDI_CLUSTER_PEERS": "root@w1"}, "GAUDI_CLUSTER_PEERS="),
    (["master"], {"GAUDI_CLUSTER_SPARES": "1"}, "GAUDI_CLUSTER_SPARES acts"),
    (["master", "--peers-dns", "bad name!"], {}, "--peers-dns"),
    (["master", "--exclude", "b:x"], {}, "--exclude"),
    (["master", "--include", "a", "--exclude", "b"], {}, "--include and --exclude"),
    (["master", "--master", "1234"], {}, "--master"),
    (["master", "--launcher", "srun"], {}, "--launcher"),
    (["master", "--accelerator", "gaudi"], {}, "--accelerator"),
    (["master", "--ssh-port", "0"], {}, "--ssh-port"),
    (["master", "--slots", "0"], {}, "--slots"),
    (["master", "--wait-timeout", "-1"], {}, "--wait-timeout"),
    (["master", "--max-restarts", "-1"], {}, "--max-restarts"),
    (["master", "--env-preset", "fast"], {}, "--env-preset"),
    (["master", "--socket-ifname", " "], {}, "--socket-ifname"),
    (["master", "--bogus"], {}, "--bogus"),
    (["master"], {"GAUDI_CLUSTER_SSH_PORT": "ssh"}, "GAUDI_CLUSTER_SSH_PORT"),
    (["doctor", "--dry-run"], {}, "--dry-run"),
    (["doctor", "--launcher", "srun"], {}, "--launcher"),
    (["hostfile", "H_bom"], {}, "U+FEFF at line 1, column 1"),
    (["hostfile", "H_nul"], {}, "U+0000 at line 2, column 3"),
    (["hostfile", "nope"], {}, "nope"),
    (["hostfile"], {}, "path"),
    (["reap"], {}, "--job-id"),
    (["teleport"], {}, "teleport"),
    (["spawn", "--use_mpi", "--use_deepspeed", "run.py"], {}, "--use_mpi and --use_deepspeed"),
    (["spawn", "--hostfile", "H", "run.py"], {}, "--use_deepspeed"),
    (["spawn", "--world_size", "0", "run.py"], {}, "--world_size"),
    (["spawn", "--master_port", "70000", "run.py"], {}, "--master_port"),
    (["spawn", "--hostfile", "H", "--use_deepspeed", "--include", "n1", "--exclude", "n2", "run.py"], {},
     "--exclude"),
    (["spawn", "--hostfile", "H", "--use_deepspeed", "--include", "ghost", "run.py"], {}, "ghost"),
    (["spawn", "--hostfile", "H", "--use_deepspeed", "--include", "n3:5", "run.py"], {}, "slot 5"),
    (["spawn", "--use_deepspeed", "--num_nodes", "2", "run.py"], {}, "--num_nodes"),
    (["spawn", "--include", "n1", "run.py"], {}, "--include"),
    (["spawn", "--world_size", "2", "--num_gpus", "3", "run.py"], {}, "--num_gpus"),
    (["spawn", "--hostfile", "H", "--use_deepspeed", "--world_size", "3", "run.py"], {}, "--world_size 3"),
    (["spawn", "--master", "1234", "run.py"], {}, "--master"),
    (["spawn"], {}, "training_script"),
    # issue 35's second round: job ids and roots, command-local help, --tee, ports, the job's script
    (["reap", "--job-id", "../fakejob"], {}, "--job-id '../fakejob' is not a job id"),
    (["reap", "--job-id", "typo"], {}, "no job 'typo' under"),
    (["reap", "--job-id", "/etc"], {}, "'/etc'"),
    (["status", "--job-id", ".."], {}, "--job-id '..'"),
    (["status", "--job-id", "nope"], {}, "no job 'nope'"),
    (["probe", "--stage", "../x"], {}, "--stage '../x'"),
    (["reap", "--job-id", "j"], {"GAUDI_CLUSTER_JOB_ROOT": "/nonexistent-root"}, "/nonexistent-root"),
    (["status"], {"GAUDI_CLUSTER_JOB_ROOT": "/tmp/" + "r" * 90}, "too long"),
    (["status", "--job-root", "/tmp/" + "r" * 90], {}, "--job-root /tmp/gaudi-jobs"),
    (["master", "--job-root", "/tmp/" + "r" * 90, "run.py"], {}, "too long"),
    (["master", "run.py"], {"GAUDI_CLUSTER_JOB_ROOT": "/tmp/" + "r" * 90}, "GAUDI_CLUSTER_JOB_ROOT="),
    (["master", "--job-root", " "], {}, "--job-root"),
    (["master", "--bogus-flag"], {}, "see 'gaudi-cluster master --help'"),
    (["doctor", "--bogus-flag"], {}, "see 'gaudi-cluster doctor --help'"),
    (["status", "--bogus-flag"], {}, "see 'gaudi-cluster status --help'"),
    (["probe", "--json", "extra"], {}, "'extra'"),
    (["probe", "--slots", "99999999999999999999"], {}, "is above"),
    (["master", "--slots"], {}, "argument --slots: expected one argument"),
    (["master", "--tee", "3"], {}, "--tee takes no value"),
    (["master", "--tee", "0:3,1:1", "run.py"], {}, "'0:3,1:1'"),
    (["master", "--tee=3"], {}, "--tee"),
    (["spawn", "--master_port", "80", "run.py"], {}, "--master_port 80"),
    (["spawn", "--master-port", "1023", "run.py"], {}, "--master_port 1023"),
    (["spawn", "--world-size", "0", "run.py"], {}, "--world_size"),
    (["master", "trian.py"], {}, "'trian.py' is not on this node"),
    (["master", "sub/run.py", "--lr", "1"], {}, "'sub/run.py'"),
    (["master", "--peers-dns", "-x"], {}, "--peers-dns"),
    (["doctor", "--exclude", "b:x"], {}, "--exclude"),
    (["doctor", "--master-port", "29400"], {}, "--control-port"),
    (["doctor", "--fabric-check", "--fabric-timeout", "0"], {}, "--fabric-timeout"),
    (["profiles", "get"], {}, "profile, key"),
    (["profiles", "get", "nosuch", "synapse.version"], {}, "'nosuch'"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "env", "culprit"), BAD, ids=[" ".join(case[0]) or "none" for case in BAD])
def test_bad_input_is_one_line_with_a_fix(workdir, argv, env, culprit):
    done = run_cli(argv, workdir, env)
    assert done.returncode in (2, 3), (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, done.stderr
    assert culprit in errors[0] and "fix:" in errors[0], errors[0]
    assert "error: gaudi-cluster" not in errors[0], errors[0]  # one prefix, not argparse's again
    command = next(word for word in argv if not word.startswith("-")) if any(argv) else ""
    assert not fix_commands.problems(fix_of(errors[0]), command), errors[0]  # the fix works as printed
    assert "[launcher]" not in done.stdout and " rank " not in done.stdout  # nothing was launched
    assert not (workdir / "jobs").exists() or not any((workdir / "jobs").iterdir())


def test_an_echoed_value_carries_no_control_character_and_is_cut(workdir):
    for argv in (["hostfile", "H_esc"], ["master", "--nodes", "9" * 3000]):
        done = run_cli(argv, workdir)
        assert done.returncode == 2
        assert not any(ord(c) < 32 and c != "\n" for c in done.stderr), done.stderr
        assert len(done.stderr) < 400 and done.stderr.count("\n") == 1, done.stderr


def test_there_are_at_least_forty_cases():
    assert len(BAD) >= 40


@pytest.mark.parametrize(
    "argv",
    [
        ["--use_mpi", "--use_deepspeed", "run.py"],
        ["--dry-run"],
        ["--hostfile", "H", "run.py"],
        ["--bogus", "run.py"],
    ],
)
def test_gaudi_spawn_script_reports_the_same_way(workdir, argv):
    done = run_cli(argv, workdir, spawn=True)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("gaudi_spawn.py: error: ") and done.stderr.count("\n") == 1
    assert "fix:" in done.stderr


def test_verbose_before_or_after_the_command_is_accepted(workdir):
    for argv in (["-v", "probe", "--json"], ["probe", "-v", "--json"], ["probe", "--json"]):
        done = run_cli(argv, workdir)
        assert done.returncode == 0, done.stderr
        assert '"hostname"' in done.stdout


# --- the one mapping from errors to exit codes (errors.exit_code_for), used by every entry point ---

CODES = {GaudiClusterError: 1, ConfigError: 2, ClusterNotReady: 3, SpawnConfigError: 2, AwsCallFailed: 1}


def subclasses(cls: type) -> set[type]:
    return {cls} | {sub for direct in cls.__subclasses__() for sub in subclasses(direct)}


def test_every_error_type_maps_to_its_exit_code():
    # A new error type must be added here with the code it means (and to the codes in --help).
    assert subclasses(GaudiClusterError) == set(CODES)
    for error_type, code in CODES.items():
        assert exit_code_for(error_type("x")) == code, error_type
    # An AWS call failure carries the code of what went wrong: bad credentials, no capacity.
    assert exit_code_for(AwsCallFailed("x", "AccessDenied", ConfigError.exit_code)) == 2
    assert exit_code_for(AwsCallFailed("x", "InsufficientInstanceCapacity", ClusterNotReady.exit_code)) == 3
    assert signal_exit_code(signal.SIGTERM) == 143


def raising(error: GaudiClusterError):
    def fail(*_args: object, **_kwargs: object) -> NoReturn:
        raise error

    return fail


ENTRY_POINTS = ["cli", "spawn", "nodewatch", "aws"]


def run_entry(entry: str, error: GaudiClusterError, monkeypatch: pytest.MonkeyPatch) -> int:
    """Run one entry point in-process with its work replaced by raising `error`."""
    if entry == "cli":
        monkeypatch.setattr(cli, "_main", raising(error))
        return cli.main([])
    if entry == "spawn":
        monkeypatch.setattr(spawn, "parse_spawn_args", raising(error))
        return spawn.main(["run.py"], "gaudi_spawn.py")
    if entry == "nodewatch":
        monkeypatch.setattr(nodewatch, "resolve_config", raising(error))
        return nodewatch.main(["role"])
    monkeypatch.setattr(aws_cli, "_parser", lambda: SimpleNamespace(parse_args=raising(error)))
    return aws_cli.main([])


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("error_type", list(CODES))
def test_every_entry_point_ends_an_error_the_same_way(entry, error_type, monkeypatch, capsys):
    error = error_type("the culprit; fix: the fix")
    assert run_entry(entry, error, monkeypatch) == CODES[error_type]
    err = capsys.readouterr().err
    if entry == "spawn":  # as gaudi_spawn.py: `error:` marks bad input, as argparse does
        tag = "error: " if isinstance(error, ConfigError) else ""
        assert err == f"gaudi_spawn.py: {tag}the culprit; fix: the fix\n"
    else:
        assert err == "gaudi-cluster: error: the culprit; fix: the fix\n"
    assert err == error_line(error, "gaudi_spawn.py" if entry == "spawn" else "gaudi-cluster",
                             tag_bad_input_only=entry == "spawn") + "\n"  # fmt: skip

"""How `make image` chooses Habana DeepSpeed's commit: a local bare repository stands in for the fork, so
`git ls-remote` really runs; the pin file a build writes makes the next build install the same commit."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
from gaudi_cluster.errors import ConfigError
from gaudi_cluster.settings import fork_pin

ROOT = Path(__file__).resolve().parents[2]
OTHER = "0123456789abcdef0123456789abcdef01234567"


def git(*args: str, cwd: Path) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin", "HOME": str(cwd)}  # fmt: skip
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def fork(tmp_path: Path) -> tuple[Path, str]:
    """A bare repository with branch 1.23.0, and that branch's commit."""
    work = tmp_path / "work"
    work.mkdir()
    git("init", "-q", "-b", "1.23.0", cwd=work)
    (work / "version.txt").write_text("0.16.1\n")
    git("add", ".", cwd=work)
    git("commit", "-q", "-m", "DeepSpeed content for 1.23.0", cwd=work)
    bare = tmp_path / "DeepSpeed.git"
    git("clone", "-q", "--bare", str(work), str(bare), cwd=tmp_path)
    return bare, git("rev-parse", "HEAD", cwd=work).strip()


def docker_build(*extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["python3", "-m", "gaudi_cluster.settings.profiles_cli", "docker-build", "gaudi", "--version", "0",
         "--git-rev", "abc", *extra],
        cwd=ROOT, env={"PYTHONPATH": str(ROOT / "app"), "PATH": "/usr/bin:/bin:/usr/local/bin"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def args_of(stdout: str) -> dict[str, str]:
    argv = shlex.split(stdout.strip().splitlines()[-1])
    return dict(argv[i + 1].split("=", 1) for i, word in enumerate(argv) if word == "--build-arg")


def test_the_branch_is_resolved_with_ls_remote_and_printed(fork, tmp_path):
    bare, head = fork
    done = docker_build("--deepspeed-repo", str(bare), "--pins-dir", str(tmp_path / "pins"))
    assert done.returncode == 0, done.stderr
    args = args_of(done.stdout)
    assert args["HABANA_DEEPSPEED_REF"] == args["HABANA_DEEPSPEED_COMMIT_PREFIX"] == head
    assert args["HABANA_DEEPSPEED_REPO"] == str(bare)
    assert f"Habana DeepSpeed 1.23.0 = {head} (git ls-remote; {bare})" in done.stderr


def test_the_pin_file_of_the_last_build_wins_over_a_moved_branch(fork, tmp_path):
    bare, head = fork
    pins = tmp_path / "pins"
    path = fork_pin.record(fork_pin.ForkPin("gaudi", "1.23.0", str(bare), head, "git ls-remote"), str(pins))
    assert path == pins / "gaudi.env" and f"HABANA_DEEPSPEED_COMMIT={head}\n" in path.read_text()
    # The branch moves on; the next build still installs the recorded commit (and a dry run says so).
    work = tmp_path / "work"
    (work / "later.txt").write_text("x\n")
    git("add", ".", cwd=work)
    git("commit", "-q", "-m", "later", cwd=work)
    git("push", "-q", str(bare), "1.23.0", cwd=work)
    assert fork_pin.ls_remote(str(bare), "1.23.0") != head
    done = docker_build("--deepspeed-repo", str(bare), "--pins-dir", str(pins))
    assert args_of(done.stdout)["HABANA_DEEPSPEED_REF"] == head, done.stderr
    assert f"({pins / 'gaudi.env'};" in done.stderr
    dry = docker_build("--deepspeed-repo", str(bare), "--pins-dir", str(pins), "--dry-run")
    assert args_of(dry.stdout)["HABANA_DEEPSPEED_REF"] == head and "the last build's" in dry.stdout
    # Given explicitly, a commit wins over the pin file: HABANA_DEEPSPEED_COMMIT=<sha> rebuilds that one.
    given = docker_build("--deepspeed-repo", str(bare), "--pins-dir", str(pins), "--deepspeed-commit", OTHER)
    assert args_of(given.stdout)["HABANA_DEEPSPEED_REF"] == OTHER


def test_a_pin_file_of_another_fork_is_not_used(fork, tmp_path):
    bare, head = fork
    fork_pin.record(fork_pin.ForkPin("gaudi", "1.23.0", "https://elsewhere/x.git", OTHER, "x"), str(tmp_path))
    chosen = fork_pin.choose("gaudi", "1.23.0", str(bare), None, None, str(tmp_path))
    assert (chosen.commit, chosen.source) == (head, "git ls-remote")


def test_an_unresolvable_branch_is_one_line_naming_the_fix(fork, tmp_path):
    bare, _ = fork
    with pytest.raises(ConfigError) as missing:
        fork_pin.ls_remote(str(bare), "9.99.0")
    assert "cannot resolve Habana DeepSpeed branch 9.99.0" in str(missing.value)
    assert "fix: make image HABANA_DEEPSPEED_COMMIT=" in str(missing.value) and "\n" not in str(missing.value)
    done = docker_build("--deepspeed-repo", str(tmp_path / "nothing.git"), "--pins-dir", str(tmp_path))
    assert done.returncode == 2 and "docker build" not in done.stdout
    assert done.stderr.count("error:") == 1 and "HABANA_DEEPSPEED_REPO=<a mirror of it>" in done.stderr


def test_a_broken_pin_file_is_refused(tmp_path):
    (tmp_path / "gaudi.env").write_text("HABANA_DEEPSPEED_COMMIT=1.23.0\n")
    with pytest.raises(ConfigError, match=r"no full HABANA_DEEPSPEED_COMMIT.*fix: delete"):
        fork_pin.choose("gaudi", "1.23.0", "x", None, None, str(tmp_path))


def test_set_overrides_only_rendered_build_args(tmp_path):
    done = docker_build(
        "--deepspeed-commit", OTHER, "--set", "BASE_IMAGE=standin:1", "--pins-dir", str(tmp_path)
    )
    assert args_of(done.stdout)["BASE_IMAGE"] == "standin:1", done.stderr
    bad = docker_build("--deepspeed-commit", OTHER, "--set", "NOPE=1", "--pins-dir", str(tmp_path))
    assert bad.returncode == 2 and "--set NOPE: not a build argument" in bad.stderr

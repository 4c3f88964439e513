"""Which commit of Habana's DeepSpeed fork a gaudi image installs, and where a build records it.

HabanaAI/DeepSpeed publishes a branch per Synapse release and no tags, and Intel's docs install the
branch (`pip install git+https://github.com/HabanaAI/DeepSpeed.git@1.23.0`). A build here does the same,
reproducibly: `make image` takes the commit, in this order, from
  1. HABANA_DEEPSPEED_COMMIT (given),
  2. the profile (profiles.json habana_deepspeed.commit),
  3. the pin file of the last build of the profile (build/pins/PROFILE.env, PINS_DIR),
  4. `git ls-remote FORK refs/heads/BRANCH` on the build machine (FORK: HABANA_DEEPSPEED_REPO),
then installs exactly that commit, labels the image with it and, once the build succeeded, writes the
pin file, so the next build (or any machine given HABANA_DEEPSPEED_COMMIT=<sha>) installs the same.
Standard library only (`make image` needs no virtual environment).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gaudi_cluster.errors import ConfigError

# The image labels that carry the fork's commit and where it came from (Dockerfile, record-pin).
COMMIT_LABEL = "io.gaudi-cluster.habana-deepspeed.commit"
REPO_LABEL = "io.gaudi-cluster.habana-deepspeed.repo"
_SHA = re.compile(r"[0-9a-f]{40}")
LS_REMOTE_TIMEOUT_S = 60


@dataclass(frozen=True)
class ForkPin:
    """One profile's fork commit: what the build installs, and how it was chosen (source)."""

    profile: str
    branch: str
    repo: str
    commit: str
    source: str  # "HABANA_DEEPSPEED_COMMIT", "profiles.json", the pin file's path, or "git ls-remote"

    def to_env(self) -> str:
        """The pin file: KEY=value lines a shell, make or from_env reads."""
        return (
            f"# Habana DeepSpeed of the last `make image PROFILE={self.profile}` ({self.source}).\n"
            "# The next build of the profile installs this commit; delete the file to take the branch head.\n"
            f"HABANA_DEEPSPEED_BRANCH={self.branch}\n"
            f"HABANA_DEEPSPEED_REPO={self.repo}\n"
            f"HABANA_DEEPSPEED_COMMIT={self.commit}\n"
        )

    @classmethod
    def from_env(cls, profile: str, text: str, source: str) -> ForkPin:
        values = dict(
            line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#")
        )
        commit = values.get("HABANA_DEEPSPEED_COMMIT", "")
        if not _SHA.fullmatch(commit):
            raise ConfigError(
                f"{source} has no full HABANA_DEEPSPEED_COMMIT (got {commit!r}); fix: delete {source}"
            )
        branch, repo = values.get("HABANA_DEEPSPEED_BRANCH", ""), values.get("HABANA_DEEPSPEED_REPO", "")
        return cls(profile, branch, repo, commit, source)


def pin_path(pins_dir: str, profile: str) -> Path:
    return Path(pins_dir) / f"{profile}.env"


def ls_remote_command(repo: str, branch: str) -> list[str]:
    return ["git", "ls-remote", "--", repo, f"refs/heads/{branch}"]


def ls_remote(repo: str, branch: str) -> str:
    """The commit the fork's branch points at now, or a ConfigError naming the fix."""
    fix = (
        f"fix: make image HABANA_DEEPSPEED_COMMIT=<40-hex SHA of {branch}> (from a machine that reaches "
        "the fork), or HABANA_DEEPSPEED_REPO=<a mirror of it>"
    )
    try:
        done = subprocess.run(
            ls_remote_command(repo, branch), capture_output=True, text=True, timeout=LS_REMOTE_TIMEOUT_S,
            check=False, env={"GIT_TERMINAL_PROMPT": "0", "PATH": "/usr/bin:/bin:/usr/local/bin"},
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ConfigError(
            f"cannot resolve Habana DeepSpeed branch {branch} at {repo} ({error}); {fix}"
        ) from None
    sha = next((line.split()[0] for line in done.stdout.splitlines() if line.strip()), "")
    if done.returncode != 0 or not _SHA.fullmatch(sha):
        why = (done.stderr.strip().splitlines() or ["no such branch"])[-1][:160]
        raise ConfigError(f"cannot resolve Habana DeepSpeed branch {branch} at {repo} ({why}); {fix}")
    return sha


def choose(
    profile: str, branch: str, repo: str, recorded: str | None, given: str | None, pins_dir: str
) -> ForkPin:
    """The commit this build installs (see the module's order); ls-remote only when nothing records one."""
    if given:
        return ForkPin(profile, branch, repo, given, "HABANA_DEEPSPEED_COMMIT")
    if recorded:
        return ForkPin(profile, branch, repo, recorded, "profiles.json")
    path = pin_path(pins_dir, profile)
    if path.is_file():
        pinned = ForkPin.from_env(profile, path.read_text(), str(path))
        if pinned.branch == branch and pinned.repo == repo:
            return pinned
    return ForkPin(profile, branch, repo, ls_remote(repo, branch), "git ls-remote")


def how(profile: str, branch: str, repo: str, recorded: str | None, given: str | None, pins_dir: str) -> str:
    """What a dry run says instead of resolving (a dry run reaches no network)."""
    path = pin_path(pins_dir, profile)
    if given:
        return f"HABANA_DEEPSPEED_COMMIT={given} (given)"
    if recorded:
        return f"{recorded} (profiles.json)"
    if path.is_file():
        return f"the commit in {path} (the last build's; delete it to take the branch head)"
    return (
        f"resolved at build time by `{' '.join(ls_remote_command(repo, branch))}`, printed, "
        f"labelled {COMMIT_LABEL}=<sha> and recorded in {path} "
        "(HABANA_DEEPSPEED_COMMIT=<sha> rebuilds the same)"
    )


def record(pin: ForkPin, pins_dir: str) -> Path:
    path = pin_path(pins_dir, pin.profile)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(pin.to_env())
    return path

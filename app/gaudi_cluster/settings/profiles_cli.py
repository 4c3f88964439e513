"""`python -m gaudi_cluster.settings.profiles_cli`: the profile matrix for the build and the docs.

    python -m gaudi_cluster.settings.profiles_cli docker-build dl1 --image-name gaudi-cluster \\
        --version 0.1.0 --git-rev abc [--dry-run] [--deepspeed-commit SHA] [--deepspeed-repo URL] \\
        [--pins-dir build/pins] [--set NAME=VALUE ...]
    python -m gaudi_cluster.settings.profiles_cli record-pin gaudi --image gaudi-cluster:gaudi
    python -m gaudi_cluster.settings.profiles_cli check | table | get dl1 synapse.version

Standard library only, so `make image` needs no virtual environment. docker-build prints the command on
stdout; --dry-run puts the build's summary before it (as # lines) and says how the fork's commit will be
chosen; otherwise the summary goes to stderr, the commit is chosen (fork_pin: given, profile, pin file,
or `git ls-remote` of the branch; refused only when none resolves) and printed. record-pin writes the
commit a built image carries in its label to the profile's pin file (scripts/build-gaudi-image.sh).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from collections.abc import Sequence
from typing import NoReturn

from gaudi_cluster.errors import ConfigError
from gaudi_cluster.settings import fork_pin
from gaudi_cluster.settings.profiles import load
from gaudi_cluster.settings.profiles_build import docker_build_argv, markdown_table, summary
from gaudi_cluster.settings.profiles_check import consistency_problems


class _Parser(argparse.ArgumentParser):
    """A usage error as one line with its fix, exit 2 (as every gaudi-cluster command)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}; fix: see '{self.prog} --help'", file=sys.stderr)
        sys.exit(2)


def main(
    argv: Sequence[str] | None = None, prog: str = "python -m gaudi_cluster.settings.profiles_cli"
) -> int:
    """`prog`: how the user called it (`gaudi-cluster profiles` from the CLI)."""
    parser = _Parser(prog=prog, description=(__doc__ or "").split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("docker-build", help="print the docker build command of a profile (shell words)")
    build.add_argument("profile")
    build.add_argument("--image-name", default="gaudi-cluster")
    build.add_argument("--version", required=True)
    build.add_argument("--git-rev", required=True)
    build.add_argument("--dry-run", action="store_true", help="the summary as # lines before the command")
    build.add_argument("--deepspeed-commit", default="", help="full SHA of the Habana DeepSpeed branch head")
    build.add_argument(
        "--deepspeed-repo", default="", help="the fork's git URL (default: facts.deepspeed_fork_repo)"
    )
    build.add_argument(
        "--pins-dir", default="build/pins", help="where the last build recorded its fork commit"
    )
    build.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="override a build arg"
    )
    pin = sub.add_parser(
        "record-pin", help="write the fork commit of a built image to the profile's pin file"
    )
    pin.add_argument("profile")
    pin.add_argument("--image", required=True)
    pin.add_argument("--pins-dir", default="build/pins")
    sub.add_parser("check", help="exit 1 when the matrix contradicts itself")
    sub.add_parser("table", help="the 'which profile for which hardware' table (Markdown)")
    get = sub.add_parser("get", help="one value of a profile, e.g. synapse.version")
    get.add_argument("profile")
    get.add_argument("key")
    args = parser.parse_args(argv)
    matrix = load()
    problems = consistency_problems(matrix)
    if problems:
        for problem in problems:
            print(f"profiles.json: {problem}", file=sys.stderr)
        print("profiles.json: inconsistent; fix: correct the pins above", file=sys.stderr)
        return 1
    try:
        if args.command == "docker-build":
            return _docker_build(args)
        if args.command == "record-pin":
            return _record_pin(args)
        if args.command == "table":
            print(markdown_table(matrix))
        elif args.command == "get":
            print(matrix.profile(args.profile).get(args.key))
    except ConfigError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    return 0


def _docker_build(args: argparse.Namespace) -> int:
    matrix = load()
    profile = matrix.profile(args.profile)
    ds = profile.data["habana_deepspeed"]
    repo = args.deepspeed_repo or matrix.facts["deepspeed_fork_repo"]
    choice = (args.profile, ds["branch"], repo, ds["commit"], args.deepspeed_commit or None, args.pins_dir)
    overrides = dict(_pair(item) for item in args.set)
    if args.dry_run:
        pinned = fork_pin.pin_path(args.pins_dir, args.profile)
        commit = choice[4] or choice[3] or (fork_pin.choose(*choice).commit if pinned.is_file() else None)
        how = fork_pin.how(*choice)
        argv = docker_build_argv(
            profile, args.image_name, args.version, args.git_rev, commit, repo, overrides
        )
        print("\n".join(f"# {line}" for line in summary(profile, commit, how)))
        if commit is None:
            print(
                f"# note: the build passes the resolved commit as HABANA_DEEPSPEED_REF (here: {ds['branch']})"
            )
        print(shlex.join(argv))
        return 0
    pin = fork_pin.choose(*choice)
    argv = docker_build_argv(
        profile, args.image_name, args.version, args.git_rev, pin.commit, repo, overrides
    )
    print("\n".join(f"make image: {line}" for line in summary(profile, pin.commit)), file=sys.stderr)
    print(f"make image: Habana DeepSpeed {pin.branch} = {pin.commit} ({pin.source}; {repo})", file=sys.stderr)
    print(shlex.join(argv))
    return 0


def _pair(item: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep or not name:
        raise ConfigError(f"--set {item!r} is not NAME=VALUE; fix: NAME=VALUE, e.g. BASE_IMAGE=x:1")
    return name, value


def _record_pin(args: argparse.Namespace) -> int:
    """After a build: the pin file says what the image installed (its labels), for the next build."""
    profile = load().profile(args.profile)
    done = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{json .Config.Labels}}", args.image],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise ConfigError(
            f"image {args.image} is not there ({done.stderr.strip()[:120]}); fix: build it first"
        )
    labels = json.loads(done.stdout) or {}
    pin = fork_pin.ForkPin.from_env(
        args.profile,
        f"HABANA_DEEPSPEED_COMMIT={labels.get(fork_pin.COMMIT_LABEL, '')}",
        f"the label {fork_pin.COMMIT_LABEL} of {args.image}",
    )
    pin = fork_pin.ForkPin(
        args.profile, profile.data["habana_deepspeed"]["branch"], labels.get(fork_pin.REPO_LABEL, ""),
        pin.commit, f"labels of {args.image}",
    )  # fmt: skip
    path = fork_pin.record(pin, args.pins_dir)
    print(f"make image: recorded Habana DeepSpeed {pin.branch} = {pin.commit} in {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

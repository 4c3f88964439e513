"""`python -m gaudi_cluster.settings.profiles_cli`: the profile matrix for the build and the docs.

    python -m gaudi_cluster.settings.profiles_cli docker-build dl1 --image-name gaudi-cluster \\
        --version 0.1.0 --git-rev abc [--dry-run] [--deepspeed-commit SHA]
    python -m gaudi_cluster.settings.profiles_cli check | table | get dl1 synapse.version

Standard library only, so `make image` needs no virtual environment. docker-build prints the command on
stdout; --dry-run puts the build's summary before it (as # lines), otherwise the summary goes to stderr
and a profile whose Habana DeepSpeed commit is not recorded is refused unless --deepspeed-commit gives it.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from typing import NoReturn

from gaudi_cluster.errors import ConfigError
from gaudi_cluster.settings.profiles import load
from gaudi_cluster.settings.profiles_build import docker_build_argv, markdown_table, summary, unpinned_note
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
        if args.command == "table":
            print(markdown_table(matrix))
        elif args.command == "get":
            print(matrix.profile(args.profile).get(args.key))
    except ConfigError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    return 0


def _docker_build(args: argparse.Namespace) -> int:
    profile = load().profile(args.profile)
    commit = args.deepspeed_commit or None
    command = shlex.join(docker_build_argv(profile, args.image_name, args.version, args.git_rev, commit))
    lines = summary(profile, commit)
    unpinned = unpinned_note(profile, commit)
    if args.dry_run:
        print("\n".join(f"# {line}" for line in lines))
        if unpinned:
            print(f"# warning: {unpinned}")
        print(command)
        return 0
    print("\n".join(f"make image: {line}" for line in lines), file=sys.stderr)
    if unpinned:
        raise ConfigError(f"{unpinned} (make image HABANA_DEEPSPEED_COMMIT=...)")
    print(command)
    return 0


if __name__ == "__main__":
    sys.exit(main())

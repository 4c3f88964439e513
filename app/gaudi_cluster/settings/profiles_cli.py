"""`python -m gaudi_cluster.settings.profiles_cli`: the profile matrix for the build and the docs.

    python -m gaudi_cluster.settings.profiles_cli docker-build dl1 --image-name gaudi-cluster \\
        --version 0.1.0 --git-rev abc
    python -m gaudi_cluster.settings.profiles_cli check | table | get dl1 synapse.version

Standard library only, so `make image` needs no virtual environment.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence

from gaudi_cluster.errors import ConfigError
from gaudi_cluster.settings.profiles import consistency_problems, docker_build_argv, load, markdown_table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gaudi_cluster.settings.profiles_cli", description=(__doc__ or "").split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("docker-build", help="print the docker build command of a profile (shell words)")
    build.add_argument("profile")
    build.add_argument("--image-name", default="gaudi-cluster")
    build.add_argument("--version", required=True)
    build.add_argument("--git-rev", required=True)
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
            profile = matrix.profile(args.profile)
            print(shlex.join(docker_build_argv(profile, args.image_name, args.version, args.git_rev)))
        elif args.command == "table":
            print(markdown_table(matrix))
        elif args.command == "get":
            print(matrix.profile(args.profile).get(args.key))
    except ConfigError as error:
        print(f"gaudi_cluster.settings.profiles_cli: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

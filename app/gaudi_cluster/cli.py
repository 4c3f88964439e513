"""`gaudi-cluster` command line: parse, resolve the configuration, dispatch; errors become exit codes."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gaudi_cluster import __version__
from gaudi_cluster.config import DEFAULT_JOB_ROOT, add_config_flags, resolve_config
from gaudi_cluster.errors import GaudiClusterError

log = logging.getLogger("gaudi_cluster")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gaudi-cluster",
        description="Multi-node DeepSpeed training on Intel Gaudi (and CPU/CUDA) servers from one image.",
    )
    parser.add_argument("--version", action="version", version=f"gaudi-cluster {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    master = sub.add_parser(
        "master", help="discover peers, check them, launch the job on every node, supervise it"
    )
    add_config_flags(master)
    master.add_argument(
        "job",
        nargs=argparse.REMAINDER,
        help="script.py ARGS | -m module ARGS | command ARGS (default: the bundled workload)",
    )

    spawn = sub.add_parser(
        "spawn", help="gaudi_spawn.py-compatible launch (--hostfile H --use_deepspeed script …)"
    )
    spawn.add_argument(
        "--dry-run", action="store_true", help="print hostfile, env file and command; launch nothing"
    )
    spawn.add_argument(
        "spawn_args", nargs=argparse.REMAINDER, help="gaudi_spawn.py flags, the script and its args"
    )

    doctor = sub.add_parser(
        "doctor", help="preflight every node in parallel; table and JSON; non-zero if blocking"
    )
    add_config_flags(doctor)
    doctor.add_argument("--json", action="store_true", help="print JSON only")

    probe = sub.add_parser(
        "probe", help="report this node as JSON (the master runs it over ssh)", add_help=False
    )
    probe.add_argument("probe_args", nargs=argparse.REMAINDER)

    reap = sub.add_parser("reap", help="kill what is left of one job on this node (by its pid files)")
    reap.add_argument("--job-id", required=True)
    reap.add_argument("--job-root", default=DEFAULT_JOB_ROOT)

    check = sub.add_parser("hostfile", help="validate a hostfile and print it normalized")
    check.add_argument("path")
    return parser


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="gaudi-cluster: %(message)s",
        stream=sys.stderr,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["spawn"]:
        # gaudi_spawn.py's flags pass through untouched (argparse cannot nest them).
        return _spawn(args_list[1:])
    if args_list[:1] == ["probe"]:
        from gaudi_cluster import probe

        return probe.main(args_list[1:])
    parser = _parser()
    args = parser.parse_args(args_list)
    _configure_logging(args.verbose)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return _dispatch(args)
    except GaudiClusterError as error:
        print(f"gaudi-cluster: error: {error}", file=sys.stderr)
        return error.exit_code


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "reap":
        from gaudi_cluster.reap import reap_job

        killed = reap_job(Path(args.job_root), args.job_id)
        log.info("job %s: %d leftover processes killed", args.job_id, len(killed))
        return 0
    if args.command == "hostfile":
        from gaudi_cluster.hostfile import read_hostfile, render_hostfile

        hostfile = read_hostfile(args.path)
        sys.stdout.write(render_hostfile(hostfile))
        return 0
    config = resolve_config(vars(args), os.environ)
    if args.command == "doctor":
        from gaudi_cluster.doctor import run_doctor

        return run_doctor(config, os.environ, sys.stdout, json_only=args.json)
    from gaudi_cluster import master

    if config.hold:
        return master.hold(config, os.environ, sys.stdout)
    return master.run_master(config, args.job, os.environ, sys.stdout)


def _spawn(argv: list[str]) -> int:
    from gaudi_cluster.config import parse_bool
    from gaudi_cluster.spawn import spawn_main

    _configure_logging(False)
    dry_run = parse_bool(os.environ.get("GAUDI_CLUSTER_DRY_RUN", "0"))
    if argv[:1] == ["--dry-run"]:
        dry_run, argv = True, argv[1:]
    try:
        return spawn_main(argv, dry_run=dry_run)
    except GaudiClusterError as error:
        print(f"gaudi-cluster: error: {error}", file=sys.stderr)
        return error.exit_code

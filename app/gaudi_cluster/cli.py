"""`gaudi-cluster` command line: parse, resolve the configuration, dispatch; errors become exit codes.

Exit codes (bound in `errors`, as for every entry point): 0 ok, 1 job failure, 2 bad input, 3 cluster
not ready, 128+N stopped by signal N. Bad input is always one line naming the culprit and the fix.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gaudi_cluster import __version__
from gaudi_cluster.errors import GaudiClusterError, error_line, exit_code_for, quoted
from gaudi_cluster.settings import command_line
from gaudi_cluster.settings.config import resolve_config
from gaudi_cluster.settings.flags import add_config_flags
from gaudi_cluster.settings.usage import OneLineParser, add_job_root_flag, examples
from gaudi_cluster.view.logs import configure_logging

log = logging.getLogger("gaudi_cluster")

# What the doctor's survey and checks read; the launch-only settings would only clutter its --help.
DOCTOR_SETTINGS = (
    "peers",
    "peers_dns",
    "hostfile",
    "nodes",
    "wait_timeout",
    "ssh_port",
    "ssh_dir",
    "accelerator",
    "slots",
    "master_addr",
    "env_preset",
    "env",
    "env_pass",
    "socket_ifname",
    "min_free_disk",
    "job_root",
    "launcher",
    "master_port",
    "control_port",
    "include",
    "exclude",
    "fabric_check",
    "fabric_timeout",
)


def _parsers() -> tuple[OneLineParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and its subcommand parsers by name."""
    parser = OneLineParser(
        prog="gaudi-cluster",
        description=(
            "Multi-node DeepSpeed training on Intel Gaudi (and CPU/CUDA) servers from one Docker image. "
            "Every node runs the same image; one runs `master`, the others `worker` (sshd). Settings come "
            "from flags, then GAUDI_CLUSTER_* variables, then defaults.\n\nexit codes: 0 ok, 1 job failed, "
            "2 bad input (nothing launched), 3 cluster not ready, 128+N stopped by signal N"
        ),
        epilog=examples(
            "gaudi-cluster master --peers-dns worker --nodes 3",
            "gaudi-cluster master --hostfile /job/hostfile -m mypkg.train --lr 1e-4",
            "gaudi-cluster spawn --world_size 8 --use_deepspeed run_clm.py --deepspeed ds.json",
        ),
    )
    parser.add_argument("--version", action="version", version=f"gaudi-cluster {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging (also after the command)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)

    master = sub.add_parser(
        "master",
        help="discover peers, check them, launch the job on every node, supervise it",
        description=(
            "Find the other nodes (static list, DNS name, hostfile, Slurm or MPI Operator), wait for all of "
            "them under one deadline, probe and check them over ssh, write the hostfile and .deepspeed_env, "
            "launch the job on every node under rank agents, and stop it everywhere on the first failure. "
            "The job is `script.py ARGS`, `-m module ARGS` or any command, after the flags (or after --); "
            "without one, the bundled workload trains its embedded default. A job whose only node is this "
            "one runs locally without ssh."
        ),
        epilog=examples(
            "gaudi-cluster master --peers worker-1,worker-2 train.py --epochs 1",
            "gaudi-cluster master --hostfile /job/hostfile --launcher mpirun -m mypkg.train",
            "gaudi-cluster master --dry-run --peers-dns worker --nodes 3",
        ),
    )
    add_config_flags(master)
    master.add_argument(
        "job", nargs="*", metavar="JOB", help="script.py ARGS | -m module ARGS | command ARGS"
    )

    # Parsed by their own modules (spawn: gaudi_spawn.py's parser); listed here for --help.
    sub.add_parser(
        "spawn",
        help="gaudi_spawn.py-compatible launch (gaudi-cluster spawn --help for its flags)",
        add_help=False,
    )
    sub.add_parser(
        "aws",
        help="provision, reach and delete a DL1 cluster on AWS (pip install 'gaudi-cluster[aws]')",
        add_help=False,
    )

    doctor = sub.add_parser(
        "doctor",
        help="preflight every node in parallel; table and JSON; exit 3 if anything blocks a launch",
        description=(
            "Survey every node as the master would (discovery, sshd, the probe over ssh) and check: ssh "
            "reachability, slots against detected devices, the socket interface, EFA devices and provider "
            "and hccl_ofi_wrapper (when HCCL goes over OFI), the job's script on every node, identical "
            "package versions, image build and python, free disk and /dev/shm. Prints a table, then JSON. "
            "The master runs the same checks before every launch."
        ),
        epilog=examples("gaudi-cluster doctor --peers-dns worker --nodes 3", "gaudi-cluster doctor --json"),
    )
    add_config_flags(doctor, DOCTOR_SETTINGS)
    doctor.add_argument("--json", action="store_true", help="print the JSON only")
    # master's name for the same check (--fabric-check, from the settings); --fabric is its old name.
    doctor.add_argument(
        "--fabric", dest="fabric_check", action="store_const", const="1", help=argparse.SUPPRESS
    )

    status = sub.add_parser(
        "status",
        help="nodes and ranks of the running job: state, step, step time, heartbeat, last line",
        description=(
            "Ask the running master (on this node: run it inside the master's container) for its job's "
            "state over a local socket in the job directory: one row per rank with its host, device, "
            "state, step, step time, heartbeat age and last output line, the live progress line and the "
            "stragglers named so far."
        ),
        epilog=examples(
            "docker exec gaudi-cluster-master gaudi-cluster status",
            "gaudi-cluster status --job-id 20261130-120000-a1b2c3 --json",
        ),
    )
    status.add_argument("--job-id", help="a job under --job-root; default: the running one")
    status.add_argument("--json", action="store_true", help="print the JSON snapshot")
    add_job_root_flag(status)

    sub.add_parser(
        "probe",
        help="report this node as JSON (the master runs it on every node; gaudi-cluster probe --help)",
        add_help=False,
    )

    reap = sub.add_parser(
        "reap",
        help="kill what is left of one job on this node (by its pid files)",
        description="Kill the process groups and agents recorded in one job's pid files on this node.",
        epilog=examples("gaudi-cluster reap --job-id 20261130-120000-a1b2c3"),
    )
    reap.add_argument("--job-id", required=True, help="the job to clean up (a directory under --job-root)")
    add_job_root_flag(reap)

    check = sub.add_parser(
        "hostfile",
        help="validate a hostfile and print it normalized",
        description=(
            "Check a DeepSpeed hostfile ('host slots=N' per line, # comments) as strictly as the master "
            "does, print it normalized on stdout and a summary (nodes, slots) on stderr."
        ),
        epilog=examples("gaudi-cluster hostfile /job/hostfile"),
    )
    check.add_argument("path", help="the hostfile to check")
    sub.add_parser(
        "profiles",
        help="the image profiles: check | table | get PROFILE KEY | docker-build PROFILE ...",
        add_help=False,
    )
    for command in (master, doctor, status, reap, check):
        # After the command too; SUPPRESS keeps a -v given before it from being reset.
        command.add_argument(
            "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging"
        )
    return parser, {
        "master": master,
        "doctor": doctor,
        "reap": reap,
        "hostfile": check,
        "status": status,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(args_list)
    except GaudiClusterError as error:
        print(error_line(error), file=sys.stderr)
        return exit_code_for(error)


def _main(args_list: list[str]) -> int:
    leading, rest = command_line.leading_words(args_list)
    parser, commands = _parsers()
    if rest[:1] == ["spawn"]:
        from gaudi_cluster import spawn

        # gaudi_spawn.py's flags and the script's own arguments pass through to its parser.
        return spawn.main(
            [*[w for w in leading if w in ("-v", "--verbose")], *rest[1:]], "gaudi-cluster spawn"
        )
    if rest[:1] == ["aws"]:
        from gaudi_cluster.aws.cli import main as aws_main

        return aws_main(rest[1:])
    if rest[:1] == ["probe"]:  # parsed by its module, which the master runs on every node itself
        from gaudi_cluster.nodes import probe

        return probe.main(rest[1:], "gaudi-cluster probe")
    if rest[:1] == ["profiles"]:
        from gaudi_cluster.settings import profiles_cli

        return profiles_cli.main(rest[1:], prog="gaudi-cluster profiles")
    if rest[:1] == ["master"]:
        flags, job = command_line.split_job(commands["master"], rest[1:])
        args, extra = parser.parse_known_args([*leading, "master", *flags])
        args.job = job
    else:
        args, extra = parser.parse_known_args(args_list)
    if extra:  # named by the command's own parser, whose --help lists what it takes
        command = commands.get(args.command)
        (command or parser).error(f"unrecognized arguments: {' '.join(quoted(word) for word in extra)}")
    configure_logging(args.verbose)
    if args.command is None:
        parser.print_help()
        return 2
    return _dispatch(args)


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "reap":
        from gaudi_cluster.rank.jobdir import existing_job
        from gaudi_cluster.rank.reap import reap_job

        root = Path(command_line.job_root(args))
        existing_job(root, args.job_id)  # a typo or a path out of the root is refused, not "reaped"
        killed = reap_job(root, args.job_id)
        log.info("job %s: %d leftover processes killed", args.job_id, len(killed))
        return 0
    if args.command == "status":
        from gaudi_cluster.view import status

        return status.main(Path(command_line.job_root(args)), args.job_id, args.json)
    if args.command == "hostfile":
        from gaudi_cluster.nodes.hostfile import render_hostfile
        from gaudi_cluster.nodes.world import read_hostfile

        hostfile = read_hostfile(args.path)
        sys.stdout.write(render_hostfile(hostfile))
        print(f"{args.path}: {len(hostfile.entries)} nodes, {hostfile.world_size} slots", file=sys.stderr)
        return 0
    config = resolve_config(vars(args), os.environ)
    if args.command == "doctor":
        from gaudi_cluster.doctor import run_doctor

        return run_doctor(config, os.environ, sys.stdout, json_only=args.json)
    from gaudi_cluster import master

    if config.hold:
        return master.hold(config, os.environ, sys.stdout)
    return master.run_master(config, args.job, os.environ, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())

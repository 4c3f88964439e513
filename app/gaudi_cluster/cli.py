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
from typing import NoReturn

from gaudi_cluster import __version__
from gaudi_cluster.errors import ConfigError, GaudiClusterError, error_line, exit_code_for, quoted
from gaudi_cluster.settings import command_line
from gaudi_cluster.settings.config import resolve_config
from gaudi_cluster.settings.flags import add_config_flags
from gaudi_cluster.view.logs import configure_logging
from gaudi_cluster.wire.kinds import AUTO, Accelerator

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


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (ConfigError, exit 2) and never abbreviates."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        # The caller's line already starts with `gaudi-cluster: error:`; the fix names this command.
        raise ConfigError(f"{message}; fix: see '{self.prog} --help'")


def _examples(*lines: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def _parsers() -> tuple[Parser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and its subcommand parsers by name."""
    parser = Parser(
        prog="gaudi-cluster",
        description=(
            "Multi-node DeepSpeed training on Intel Gaudi (and CPU/CUDA) servers from one Docker image. "
            "Every node runs the same image; one runs `master`, the others `worker` (sshd). Settings come "
            "from flags, then GAUDI_CLUSTER_* variables, then defaults.\n\nexit codes: 0 ok, 1 job failed, "
            "2 bad input (nothing launched), 3 cluster not ready, 128+N stopped by signal N"
        ),
        epilog=_examples(
            "gaudi-cluster master --peers-dns worker --nodes 3",
            "gaudi-cluster master --hostfile /job/hostfile -m mypkg.train --lr 1e-4",
            "gaudi-cluster spawn --world_size 8 --use_deepspeed run_clm.py --deepspeed ds.json",
        ),
    )
    parser.add_argument("--version", action="version", version=f"gaudi-cluster {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging (also after the command)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

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
        epilog=_examples(
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
        epilog=_examples("gaudi-cluster doctor --peers-dns worker --nodes 3", "gaudi-cluster doctor --json"),
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
        epilog=_examples(
            "docker exec gaudi-cluster-master gaudi-cluster status",
            "gaudi-cluster status --job-id 20261130-120000-a1b2c3 --json",
        ),
    )
    status.add_argument("--job-id", help="a job under --job-root; default: the running one")
    status.add_argument("--json", action="store_true", help="print the JSON snapshot")
    command_line.add_job_root_flag(status)

    probe = sub.add_parser(
        "probe",
        help="report this node as JSON (the master runs it over ssh)",
        description=(
            "Print one JSON line describing this node: hostname, python, accelerator and slots, package "
            "versions, image build, interfaces, the given paths, free disk and shm, EFA devices. With "
            "--stage it also creates the job's directory and writes the private payload read from stdin."
        ),
        epilog=_examples(
            "gaudi-cluster probe --json", "gaudi-cluster probe --accelerator hpu --path /w/run.py"
        ),
    )
    probe.add_argument("--json", action="store_true", help="print JSON (the only format)")
    probe.add_argument("--path", action="append", default=[], help="a path that must exist here; repeatable")
    probe.add_argument(
        "--accelerator",
        default="auto",
        choices=(AUTO, *Accelerator),
        help="device kind; default auto",
    )
    probe.add_argument(
        "--slots", type=command_line.positive, default=None, help="ranks per node on cpu; default 1"
    )
    probe.add_argument("--check-efa", action="store_true", help="also run fi_info -p efa")
    probe.add_argument(
        "--check-fabric",
        action="store_true",
        help="on an HPU node, also run fi_info -p efa and -p verbs (with the ranks' LD_LIBRARY_PATH)",
    )
    probe.add_argument(
        "--stage", metavar="JOB_ID", help="create this job's directory, private file from stdin"
    )
    probe.add_argument("--output-dir", help="report the free space where the job will write")
    probe.add_argument(
        "--srun-task",
        action="store_true",
        help="a task of the master's srun step: name this node first; --stage takes its own payload",
    )
    command_line.add_job_root_flag(probe)

    reap = sub.add_parser(
        "reap",
        help="kill what is left of one job on this node (by its pid files)",
        description="Kill the process groups and agents recorded in one job's pid files on this node.",
        epilog=_examples("gaudi-cluster reap --job-id 20261130-120000-a1b2c3"),
    )
    reap.add_argument("--job-id", required=True, help="the job to clean up (a directory under --job-root)")
    command_line.add_job_root_flag(reap)

    check = sub.add_parser(
        "hostfile",
        help="validate a hostfile and print it normalized",
        description=(
            "Check a DeepSpeed hostfile ('host slots=N' per line, # comments) as strictly as the master "
            "does, print it normalized on stdout and a summary (nodes, slots) on stderr."
        ),
        epilog=_examples("gaudi-cluster hostfile /job/hostfile"),
    )
    check.add_argument("path", help="the hostfile to check")
    sub.add_parser(
        "profiles",
        help="the image profiles: check | table | get PROFILE KEY | docker-build PROFILE ...",
        add_help=False,
    )
    for command in (master, doctor, status, probe, reap, check):
        # After the command too; SUPPRESS keeps a -v given before it from being reset.
        command.add_argument(
            "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging"
        )
    return parser, {
        "master": master,
        "doctor": doctor,
        "probe": probe,
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
    if args.command == "probe":
        from gaudi_cluster.nodes import probe

        return probe.run(
            args.path,
            args.accelerator,
            args.slots,
            args.check_efa,
            args.stage,
            command_line.job_root(args),
            args.output_dir,
            args.check_fabric,
            args.srun_task,
        )
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

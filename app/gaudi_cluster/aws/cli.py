"""`gaudi-cluster aws plan|up|down|status`: a DL1 cluster in one command, and gone in one.

Every check that can fail (inputs, instance type, zone, subnet, AMI, key pair, quota) runs before the
first resource is created. `up` converges by tag: run it again and it creates only what is missing.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import shutil
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from gaudi_cluster.aws import ec2, facts, keys, render
from gaudi_cluster.aws import request as inputs
from gaudi_cluster.aws.facts import TAG_CLUSTER
from gaudi_cluster.aws.up import INTERRUPTED, RUN_NODE, request_from, resolve, run_up
from gaudi_cluster.errors import ConfigError, GaudiClusterError, error_line, exit_code_for, quoted

log = logging.getLogger("gaudi_cluster.aws")

PROG = "gaudi-cluster aws"


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one ConfigError line (exit 2) instead of usage + exit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        # The line already starts with `gaudi-cluster: error:`; the fix names this command's help.
        raise ConfigError(f"{message}; fix: {self.prog} --help")

    def parse_args(self, args: Sequence[str] | None = None, namespace: None = None) -> argparse.Namespace:  # type: ignore[override]
        words = list(sys.argv[1:] if args is None else args)
        check_flags(self, words)
        return super().parse_args(words, namespace)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        allow_abbrev=False,
        description="Provision, reach and delete a DL1 (Gaudi) cluster on AWS EC2. Needs boto3: "
        "pip install 'gaudi-cluster[aws]'.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    plan = sub.add_parser(
        "plan",
        help="print what up would create, the AMI, price and quota; create nothing",
        allow_abbrev=False,
    )
    up = sub.add_parser(
        "up", help="create (or converge) the cluster and print how to reach the master", allow_abbrev=False
    )
    for command in (plan, up):
        _cluster_flags(command)
    up.add_argument(
        "--keys",
        type=Path,
        default=Path(".keys"),
        help="directory with the cluster key from make keys (default .keys)",
    )
    up.add_argument(
        "--identity-file", type=Path, help="private key of --key-name for ssh (default: ssh-agent / ~/.ssh)"
    )
    up.add_argument(
        "--run-node",
        type=Path,
        default=RUN_NODE,
        help="run-node.sh to install on the nodes (default: this checkout's)",
    )
    down = sub.add_parser(
        "down",
        help="delete everything tagged with the cluster id and verify nothing is left",
        allow_abbrev=False,
    )
    status = sub.add_parser("status", help="nodes, states, uptime and cost so far", allow_abbrev=False)
    for command in (down, status):
        # As plan and up take it (--cluster-id); the positional form is kept for the docs' examples.
        command.add_argument(
            "cluster_id", nargs="?", metavar="CLUSTER_ID", help="the cluster (the same as --cluster-id)"
        )
        command.add_argument(
            "--cluster-id",
            dest="cluster_id_flag",
            help=f"tag value naming the cluster, as given to up (default {facts.DEFAULT_CLUSTER_ID})",
        )
        command.add_argument(
            "--region", default=_default_region(), help="AWS region (default: AWS_REGION or us-east-1)"
        )
    down.add_argument(
        "--wait-timeout",
        type=float,
        default=facts.DEFAULT_WAIT_TIMEOUT_S,
        help=f"seconds for the whole teardown (default {facts.DEFAULT_WAIT_TIMEOUT_S:g})",
    )
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {
        name: sub
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, sub in action.choices.items()
    }


def check_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Refuse the first flag the command does not take, naming it, the closest one it takes and its
    help, before argparse would report something else first (a required --nodes) or point at the
    top-level help."""
    commands = _subcommands(parser)
    where = parser
    for word in argv:
        if word == "--":
            return
        if where is parser and word in commands:
            where = commands[word]
            continue
        flag = word.split("=", 1)[0]
        if not flag.startswith("-") or flag == "-" or flag[1:2].isdigit():
            continue  # a value (a negative number too)
        known = [option for action in where._actions for option in action.option_strings]
        if flag in known:
            continue
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        fix = f"{close[0]} ({where.prog} --help lists every flag)" if close else f"{where.prog} --help"
        raise ConfigError(f"{where.prog}: unknown flag {quoted(flag)}; fix: {fix}")


def _default_region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def _cluster_flags(command: argparse.ArgumentParser) -> None:
    add = command.add_argument
    add("--nodes", type=int, required=True, help="number of instances (node 0 is the master)")
    add(
        "--cluster-id",
        default=facts.DEFAULT_CLUSTER_ID,
        help=f"tag value naming the cluster (default {facts.DEFAULT_CLUSTER_ID})",
    )
    add("--region", default=_default_region(), help="AWS region (default: AWS_REGION or us-east-1)")
    add("--az", help="availability zone (default: the first that offers the instance type)")
    add("--subnet-id", help="subnet to use (default: the default VPC's subnet in the zone)")
    add("--instance-type", default=facts.DEFAULT_INSTANCE_TYPE, help=f"default {facts.DEFAULT_INSTANCE_TYPE}")
    add("--key-name", help="EC2 key pair to log in with (needed for --key-delivery ssh)")
    add("--ssh-cidr", help="allow ssh from this CIDR only, e.g. 203.0.113.7/32 (default: no ssh ingress)")
    add(
        "--allow-wide-ssh-source",
        action="store_true",
        help="accept an --ssh-cidr wider than /16 (IPv6: /48); refused otherwise",
    )
    add(
        "--ssh-user",
        default=facts.DEFAULT_SSH_USER,
        help=f"login user of the AMI (default {facts.DEFAULT_SSH_USER})",
    )
    add(
        "--placement-group",
        choices=("cluster", "none"),
        default="cluster",
        help="cluster placement group, or none (default cluster)",
    )
    add(
        "--image",
        default=facts.DEFAULT_IMAGE,
        help=f"node image each node runs (default {facts.DEFAULT_IMAGE})",
    )
    add(
        "--image-s3", help="s3:// URL of a `docker save` tar each node loads first (needs --instance-profile)"
    )
    add("--ami", help="AMI id (default: the newest Habana Deep Learning Base AMI for --synapse)")
    add("--ami-name", help="DescribeImages name pattern (default: Habana Base AMI of --synapse)")
    add("--ami-owner", default=facts.AMI_OWNER, help=f"AMI owner for the search (default {facts.AMI_OWNER})")
    add(
        "--synapse",
        default=facts.SYNAPSE_PROFILE,
        help=f"SynapseAI release of the image (default {facts.SYNAPSE_PROFILE})",
    )
    add(
        "--key-delivery",
        choices=("ssh", "ssm"),
        default="ssh",
        help="how the cluster key reaches the nodes (default ssh)",
    )
    add("--instance-profile", help="instance profile for the nodes (needed for ssm / --image-s3)")
    add(
        "--wait-timeout",
        type=float,
        default=facts.DEFAULT_WAIT_TIMEOUT_S,
        help=f"one deadline in seconds for every wait (default {facts.DEFAULT_WAIT_TIMEOUT_S:g})",
    )
    add(
        "--on-failure",
        choices=("rollback", "keep"),
        default="rollback",
        help="after a failed create (default rollback)",
    )


def _plan(args: argparse.Namespace) -> int:
    request = request_from(args)
    cloud = ec2.connect(request.region)
    resolved = resolve(cloud, request)
    sys.stdout.write(render.render_plan(resolved.spec, resolved.existing, resolved.changes, resolved.quota))
    facts.check_quota(resolved.quota, request.region)
    what = (
        "nothing to create: the cluster matches"
        if resolved.changes.empty
        else "plan only: nothing was created"
    )
    sys.stdout.write(f"{what}\n")
    return 0


def _cluster_of(args: argparse.Namespace) -> str:
    """down's and status's cluster: CLUSTER_ID or --cluster-id (one of them), else the default."""
    given, flag = args.cluster_id, args.cluster_id_flag
    if given is not None and flag is not None and given != flag:
        raise ConfigError(
            f"the cluster is named twice, as CLUSTER_ID {quoted(given)} and as --cluster-id {quoted(flag)}; "
            "fix: keep one of the two"
        )
    return inputs.validate_cluster_id(given or flag or facts.DEFAULT_CLUSTER_ID)


def _down(args: argparse.Namespace) -> int:
    cluster = _cluster_of(args)
    region = inputs.validate_region(args.region)
    if not args.wait_timeout > 0:
        raise ConfigError(f"--wait-timeout {args.wait_timeout:g} must be positive; fix: --wait-timeout 900")
    cloud = ec2.connect(region)
    found = cloud.find_tagged(cluster)
    if not len(found):
        sys.stdout.write(
            f"cluster {cluster} in {region}: nothing carries {TAG_CLUSTER}={cluster}; nothing to delete\n"
        )
        return 0
    log.info("deleting %s", found.describe())
    cloud.teardown(found, time.monotonic() + args.wait_timeout, cluster)
    left = cloud.find_tagged(cluster)
    if len(left):
        raise GaudiClusterError(
            f"down left {left.describe()}; "
            f"fix: run gaudi-cluster aws down {cluster} again, or delete them by hand"
        )
    shutil.rmtree(keys.state_dir(cluster), ignore_errors=True)
    sys.stdout.write(
        f"cluster {cluster} in {region}: deleted {found.describe()}; "
        f"nothing carries {TAG_CLUSTER}={cluster} any more\n"
    )
    return 0


def _status(args: argparse.Namespace) -> int:
    cluster = _cluster_of(args)
    region = inputs.validate_region(args.region)
    cloud = ec2.connect(region)
    nodes, public_ip = cloud.status(cluster)
    sys.stdout.write(render.render_status(cluster, region, nodes, public_ip, datetime.now(timezone.utc)))
    if nodes:
        sys.stdout.write(
            "\n".join(render.reach_lines(cluster, public_ip, None, facts.DEFAULT_SSH_USER)) + "\n"
        )
    return 0


def _configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="gaudi-cluster: %(message)s", stream=sys.stderr)
    # botocore says "Found credentials in …" at INFO; only our own progress belongs on stderr.
    for noisy in ("botocore", "boto3", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


HANDLERS = {"plan": _plan, "up": run_up, "down": _down, "status": _status}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `gaudi-cluster aws ARGS`; returns the exit code (0, 1, 2 bad input, 3 not ready)."""
    _configure_logging()
    try:
        args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
        if args.command is None:
            _parser().print_help(sys.stderr)
            return 2
        return HANDLERS[args.command](args)
    except SystemExit as done:  # --help
        return done.code if isinstance(done.code, int) else 0
    except GaudiClusterError as error:
        print(error_line(error), file=sys.stderr)
        return exit_code_for(error)
    except KeyboardInterrupt:
        print(
            "gaudi-cluster: interrupted; fix: run the same command again (up and down both converge)",
            file=sys.stderr,
        )
        return INTERRUPTED

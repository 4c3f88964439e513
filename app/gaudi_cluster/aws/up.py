"""`gaudi-cluster aws up` (and the checks `plan` shares): resolve every input against the region,
create what is missing, deliver the keys (delivery.py), print how to reach the master.

A failure while creating rolls back what that run created (--on-failure keep leaves it, tagged);
Ctrl-C leaves only tagged resources, which `down` removes.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gaudi_cluster.aws import delivery, ec2, facts, keys, render
from gaudi_cluster.aws import diff as diffs
from gaudi_cluster.aws import request as inputs
from gaudi_cluster.aws import spec as specs
from gaudi_cluster.aws.diff import Diff, Existing
from gaudi_cluster.aws.ec2 import Cloud, Resources
from gaudi_cluster.aws.facts import SSM_SECRETS_OF_ROLE, TAG_CLUSTER, QuotaCheck
from gaudi_cluster.aws.request import Request
from gaudi_cluster.aws.spec import ClusterSpec, NodeSpec
from gaudi_cluster.aws.userdata import NodeBoot, render_user_data
from gaudi_cluster.errors import ConfigError, GaudiClusterError

log = logging.getLogger("gaudi_cluster.aws")

RUN_NODE = Path(__file__).resolve().parents[3] / "scripts" / "run-node.sh"
INTERRUPTED = 130


def request_from(args: argparse.Namespace) -> Request:
    return inputs.validate_request(
        Request(
            nodes=args.nodes,
            region=args.region,
            cluster_id=args.cluster_id,
            az=args.az,
            subnet_id=args.subnet_id,
            instance_type=args.instance_type,
            key_name=args.key_name,
            ssh_cidr=args.ssh_cidr,
            allow_wide_ssh_source=args.allow_wide_ssh_source,
            ssh_user=args.ssh_user,
            placement_group=args.placement_group == "cluster",
            image=args.image,
            image_s3=args.image_s3,
            ami=args.ami,
            ami_name=args.ami_name,
            ami_owner=args.ami_owner,
            synapse=args.synapse,
            key_delivery=args.key_delivery,
            instance_profile=args.instance_profile,
            wait_timeout_s=args.wait_timeout,
            on_failure=args.on_failure,
            keys_dir=getattr(args, "keys", Path(".keys")),
        )
    )


@dataclass(frozen=True)
class Resolved:
    spec: ClusterSpec
    existing: Existing
    changes: Diff
    quota: QuotaCheck


def resolve(cloud: Cloud, request: Request) -> Resolved:
    """Every read-only check against the region, in the order a user would fix them."""
    type_facts = cloud.instance_type_facts(request.instance_type)
    gaudi = specs.gaudi_type(type_facts, request.region)
    offered = cloud.offered_zones(request.instance_type)
    az = specs.choose_az(request.instance_type, request.region, request.az, offered)
    network = cloud.network(request, az, offered)
    ami = cloud.resolve_ami(request)
    if request.key_name is not None:
        cloud.check_key_pair(request.key_name)
    spec = ClusterSpec(request, gaudi, network.az, network.vpc_id, network.subnet_id, ami)
    existing = cloud.existing(request.cluster_id)
    changes = diffs.diff(spec, existing)
    quota = cloud.quota(gaudi, len(changes.launch))
    return Resolved(spec, existing, changes, quota)


def run_up(args: argparse.Namespace) -> int:
    """`gaudi-cluster aws up`: check everything, create what is missing, deliver the keys, print the login."""
    request = request_from(args)
    cluster_keys = keys.read_cluster_keys(request.keys_dir)
    run_node = read_run_node(args.run_node)
    identity = args.identity_file
    if identity is not None and not identity.is_file():
        raise ConfigError(
            f"--identity-file {identity} does not exist; "
            f"fix: the private key of --key-name {request.key_name}"
        )
    cloud = ec2.connect(request.region)
    resolved = resolve(cloud, request)
    spec = resolved.spec
    sys.stdout.write(render.render_plan(spec, resolved.existing, resolved.changes, resolved.quota))
    facts.check_quota(resolved.quota, request.region)
    deadline = time.monotonic() + request.wait_timeout_s

    def user_data_for(node: NodeSpec, peers: tuple[str, ...]) -> str:
        boot = NodeBoot(
            cluster_id=spec.cluster_id,
            index=node.index,
            role=node.role,
            region=request.region,
            image=request.image,
            image_s3=request.image_s3,
            peers=peers,
            # Through SSM no node gets a certificate: nothing to pin the CA for.
            public_keys=cluster_keys.public_keys(pin_ca=request.key_delivery == "ssh"),
            # Each role reads only its own files; the client key is the master's alone.
            key_parameters={
                f: n for f, n in spec.parameter_names.items() if f in SSM_SECRETS_OF_ROLE[node.role]
            },
            key_delivery=request.key_delivery,
        )
        return render_user_data(boot, run_node)

    def put_parameters(journal: Resources) -> None:
        keys.put_key_parameters(cloud.ssm, spec.parameter_names, cluster_keys, spec.cluster_id, journal)

    journal = Resources()
    try:
        converged = cloud.converge(
            spec, resolved.existing, resolved.changes, user_data_for, put_parameters, journal, deadline
        )
    except KeyboardInterrupt:
        print(
            f"gaudi-cluster: interrupted; what was created ({journal.describe()}) carries the tag "
            f"{TAG_CLUSTER}={spec.cluster_id}; fix: gaudi-cluster aws down {spec.cluster_id} "
            "(or run up again to finish)",
            file=sys.stderr,
        )
        return INTERRUPTED
    except GaudiClusterError as error:
        raise after_failure(cloud, request, journal, error) from None
    ssh_config = None
    try:
        if request.key_delivery == "ssh":
            assert converged.public_ip is not None
            ssh_config = delivery.deliver_over_ssh(
                cloud,
                converged.nodes,
                converged.public_ip,
                cluster_keys,
                keys.state_dir(spec.cluster_id),
                request.ssh_user,
                identity,
                deadline,
            )
        else:
            launched = {n.index for n in resolved.changes.launch}
            delivery.receive_over_ssm(
                cloud, converged.nodes, launched, resolved.existing.parameters, spec.parameter_names, deadline
            )
    except GaudiClusterError as error:
        head, _, fix = str(error).partition("; fix: ")
        failure = GaudiClusterError(
            f"the cluster is up but {head}; fix: {fix or 'run up again'} (gaudi-cluster aws down "
            f"{spec.cluster_id} deletes it)"
        )
        failure.exit_code = error.exit_code
        raise failure from None
    lines = [f"cluster {spec.cluster_id} is up: {len(converged.nodes)} node(s) running"]
    lines += [f"  node {n.index} {n.role}: {n.instance_id} {n.private_ip}" for n in converged.nodes]
    shown_identity = (
        str(identity) if identity else f"~/.ssh/{request.key_name}.pem" if request.key_name else None
    )
    lines += render.reach_lines(spec.cluster_id, converged.public_ip, shown_identity, request.ssh_user)
    if ssh_config is not None:
        hosts = " ".join(["master", *(f"node-{n.index}" for n in converged.nodes[1:])])
        lines.append(f"   or: ssh -F {ssh_config} HOST, HOST one of: {hosts} (workers through the master)")
    lines.append(f"delete it all: gaudi-cluster aws down {spec.cluster_id} --region {request.region}")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def after_failure(
    cloud: Cloud, request: Request, journal: Resources, error: GaudiClusterError
) -> GaudiClusterError:
    """The error to report after a failed create, once this run's resources are rolled back (or kept)."""
    if not len(journal):
        return error
    head, _, fix = str(error).partition("; fix: ")
    cluster = request.cluster_id
    if request.on_failure == "keep":
        message = (
            f"{head}; kept what this run created ({journal.describe()}), tagged {TAG_CLUSTER}={cluster}; "
            f"fix: {fix or 'see above'}, then gaudi-cluster aws up again (it converges), or "
            f"gaudi-cluster aws down {cluster} to remove it"
        )
    else:
        log.info("rolling back what this run created: %s", journal.describe())
        try:
            cloud.teardown(journal, time.monotonic() + request.wait_timeout_s)
            left = cloud.remaining(journal)
            if len(left):
                raise GaudiClusterError(f"still there: {left.describe()}")
            message = (
                f"{head}; rolled back what this run created ({journal.describe()}); fix: {fix or 'see above'}"
            )
        except GaudiClusterError as rollback_error:
            reason = str(rollback_error).partition("; fix: ")[0]
            message = (
                f"{head}; the rollback failed too ({reason}); everything left carries the tag "
                f"{TAG_CLUSTER}={cluster}; fix: gaudi-cluster aws down {cluster}"
            )
    failure = GaudiClusterError(message)
    failure.exit_code = error.exit_code
    return failure


def read_run_node(path: Path) -> str:
    if not path.is_file():
        raise ConfigError(
            f"{path} not found (run-node.sh is what the nodes run); "
            "fix: --run-node PATH/TO/scripts/run-node.sh"
        )
    return path.read_text()

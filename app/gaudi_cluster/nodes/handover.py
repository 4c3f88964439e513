"""Master: a node that takes a lost node's place first gets the job's checkpoint, over the job's own ssh.

With node-local storage each node keeps its own copy; a spare has none, and without one the ranks
would agree on no common checkpoint and start afresh. Before the launch, the master finds the newest
checkpoint complete (train/checkpoints.py's marker) on every node that holds the job's checkpoints,
streams it from one of them to each newcomer (tar through the master, no key on the nodes) into a
hidden directory, and renames it to its live name only once both ends succeeded and its marker arrived.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gaudi_cluster.errors import ClusterNotReady
from gaudi_cluster.nodes import cleanup, ssh
from gaudi_cluster.nodes.survey import NodeSurvey

log = logging.getLogger("gaudi_cluster.nodes.handover")

COMPLETE_MARKER = "gaudi-cluster-complete.json"  # train/checkpoints.py's, the only proof of a whole save
INCOMING_PREFIX = ".incoming-"  # no reader matches it: a half-copied checkpoint is never used
COPY_TIMEOUT_S = 600.0
_LIST = (
    'cd "$1" 2>/dev/null || exit 0; for d in checkpoint-*; do [ -f "$d/$2" ] && echo "${d#checkpoint-}"; '
    "done; exit 0"
)


def deliver(survey: NodeSurvey, newcomers: Sequence[str], output_dir: str, job_root: str) -> list[str]:
    """send_checkpoint before a launch: when it fails, the attempt's staged files go and its ssh closes."""
    try:
        return send_checkpoint(survey, newcomers, output_dir)
    except BaseException:
        cleanup.remove_private_files(survey, job_root)
        survey.release()
        raise


def complete_steps(survey: NodeSurvey, hosts: Sequence[str], output_dir: str) -> dict[str, set[int]]:
    """Each host's complete checkpoint steps (an unreachable host: none)."""
    command = ["sh", "-c", _LIST, "sh", output_dir, COMPLETE_MARKER]
    replies = survey.reach.run(hosts, command, timeout_s=30, label="gc-steps")
    words = {host: " ".join(reply.lines).split() if reply.ok else [] for host, reply in replies.items()}
    return {host: {int(word) for word in found if word.isdigit()} for host, found in words.items()}


def common_step(steps: Mapping[str, set[int]]) -> int | None:
    """The newest step complete on every holder: what the ranks will agree to resume from."""
    holding = [found for found in steps.values() if found]
    if not holding:
        return None
    common = set.intersection(*holding)
    return max(common) if common else None


def send_checkpoint(survey: NodeSurvey, newcomers: Sequence[str], output_dir: str) -> list[str]:
    """Copy the agreed checkpoint to every newcomer that lacks it (at once); lines for the console.
    A copy that fails leaves nothing under a live name and stops the job (ClusterNotReady): started
    without it, the ranks would agree on no common checkpoint and set every saved one aside."""
    if not newcomers:
        return []
    if survey.ssh_config is None:
        # Copying between two nodes is one ssh pipe; srun steps have no node-to-node stream.
        raise ClusterNotReady(
            f"{', '.join(newcomers)} take lost nodes' places and need their checkpoint copied, which "
            f"is done over ssh, and the nodes are reached {survey.reached_by()}; "
            "fix: GAUDI_CLUSTER_SLURM_LAUNCH=ssh for a job with spares"
        )
    holders = [host for host in survey.hosts if host not in newcomers]
    steps = complete_steps(survey, [*holders, *newcomers], output_dir)
    step = common_step({host: steps[host] for host in holders})
    if step is None:
        return ["no complete checkpoint on the remaining nodes: the job starts from its beginning"]
    needing = [host for host in newcomers if step not in steps.get(host, set())]
    sources = [host for host in holders if step in steps[host]]
    if not needing:
        return []  # shared storage, or the newcomer kept its own copy
    with ThreadPoolExecutor(max_workers=min(32, len(needing))) as pool:
        done = list(
            pool.map(
                lambda pair: copy_one(survey, sources[pair[0] % len(sources)], pair[1], output_dir, step),
                enumerate(needing),
            )
        )
    failed = [line for ok, line in done if not ok]
    if failed:
        raise ClusterNotReady(f"{failed[0]}; fix: free the node's disk or drop it from the peers, then rerun")
    return [line for _, line in done]


def copy_one(survey: NodeSurvey, source: str, target: str, output_dir: str, step: int) -> tuple[bool, str]:
    """One node's checkpoint piped to another through the master (ssh to both: no key on the nodes)."""
    assert survey.ssh_config is not None  # send_checkpoint checked it
    name = f"checkpoint-{step}"
    incoming = str(Path(output_dir) / f"{INCOMING_PREFIX}{name}")
    live = str(Path(output_dir) / name)
    receive = (
        f"rm -rf {shlex.quote(incoming)} && mkdir -p {shlex.quote(incoming)} && "
        f"tar -C {shlex.quote(incoming)} --strip-components=1 -xf -"
    )
    send = ssh.ssh_argv(source, ["tar", "-C", output_dir, "-cf", "-", name], survey.ssh_config)
    take = ssh.ssh_argv(target, ["sh", "-c", receive], survey.ssh_config)
    with subprocess.Popen(send, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as sender:
        assert sender.stdout is not None
        received = subprocess.run(
            take, stdin=sender.stdout, capture_output=True, timeout=COPY_TIMEOUT_S, check=False
        )
        sender.stdout.close()
        sent_error = sender.stderr.read().decode(errors="replace") if sender.stderr else ""
        sender.wait(timeout=COPY_TIMEOUT_S)
    marker = shlex.quote(f"{incoming}/{COMPLETE_MARKER}")
    finish = (
        f"[ -f {marker} ] && rm -rf {shlex.quote(live)} && mv {shlex.quote(incoming)} {shlex.quote(live)}"
    )
    if sender.returncode == 0 and received.returncode == 0:
        moved = survey.reach.run([target], ["sh", "-c", finish], timeout_s=30, label="gc-handover")[target]
        if moved.ok:
            log.info("%s copied from %s to %s", name, survey.node_name(source), survey.node_name(target))
            return (
                True,
                f"{survey.node_name(target)} received {name} from {survey.node_name(source)} (complete)",
            )
    why = (sent_error or received.stderr.decode(errors="replace")).strip().splitlines()[-1:] or ["no marker"]
    log.warning("copying %s to %s failed: %s", name, target, why[0])
    return (
        False,
        f"could not copy {name} from {survey.node_name(source)} to {survey.node_name(target)} ({why[0]})",
    )

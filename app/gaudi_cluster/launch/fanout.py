"""Master: the direct launcher's process there, `gaudi_cluster.launch.node` on every node, in parallel.

It reads the launch (JSON) from stdin: for each node, whether it is this machine (then the node
process starts here, with no ssh at all) or another (then over ssh, riding the connection the
survey opened), and the node's spec, written to that process's stdin. Inside a Slurm allocation
it is not used: the master starts the launch's srun step itself (nodes/srun), every node included,
with the whole launch on the step's stdin, and each node's task takes its own entry. The agents'
prefixed lines pass straight through. It exits once every node process has, with the first failing
one's code; the supervisor stops it, and with it the whole process group, on teardown.

A node that hands over (its session ends once its ranks are seated) is launched in waves of at most
LAUNCH_WAVE sessions: each `ssh -T` client costs the master about 7.6 MB of RSS
(bench/results/ssh_client.json) while its node's ranks start, so 1,000 of them at once would hold
7.6 GB beside the 1,000 control masters' 3.6 GB. A session lasts about as long as its node takes to
seat its ranks (well under a second), and on one master core starting a thousand ssh clients is
CPU-bound anyway, so the waves cost the launch little. A node that does not hand over keeps its
session for the whole job: those all start at once, as a wave would never end.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections import deque

from gaudi_cluster.wire.node_spec import NODE_MODULE, FanoutSpec, NodeEntry, NodeSpecError

LAUNCH_WAVE = 48  # launch sessions of handing-over nodes open at once (see above)


def node_command(node: NodeEntry, launch: FanoutSpec) -> list[str]:
    local = [launch.python, "-u", "-m", NODE_MODULE]
    if node.here:
        return local
    # -T: no terminal; the node process's exit closes the session.
    return ["ssh", "-T", "-F", launch.ssh_config, "--", node.host, shlex.join(local)]


def _start(node: NodeEntry, launch: FanoutSpec) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(node_command(node, launch), stdin=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert process.stdin is not None
    process.stdin.write(node.spec.to_json().encode())
    process.stdin.close()
    return process


def launch_all(launch: FanoutSpec, wave: int = LAUNCH_WAVE) -> int:
    """Start every node's process (those that hand over, `wave` at a time), wait for them all, and
    give the first failing one's code (0 when none failed). After a failure no further wave starts:
    the job is ending, and the supervisor names why."""
    waves: deque[NodeEntry] = deque()
    running: dict[int, subprocess.Popen[bytes]] = {}
    for node in launch.nodes:
        if node.spec.hand_over and not node.here:
            waves.append(node)
        else:
            process = _start(node, launch)
            running[process.pid] = process
    in_wave: set[int] = set()
    failed = 0
    while running or (waves and not failed):
        while waves and not failed and len(in_wave) < wave:
            process = _start(waves.popleft(), launch)
            running[process.pid] = process
            in_wave.add(process.pid)
        # Whichever child ends first: one wait for any of them, not a poll of each.
        pid, status = os.wait()
        if (process := running.pop(pid, None)) is None:
            continue
        process.returncode = code = os.waitstatus_to_exitcode(status)
        in_wave.discard(pid)
        failed = failed or code
    return failed


def main() -> int:
    try:
        launch = FanoutSpec.from_json(sys.stdin.read())
    except NodeSpecError as error:
        print(f"gaudi-cluster[fanout]: error: bad launch on stdin ({error}); fix: let the master start it")
        return 2
    if launch.srun:  # the master starts an srun launch as the step itself (launch/launchers)
        print("gaudi-cluster[fanout]: error: an srun launch is its own step; fix: let the master start it")
        return 2
    return launch_all(launch)


if __name__ == "__main__":
    sys.exit(main())

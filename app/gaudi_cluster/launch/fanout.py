"""Master: the direct launcher's process there, `gaudi_cluster.launch.node` on every node, in parallel.

It reads the launch (JSON) from stdin: for each node, whether it is this machine (then the node
process starts here, with no ssh at all) or another (then over ssh, riding the connection the
survey opened), and the node's spec, written to that process's stdin. Inside a Slurm allocation
(the launch names an srun step, nodes/srun) it instead runs that one step, every node included,
with the whole launch on the step's stdin: each node's task takes its own entry. The agents'
prefixed lines pass straight through. It exits once every node process has, with the first failing
one's code; the supervisor stops it, and with it the whole process group, on teardown (srun passes
the SIGTERM on to every task of its step).
"""

from __future__ import annotations

import shlex
import subprocess
import sys

from gaudi_cluster.wire.node_spec import NODE_MODULE, FanoutSpec, NodeEntry, NodeSpecError


def node_command(node: NodeEntry, launch: FanoutSpec) -> list[str]:
    local = [launch.python, "-u", "-m", NODE_MODULE]
    if node.here:
        return local
    # -T: no terminal; the node process's exit closes the session.
    return ["ssh", "-T", "-F", launch.ssh_config, "--", node.host, shlex.join(local)]


def main() -> int:
    try:
        launch = FanoutSpec.from_json(sys.stdin.read())
    except NodeSpecError as error:
        print(f"gaudi-cluster[fanout]: error: bad launch on stdin ({error}); fix: let the master start it")
        return 2
    if launch.srun:
        step = subprocess.Popen(
            [*launch.srun, launch.python, "-u", "-m", NODE_MODULE, "--from-launch"],
            stdin=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert step.stdin is not None
        step.stdin.write(launch.to_json().encode())
        step.stdin.close()
        return step.wait()
    started = []
    for node in launch.nodes:
        process = subprocess.Popen(
            node_command(node, launch), stdin=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        assert process.stdin is not None
        process.stdin.write(node.spec.to_json().encode())
        process.stdin.close()
        started.append(process)
    codes = [process.wait() for process in started]
    return next((code for code in codes if code), 0)


if __name__ == "__main__":
    sys.exit(main())

"""The direct launcher's process on the master: `gaudi_cluster.launch.node` on every node, in parallel.

It reads the launch (JSON) from stdin: for each node, whether it is this machine (then the node
process starts here, with no ssh at all) or another (then over ssh, riding the connection the
survey opened), and the node's spec, written to that process's stdin. The agents' prefixed lines
pass straight through. It exits once every node process has, with the first failing one's code;
the supervisor stops it, and with it the whole process group, on teardown.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

NODE_MODULE = "gaudi_cluster.launch.node"


def node_command(node: Mapping[str, Any], launch: Mapping[str, Any]) -> list[str]:
    local = [str(launch["python"]), "-u", "-m", NODE_MODULE]
    if node["here"]:
        return local
    # -T: no terminal; the node process's exit closes the session.
    return ["ssh", "-T", "-F", str(launch["ssh_config"]), str(node["host"]), shlex.join(local)]


def main() -> int:
    try:
        launch = json.loads(sys.stdin.read())
        nodes = launch["nodes"]
        commands = [node_command(node, launch) for node in nodes]
    except (ValueError, KeyError, TypeError) as error:
        print(f"gaudi-cluster[fanout]: error: bad launch on stdin ({error}); fix: let the master start it")
        return 2
    started = []
    for node, command in zip(nodes, commands, strict=True):
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert process.stdin is not None
        process.stdin.write(json.dumps(node["spec"]).encode())
        process.stdin.close()
        started.append(process)
    codes = [process.wait() for process in started]
    return next((code for code in codes if code), 0)


if __name__ == "__main__":
    sys.exit(main())

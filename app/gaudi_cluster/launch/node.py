"""Node: the direct launcher's per-node process; starts this node's rank agents, waits for them.

`python -m gaudi_cluster.launch.node` reads its node spec (JSON) from stdin, never from its command
line; with --from-launch (a task of the master's srun step, launch/fanout) stdin is the whole launch
and it takes this node's entry (SLURMD_NODENAME, nodes/srun.pick_own). It gives each rank the
torch.distributed environment DeepSpeed's launch.py would: RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, CROSS_RANK, CROSS_SIZE, MASTER_ADDR, MASTER_PORT and
CUDA_VISIBLE_DEVICES (every DeepSpeed accelerator sets that one to the node's slot ids), plus the
job's variables, in the master's working directory with it first on PYTHONPATH (as DeepSpeed's
runner does). It imports no torch: the ranks are the first to do so. It exits when every agent has,
with the first failing agent's code; SIGTERM/SIGINT/SIGHUP reach every agent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

from gaudi_cluster.errors import ConfigError
from gaudi_cluster.nodes import srun
from gaudi_cluster.wire.node_spec import AGENT_MODULE, FanoutSpec, NodeSpec, NodeSpecError


def rank_environments(spec: NodeSpec, base: Mapping[str, str]) -> list[dict[str, str]]:
    """One environment per local rank (pure: `base` is this node's own environment)."""
    python_path = ":".join(part for part in (spec.cwd, base.get("PYTHONPATH", "")) if part)
    shared = {
        **base,
        **spec.env,
        "PYTHONPATH": python_path,
        "WORLD_SIZE": str(spec.world_size),
        "LOCAL_SIZE": str(len(spec.slots)),
        "CROSS_RANK": str(spec.node_rank),
        "CROSS_SIZE": str(spec.nnodes),
        "MASTER_ADDR": spec.master_addr,
        "MASTER_PORT": str(spec.master_port),
        "CUDA_VISIBLE_DEVICES": ",".join(str(slot) for slot in spec.slots),
    }
    return [
        {**shared, "RANK": str(spec.first_rank + i), "LOCAL_RANK": str(i)} for i in range(len(spec.slots))
    ]


def agent_command(spec: NodeSpec) -> list[str]:
    return [spec.python, "-u", "-m", AGENT_MODULE, *spec.agent_args]


def read_spec(text: str, from_launch: bool, env: Mapping[str, str]) -> NodeSpec:
    """This node's spec: stdin itself, or (from_launch) this node's entry of the whole launch."""
    if not from_launch:
        return NodeSpec.from_json(text)
    launch = FanoutSpec.from_json(text)
    hosts = {host: None for host in launch.hosts()}
    return launch.entry(srun.pick_own(hosts, env)).spec


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        spec = read_spec(sys.stdin.read(), args == ["--from-launch"], os.environ)
    except (NodeSpecError, ConfigError) as error:
        print(f"gaudi-cluster[node]: error: bad node spec on stdin ({error}); fix: let the master start it")
        return 2
    envs, command = rank_environments(spec, os.environ), agent_command(spec)
    try:
        agents = [subprocess.Popen(command, env=env, cwd=spec.cwd, stdin=subprocess.DEVNULL) for env in envs]
    except OSError as error:
        print(
            f"gaudi-cluster[node]: error: cannot start the rank agents in {spec.cwd}: {error.strerror}",
            flush=True,
        )
        return 1

    def forward(signum: int, _frame: object) -> None:
        for agent in agents:
            if agent.poll() is None:
                agent.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    codes = [agent.wait() for agent in agents]
    return next((code for code in codes if code), 0)


if __name__ == "__main__":
    sys.exit(main())

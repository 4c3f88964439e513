"""Node: the direct launcher's per-node process; starts this node's rank agents, waits for them.

`python -m gaudi_cluster.launch.node` reads its node spec (JSON) from stdin, never from its command
line; with --from-launch (a task of the master's srun step, launch/fanout) stdin is the whole launch
and it takes this node's entry (SLURMD_NODENAME, nodes/srun.pick_own). It gives each rank the
torch.distributed environment DeepSpeed's launch.py would: RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, CROSS_RANK, CROSS_SIZE, MASTER_ADDR, MASTER_PORT and
CUDA_VISIBLE_DEVICES (every DeepSpeed accelerator sets that one to the node's slot ids), plus the
job's variables, in the master's working directory with it first on PYTHONPATH (as DeepSpeed's
runner does). It imports no torch itself; unless the spec says `preimport: false` (--no-preimport) it
first starts the node's zygote (rank/zygote, with the environment the ranks share and one socketpair
per agent), which imports the heavy libraries once while the agents join, and forks the ranks. It
exits when every agent has, with the first failing agent's code; SIGTERM/SIGINT/SIGHUP reach every
agent.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence

from gaudi_cluster.errors import ConfigError
from gaudi_cluster.nodes import srun
from gaudi_cluster.rank.zygote_rules import script_of
from gaudi_cluster.wire.node_spec import AGENT_MODULE, ZYGOTE_MODULE, FanoutSpec, NodeSpec, NodeSpecError


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


def agent_command(spec: NodeSpec, zygote_fd: int | None = None) -> list[str]:
    given = [] if zygote_fd is None else ["--zygote-fd", str(zygote_fd)]
    return [spec.python, "-u", "-m", AGENT_MODULE, *given, *spec.agent_args]


def zygote_environment(rank_env: Mapping[str, str]) -> dict[str, str]:
    """What the node's ranks share (the zygote's environment): one rank's, less its identity."""
    return {k: v for k, v in rank_env.items() if k not in ("RANK", "LOCAL_RANK")}


def program_of(spec: NodeSpec) -> tuple[str, ...]:
    """The ranks' program: what the agent's arguments carry after their `--`."""
    args = spec.agent_args
    return args[args.index("--") + 1 :] if "--" in args else ()


def wants_zygote(spec: NodeSpec) -> bool:
    """Whether a zygote could fork this node's ranks: preimport on and a `python [-u] SCRIPT` program.

    Any other program (`-c`, `-m`, bash, another interpreter) starts plainly, so a zygote would only
    spend its imports, and a job that ends at once would wait for them (it ignores SIGTERM)."""
    return spec.preimport and not isinstance(script_of(program_of(spec), spec.python), str)


def start_zygote(
    spec: NodeSpec, env: Mapping[str, str], ranks: int
) -> tuple[subprocess.Popen[bytes], list[socket.socket]] | None:
    """The node's zygote and each agent's end of its socket, or None (the ranks then start plainly)."""
    pairs = [socket.socketpair() for _ in range(ranks)]
    theirs = [pair[1].fileno() for pair in pairs]
    try:
        zygote = subprocess.Popen(
            [spec.python, "-u", "-m", ZYGOTE_MODULE, "--fds", ",".join(map(str, theirs))],
            env=dict(env),
            cwd=spec.cwd,
            stdin=subprocess.DEVNULL,
            pass_fds=theirs,
        )
    except OSError as error:
        print(f"gaudi-cluster[node]: preimport off: cannot start the zygote: {error.strerror}", flush=True)
        zygote = None
    for pair in pairs:
        pair[1].close()
    if zygote is None:
        for pair in pairs:
            pair[0].close()
        return None
    return zygote, [pair[0] for pair in pairs]


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
    envs = rank_environments(spec, os.environ)
    zygote = start_zygote(spec, zygote_environment(envs[0]), len(envs)) if wants_zygote(spec) else None
    ends = zygote[1] if zygote else [None] * len(envs)
    try:
        agents = []
        for env, end in zip(envs, ends, strict=True):
            fd = None if end is None else end.fileno()
            command = agent_command(spec, fd)
            agents.append(
                subprocess.Popen(
                    command,
                    env=env,
                    cwd=spec.cwd,
                    stdin=subprocess.DEVNULL,
                    pass_fds=() if fd is None else (fd,),
                )
            )
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
    # The zygote leaves once every agent has closed its end: ours go now, the agents' with them.
    for end in ends:
        if end is not None:
            end.close()
    codes = [agent.wait() for agent in agents]
    if zygote:
        zygote[0].wait()
    return next((code for code in codes if code), 0)


if __name__ == "__main__":
    sys.exit(main())

"""Node: the direct launcher's per-node process; starts this node's rank agents, waits for them.

`python -m gaudi_cluster.launch.node` reads its node spec (JSON) from stdin, never from its command
line; with --from-launch (a task of the srun step the master starts as its launcher, launch/launchers)
stdin is the whole launch and it takes this node's entry (SLURMD_NODENAME, nodes/srun.pick_own). It
gives each rank the torch.distributed environment DeepSpeed's launch.py would: RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_SIZE, CROSS_RANK, CROSS_SIZE, MASTER_ADDR, MASTER_PORT and CUDA_VISIBLE_DEVICES
(every DeepSpeed accelerator sets that one to the node's slot ids), plus the job's variables, in the
master's working directory with it first on PYTHONPATH (as DeepSpeed's runner does). It imports no
torch itself; unless the spec says `preimport: false` (--no-preimport) its agents connect to the
node's zygote for the ranks' import-time settings (rank/zygote): the warm one a previous attempt or
job left, else a new one that imports the heavy libraries once while the agents join (and retires the
node's zygote of other settings); it forks the ranks. It exits when every agent has, with the first
failing agent's code; SIGTERM/SIGINT/SIGHUP reach every agent. Where the spec gives it the node's
`relay` (this process lives as long as its ranks: an srun task, the master's own node) it runs the
node relay in a thread before the agents start, and the agents as threads too, so the node starts one
interpreter besides its ranks instead of one a rank and a relay; it ends the relay once its agents
have exited. With `hand_over` (a node the master reached over ssh) it exits 0 as soon as
every agent is seated: the ranks' output and exits then travel only over the node relay, so the ssh
session that started this process, and the master's ssh client with it, can end while the job runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gaudi_cluster.errors import ConfigError
from gaudi_cluster.rank.zygote_rules import script_of, start_environment, zygote_name
from gaudi_cluster.wire.node_spec import AGENT_MODULE, ZYGOTE_MODULE, FanoutSpec, NodeSpec, NodeSpecError

if TYPE_CHECKING:
    from gaudi_cluster.rank.relay_host import HostedRelay


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


def agent_command(spec: NodeSpec, zygote_fd: int | None = None, ready_fd: int | None = None) -> list[str]:
    given = [] if zygote_fd is None else ["--zygote-fd", str(zygote_fd)]
    if ready_fd is not None:
        given += ["--ready-fd", str(ready_fd)]
    return [spec.python, "-u", "-m", AGENT_MODULE, *given, *spec.agent_args]


def all_seated(ready: Sequence[int]) -> bool:
    """Whether every agent said it was seated (one byte on its ready pipe) before any of them ended
    (its end of the pipe closed with nothing written): the node's ranks can then do without us."""
    for fd in ready:
        try:
            said = os.read(fd, 1)
        except OSError:
            said = b""
        finally:
            os.close(fd)
        if not said:
            return False
    return True


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


# How long a node process waits for the zygote it started to open its socket: an interpreter start,
# which a plain start of the ranks would spend again, so only a zygote that hangs should reach it.
LISTEN_WAIT_S = 30.0
# How long the relay it runs keeps trying the master's control channel (an agent's default too).
RELAY_CONNECT_S = 30.0


def zygote_place(uid: int, temp: str) -> Path | str:
    """The node's directory of warm zygote sockets (one per user), or why it cannot be used: it must
    be a real directory of ours that no one else can enter (a socket there forks as us)."""
    place = Path(temp) / f"gaudi-cluster-zygotes-{uid}"
    with contextlib.suppress(FileExistsError):
        place.mkdir(mode=0o700)
    st = place.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or stat.S_IMODE(st.st_mode) & 0o077:
        return f"{place} is not a directory of ours closed to others (remove it)"
    return place


def connect_agents(path: Path, ranks: int) -> list[socket.socket] | None:
    """One connection per agent to the zygote at `path`, or None when none answers there."""
    conns: list[socket.socket] = []
    for _ in range(ranks):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conns.append(conn)
        try:
            conn.connect(str(path))
        except OSError:
            for made in conns:
                made.close()
            return None
    return conns


def start_zygote(spec: NodeSpec, env: Mapping[str, str], ranks: int) -> Zygote | None:
    """Each agent's connection to this node's zygote for these settings: the warm one when it answers,
    else a new one (which retires the node's other zygote); None: the ranks then start plainly."""
    import tempfile  # here: a node without a zygote never needs it

    place = zygote_place(os.getuid(), tempfile.gettempdir())
    if isinstance(place, str):
        print(f"gaudi-cluster[node]: preimport off: {place}", flush=True)
        return None
    name = zygote_name(env, spec.python)
    path = place / f"{name}.sock"
    conns = connect_agents(path, ranks)
    if conns is not None:
        return Zygote(None, conns)
    for old in place.glob("*.sock"):  # a dead one's file, or the zygote of other settings
        old.unlink(missing_ok=True)
    log = place / f"{name}.log"
    process = spawn_zygote(spec, env, path, log)
    if process is None:
        return None
    deadline = time.monotonic() + LISTEN_WAIT_S
    while not path.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    conns = connect_agents(path, ranks)
    if conns is None:
        code = process.poll()
        if code is not None:
            why = f"it exited with status {code}"
        else:
            why = "it refused the connection" if path.exists() else f"not within {LISTEN_WAIT_S:g} s"
        print(
            f"gaudi-cluster[node]: preimport off: the zygote did not open {path} ({why}; its log: {log})",
            flush=True,
        )
        return None
    return Zygote(None if spec.preimport_keep_s > 0 else process, conns)


def spawn_zygote(
    spec: NodeSpec, env: Mapping[str, str], path: Path, log: Path
) -> subprocess.Popen[bytes] | None:
    """A new zygote listening at `path`, its output in `log`: a warm one outlives this ssh session and
    must not hold the session's output open, nor be in its session."""
    command = [
        spec.python,
        "-u",
        "-m",
        ZYGOTE_MODULE,
        "--listen",
        str(path),
        "--keep-s",
        f"{spec.preimport_keep_s:g}",
    ]
    if spec.preimport_keep_s <= 0:  # it leaves with the attempt: killed with us, however we end
        command += ["--leave-with", str(os.getpid())]
    try:
        output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    except OSError as error:
        print(f"gaudi-cluster[node]: preimport off: cannot open {log}: {error.strerror}", flush=True)
        return None
    try:
        return subprocess.Popen(
            command,
            env=start_environment(env),
            cwd=spec.cwd,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=spec.preimport_keep_s > 0,
        )
    except OSError as error:
        print(f"gaudi-cluster[node]: preimport off: cannot start the zygote: {error.strerror}", flush=True)
        return None
    finally:
        os.close(output)


@dataclass(frozen=True)
class Zygote:
    """The node's zygote as this node process holds it: each agent's connection, and the process
    itself when it leaves with the job (keep 0) and is to be waited for."""

    leaves_with_us: subprocess.Popen[bytes] | None
    conns: list[socket.socket]


def start_relay(spec: NodeSpec) -> HostedRelay | None:
    """The node's relay in this process, where the spec says so (this process outlives the ranks)."""
    if spec.relay is None:
        return None
    from gaudi_cluster.rank import relay_host  # here: a node process that hands its ranks over has none

    given = spec.relay
    return relay_host.host(
        given.job_id, Path(given.job_root), given.control, given.heartbeat_timeout_s, RELAY_CONNECT_S
    )


def read_spec(text: str, from_launch: bool, env: Mapping[str, str]) -> NodeSpec:
    """This node's spec: stdin itself, or (from_launch) this node's entry of the whole launch."""
    if not from_launch:
        return NodeSpec.from_json(text)
    from gaudi_cluster.nodes import srun  # here: the Slurm path's only (the docker path gets its spec)

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
    relay = start_relay(spec)  # first: the master admits the node while the zygote and agents start
    zygote = start_zygote(spec, zygote_environment(envs[0]), len(envs)) if wants_zygote(spec) else None
    ends: list[socket.socket | None] = list(zygote.conns) if zygote else [None] * len(envs)
    if relay is not None:  # this process lives as long as its ranks: their agents run in it too
        return run_agents_here(spec, envs, ends, relay, zygote)
    ready: list[int] = []  # our ends of the agents' ready pipes (spec.hand_over)
    try:
        agents = []
        for env, end in zip(envs, ends, strict=True):
            fds = [] if end is None else [end.fileno()]
            ready_fd = None
            if spec.hand_over:
                ours, ready_fd = os.pipe()
                ready.append(ours)
                fds.append(ready_fd)
            command = agent_command(spec, None if end is None else end.fileno(), ready_fd)
            try:
                agents.append(
                    subprocess.Popen(command, env=env, cwd=spec.cwd, stdin=subprocess.DEVNULL, pass_fds=fds)
                )
            finally:
                if ready_fd is not None:
                    os.close(ready_fd)
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
    # The zygote's idle time starts once every agent has closed its end: ours go now, theirs with them.
    for end in ends:
        if end is not None:
            end.close()
    if ready and all_seated(ready):
        # Every rank is seated and speaks through the node relay, output included: the launch's ssh
        # session ends here and no ssh client stays on the master for this node. The agents live on
        # (reparented), stopped by the master through the relay or by its silence.
        return 0
    codes = [agent.wait() for agent in agents]
    if relay is not None:
        relay.end()  # its agents' exits (and after a stop the node's reap) reach the master first
    if zygote and zygote.leaves_with_us:
        zygote.leaves_with_us.wait()  # not warm (Slurm): nothing of the job outlives this process
    return next((code for code in codes if code), 0)


def run_agents_here(
    spec: NodeSpec,
    envs: Sequence[dict[str, str]],
    ends: Sequence[socket.socket | None],
    relay: HostedRelay,
    zygote: Zygote | None,
) -> int:
    """The node's rank agents as threads of this process (one interpreter for the node's relay and
    all its agents, not one per rank); the first failing agent's code once all have ended."""
    import threading

    from gaudi_cluster.rank import agent as rank_agent  # here: a node that hands its ranks over runs none

    try:
        agents = [
            rank_agent.build(spec.agent_args, end, env=env, cwd=spec.cwd, in_node=True)
            for env, end in zip(envs, ends, strict=True)
        ]
    except SystemExit:  # the spec's agent arguments are the master's: a usage line said what is wrong
        return 2
    codes: list[int] = [1] * len(agents)

    def run(index: int) -> None:
        try:
            codes[index] = agents[index].run()
        except Exception as error:  # one agent's slip ends its rank's report, never its node's others
            print(f"gaudi-cluster[node]: error: rank agent {index} failed: {type(error).__name__}: {error}")

    def forward(signum: int, _frame: object) -> None:
        for agent in agents:
            agent.on_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    threads = [threading.Thread(target=run, args=(i,), name=f"agent-{i}") for i in range(len(agents))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    relay.end()  # its agents' exits (and after a stop the node's reap) reach the master first
    if zygote and zygote.leaves_with_us:
        zygote.leaves_with_us.wait()  # not warm (Slurm): nothing of the job outlives this process
    return next((code for code in codes if code), 0)


if __name__ == "__main__":
    sys.exit(main())

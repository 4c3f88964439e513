"""The rank agent: runs one rank's program on its node and keeps the master informed.

Every launcher (deepspeed, mpirun, torchrun) starts `python -m gaudi_cluster.rank.agent ... -- PROGRAM`
once per rank. The agent gives the program its own process group (so this job's processes can be
stopped without touching anyone else's), records a pid file under the job's directory, prefixes
each output line with "[host rank N]", keeps the last lines for the failure report, and talks to
the master through its node's relay (`relay`, the node's one control connection; started by the
first agent of the node): it reports its exit, and it kills its rank when told to or when the
master disappears (its link closed, or no heartbeat for --heartbeat-timeout seconds).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gaudi_cluster.rank import agent_beat, jobdir, procgroup, relay_join, shared_pipe
from gaudi_cluster.rank.conventions import (
    SHM_DIR,
    deepspeed_shm_buffer,
    output_dir_in,
    rank_identity,
    with_local_rank,
)
from gaudi_cluster.wire import messages, private_args
from gaudi_cluster.wire.channel import Channel, Unsendable
from gaudi_cluster.wire.protocol import BEAT_INTERVAL_S

if TYPE_CHECKING:
    import subprocess

    from gaudi_cluster.rank import zygote_client

# What only some agents use is imported where it is used: zygote_client (an agent of a node with a
# zygote), subprocess (an agent that starts its rank or the node's relay itself), shutil (a failed rank).

TAIL_LINES = 30
FULL_DISK_BYTES = 1 << 20
# A master gone silent or away is an abort: the rank 0 it hosts, or the partition, leaves the
# collectives nothing to save with, so the rank is killed at once (the last complete checkpoint stays).
ORPHAN_GRACE_S = 0.0
# SIGTERM/SIGINT to the agent itself (e.g. from deepspeed's launch.py on Ctrl-C) is a stop to save.
SIGNAL_GRACE_S = 15.0


class RankAgent:
    """One rank's agent. A process of its own (`main`), or one of several in the node process that
    hosts the node's relay (`in_node`: launch/node under srun and on the master's node), where it
    touches nothing process-wide: no signal handlers (the node process forwards its signals), no
    redirection of the process's output."""

    def __init__(
        self,
        job_id: str,
        program: Sequence[str],
        control: str | None,
        job_root: Path,
        heartbeat_timeout_s: float,
        connect_timeout_s: float = 30.0,
        local_rank_arg: bool = False,
        output_dir: str | None = None,
        zygote: zygote_client.ZygoteLink | None = None,
        output_to_relay: bool = False,
        ready_fd: int | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        in_node: bool = False,
    ) -> None:
        self.job_id = job_id
        self.in_node = in_node
        self.cwd = cwd or os.getcwd()
        # The direct launcher's ranks: once seated, the output goes over the relay's connection, and
        # the node process learns it on ready_fd (then it may end the ssh session that started it).
        self.output_to_relay = output_to_relay
        self.ready_fd = ready_fd
        self._relayed = False
        self.zygote = zygote  # the node's pre-imported parent (rank/zygote), when the node runs one
        self.program = list(program)
        # The master names it (--output-dir); an agent started by hand reads it off the program.
        self.output_dir = output_dir or output_dir_in(program) or self.cwd
        self.control_address = control
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.host = socket.gethostname()
        self.env = dict(os.environ if env is None else env)
        identity = rank_identity(self.env)
        self.rank, self.local_rank = identity.rank, identity.local_rank
        self.world, self.local_world = identity.world, identity.local_world
        # Programs launched by mpirun read the torch names, as under deepspeed and torchrun.
        self.env.update(
            RANK=str(self.rank),
            LOCAL_RANK=str(self.local_rank),
            WORLD_SIZE=str(self.world),
            LOCAL_WORLD_SIZE=str(self.local_world),
            GAUDI_CLUSTER_JOB_ID=job_id,
        )
        if local_rank_arg:
            self.program = with_local_rank(self.program, self.local_rank)
        self.job_dir = jobdir.create(job_root, job_id)
        # The job's secret and the variables forwarded on purpose: staged by the master over ssh
        # stdin, read before anything else (the master deletes the file once every rank has started).
        private = jobdir.read_private(self.job_dir)
        self.token = private.token if private else ""  # this node's key (protocol.node_key)
        self.node = private.node if private else self.host  # the node's name in the master's plan
        self.env.update(private.env if private else {})
        # Token-like program arguments came as placeholders (private_args): no launcher's argv held them.
        self.program, self.missing = self._restore_arguments(self.program)
        self.progress_file = self.job_dir / f"rank{self.rank}.progress"
        self.env["GAUDI_CLUSTER_PROGRESS_FILE"] = str(self.progress_file)
        self.env["GAUDI_CLUSTER_EVENTS_FILE"] = str(self.job_dir / "events.jsonl")
        self.work_sent, self.line_sent = -1, None
        self.pid_file = self.job_dir / f"rank{self.rank}.pid"
        self.log_path = self.job_dir / f"rank{self.rank}.log"
        self.prefix = f"[{self.host} rank {self.rank}] ".encode()
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.last_output = time.monotonic()
        self.last_beat = time.monotonic()
        self.stop_reason: str | None = None
        self.child: subprocess.Popen[bytes] | zygote_client.ZygoteChild | None = None
        self.channel: Channel | None = None
        self.ignored = 0  # control messages dropped for want of the session's MAC
        self._stop_lock = threading.Lock()
        self._stdout_ok = True
        self.signals: list[int] = []  # SIGTERM/SIGINT received (by the agent, or its node process)

    def _restore_arguments(self, program: list[str]) -> tuple[list[str], str | None]:
        names = [name for name in self.env if private_args.is_private_argument(name)]
        hidden = {name: self.env.pop(name) for name in names}  # not for the program's environment
        try:
            return private_args.restore(program, hidden), None
        except private_args.MissingPrivateArgument as error:
            return program, str(error)

    # --- the rank's process group -------------------------------------------------------------

    def start_child(self) -> None:
        if self.zygote is not None:
            forked = self.zygote.start(self.program, self.env, self.cwd)
            if isinstance(forked, str):
                self.say(f"preimport: plain start, not from the node's zygote: {forked}")
            else:
                self.child = forked
                jobdir.write_pid_file(self.pid_file, forked.pid, os.getpid())
                self.say("preimport: forked from the node's zygote")
                return
        import subprocess

        self.child = subprocess.Popen(
            self.program,
            env=self.env,
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        # "<process group> <agent pid>": what `gaudi-cluster reap` needs to end this job and only it.
        jobdir.write_pid_file(self.pid_file, self.child.pid, os.getpid())

    def stop_child(self, reason: str, grace_s: float) -> None:
        """Stop the rank's whole process group (once), with grace_s to save and exit."""
        with self._stop_lock:
            if self.stop_reason is not None or self.child is None:
                return
            self.stop_reason = reason
        self.say(f"stopping rank: {reason}")
        child = self.child
        procgroup.terminate(child.pid, grace_s, done=lambda: child.poll() is not None)

    # --- output ---------------------------------------------------------------------------------

    def say(self, text: str) -> None:
        self._emit([f"gaudi-cluster[rank]: {text}".encode()])

    def _emit(self, lines: list[bytes]) -> None:
        texts = [line.decode(errors="replace") for line in lines]
        self.tail.extend(texts)
        prefixed = [self.prefix + line + b"\n" for line in lines]
        out = b"".join(prefixed)
        with contextlib.suppress(OSError):
            self._log.write(out)
            self._log.flush()
        if self._relayed and self.channel is not None:
            for batch in messages.output_batches(texts):
                try:
                    if not self.channel.send(batch):
                        break  # the master is gone: the rank is being stopped, the local log keeps them
                except Unsendable:
                    continue  # a batch fits a line by construction; the local log keeps it anyway
            return
        if self._stdout_ok:
            try:
                shared_pipe.write_lines(sys.stdout.buffer, prefixed)
            except (BrokenPipeError, OSError):
                # The launcher's ssh session is gone; keep running under the control channel's
                # supervision and keep the local log.
                self._stdout_ok = False

    def _hand_over_output(self) -> None:
        """From the seat on, the rank's lines take the relay's connection; what else this process
        writes (a traceback, a library's warning) goes to the node's own rank log instead of the launch
        session, so that nothing of ours holds that session open. Then the node process is told."""
        if self.output_to_relay and self.channel is not None:
            self._relayed = True
            if self.in_node:  # the node process's own output stays its own
                return
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(self._log.fileno(), 1)
            os.dup2(self._log.fileno(), 2)
            if self.ready_fd is not None:
                with contextlib.suppress(OSError):
                    os.write(self.ready_fd, b"1")
        if self.ready_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.ready_fd)
            self.ready_fd = None

    def pump_output(self) -> None:
        assert self.child is not None and self.child.stdout is not None
        pending = b""
        for chunk in iter(lambda: self.child.stdout.read1(65536), b""):  # type: ignore[union-attr]
            self.last_output = time.monotonic()
            pending += chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            *lines, pending = pending.split(b"\n")
            if lines:
                self._emit(lines)
        if pending:
            self._emit([pending])

    # --- control channel ------------------------------------------------------------------------

    def beat_message(self) -> messages.Beat:
        """Progress measured on this node only: the age of the last step in the progress file, else of
        the last output line (any user script), and each new step's work time, once."""
        try:
            progress = json.loads(self.progress_file.read_text())
        except (OSError, ValueError):
            progress = None
        last = self.tail[-1] if self.tail else None
        message, self.work_sent = agent_beat.beat(
            progress if isinstance(progress, dict) else None,
            self.work_sent,
            time.monotonic() - self.last_output,
            time.time(),
            last if last != self.line_sent else None,
        )
        self.line_sent = last
        return message

    def listen(self) -> None:
        assert self.channel is not None
        while True:
            message = self.channel.receive(messages.FROM_MASTER)
            if message is None:
                if self.child is not None and self.child.poll() is None:
                    self.stop_child(
                        "the master closed the control channel (master stopped or lost)", ORPHAN_GRACE_S
                    )
                return
            if isinstance(message, messages.Dropped):
                # Only what the relay passes on from the master counts: nothing else changes anything.
                self.ignored += 1
                if self.ignored <= 3:  # a stream of them must not become a stream of lines
                    self.say(f"ignored a control message ({message.reason})")
                continue
            self.last_beat = time.monotonic()
            if isinstance(message, messages.Stop):
                grace = message.grace
                grace_s = grace if grace is not None and grace < 3600 else 10.0
                self.stop_child((message.reason or "the master stopped the job")[:200], grace_s)

    def beat(self) -> None:
        assert self.channel is not None and self.child is not None
        while self.child.poll() is None:
            self.channel.send(self.beat_message())
            silent_for = time.monotonic() - self.last_beat
            if silent_for > self.heartbeat_timeout_s:
                self.stop_child(f"no heartbeat from the master for {silent_for:.0f}s", ORPHAN_GRACE_S)
                return
            time.sleep(BEAT_INTERVAL_S)

    # --- main -----------------------------------------------------------------------------------

    def run(self) -> int:
        self._log = self.log_path.open("ab")
        if self.zygote is not None and (why := self.zygote.wait_ready()):
            # Before joining: the master's heartbeats start with the seat, and the imports take seconds.
            self.say(f"preimport: plain start, not from the node's zygote: {why}")
            self.zygote.close()
            self.zygote = None
        self.last_beat = time.monotonic()  # the master's silence counts from the join, not from the imports
        if self.control_address:
            try:
                if not self.token:
                    raise ConnectionError(
                        f"no secret for job {self.job_id} in {self.job_dir} (the master stages it before "
                        "launching); fix: start ranks through gaudi-cluster"
                    )
                me = messages.Join(self.host, self.rank, os.getpid(), self.node, self.local_rank)
                self.channel = relay_join.join(
                    self.job_dir,
                    self.job_id,
                    self.control_address,
                    me,
                    self.connect_timeout_s,
                    self.heartbeat_timeout_s,
                )
            except ConnectionError as error:
                self.say(f"error: {error}; the rank is not started without supervision")
                return 1
        self._hand_over_output()
        if self.missing:
            self.say(f"error: {self.missing}")
            self._report(2, None)
            return 2
        if self.signals:  # in the node process: its signal came before the rank started
            self.say(f"not starting the rank: {signal.Signals(self.signals[-1]).name} came first")
            self._report(128 + self.signals[-1], None)
            return 128 + self.signals[-1]
        try:
            self.start_child()
        except OSError as error:
            self.say(f"error: cannot start {self.program[0]!r}: {error}")
            self._report(127, None)
            return 127
        if not self.in_node:
            self._forward_signals()
        elif self.signals:  # one that came while it started, when there was no rank yet to stop
            self.on_signal(self.signals.pop())
        forwarded = self.signals
        pump = threading.Thread(target=self.pump_output, name="pump", daemon=True)
        pump.start()
        if self.channel is not None:
            threading.Thread(target=self.listen, name="listen", daemon=True).start()
            threading.Thread(target=self.beat, name="beat", daemon=True).start()
        assert self.child is not None
        returncode = self.child.wait()
        pump.join(timeout=5)
        code, signum = (128 - returncode, -returncode) if returncode < 0 else (returncode, None)
        if signum is None and forwarded and returncode == 0:
            code = 128 + forwarded[-1]
        if code != 0:
            self._note_full_disk()
        self._report(code, signum)
        with contextlib.suppress(OSError):
            self.pid_file.unlink()
        # Its peers mapped it at their start, so the name is no longer needed by anyone; the
        # worker container (or, with --ipc=host, the server) outlives the job.
        with contextlib.suppress(OSError):
            (SHM_DIR / deepspeed_shm_buffer(self.env, self.rank, os.getuid())).unlink()
        return code

    def _note_full_disk(self) -> None:
        """A rank that dies writing to a full disk often says only `unexpected pos` (torch's zip
        writer): name the cause when its output directory's disk is full."""
        import shutil

        with contextlib.suppress(OSError):
            if shutil.disk_usage(self.output_dir).free < FULL_DISK_BYTES:
                self.say(
                    f"No space left on device: {self.output_dir} has less than 1 MiB free on {self.host}"
                )

    def _report(self, code: int, signum: int | None) -> None:
        if self.channel is None:
            return
        # Its last lines are whatever the rank printed: cut to fit one line, so that the code arrives.
        exit_ = messages.Exit(code, signum, tuple(self.tail), self.stop_reason)
        self.channel.send(messages.fitted_exit(exit_, self.channel.room))
        self.channel.close()

    def on_signal(self, signum: int, _frame: object = None) -> None:
        """SIGTERM/SIGINT to the agent (e.g. from deepspeed's launch.py), or to the node process that
        hosts it, stop the rank gracefully."""
        self.signals.append(signum)
        threading.Thread(
            target=self.stop_child,
            args=(f"agent received {signal.Signals(signum).name}", SIGNAL_GRACE_S),
            daemon=True,
        ).start()

    def _forward_signals(self) -> None:
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gaudi_cluster.rank.agent",
        description=(__doc__ or "").splitlines()[0],
        allow_abbrev=False,
    )
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--control", help="HOST:PORT of the master's control channel")
    parser.add_argument("--job-root", required=True, type=Path, help="where this node keeps per-job state")
    parser.add_argument(
        "--heartbeat-timeout", required=True, type=float, help="seconds of silence before the master is lost"
    )
    parser.add_argument(
        "--connect-timeout",
        type=float,
        default=30.0,
        help="seconds to keep trying the master's control channel before giving up",
    )
    parser.add_argument(
        "--local-rank-arg", action="store_true", help="pass --local_rank=N to the program, as DeepSpeed does"
    )
    parser.add_argument("--output-dir", help="where the job writes (default: the program's --output_dir)")
    parser.add_argument(
        "--zygote-fd", type=int, help="this agent's socket to the node's zygote (launch/node passes it)"
    )
    parser.add_argument(
        "--output-relay",
        action="store_true",
        help="once seated, send the rank's output over the node relay instead of stdout (direct launcher)",
    )
    parser.add_argument(
        "--ready-fd", type=int, help="write one byte here once seated with --output-relay (launch/node)"
    )
    parser.add_argument("program", nargs=argparse.REMAINDER)
    return parser


def build(
    argv: Sequence[str],
    zygote_conn: socket.socket | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    in_node: bool = False,
) -> RankAgent:
    """The agent its command line describes (SystemExit with the usage line when it is wrong)."""
    given = parser()
    args = given.parse_args(argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        given.error("no program given after --")
    if zygote_conn is None and args.zygote_fd is not None:
        zygote_conn = socket.socket(fileno=args.zygote_fd)
    zygote = None
    if zygote_conn is not None:
        from gaudi_cluster.rank import zygote_client

        zygote = zygote_client.ZygoteLink(zygote_conn)
    return RankAgent(
        args.job_id,
        program,
        args.control,
        args.job_root,
        args.heartbeat_timeout,
        args.connect_timeout,
        local_rank_arg=args.local_rank_arg,
        output_dir=args.output_dir,
        zygote=zygote,
        output_to_relay=args.output_relay,
        ready_fd=args.ready_fd,
        env=env,
        cwd=cwd,
        in_node=in_node,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return build(sys.argv[1:] if argv is None else argv).run()


if __name__ == "__main__":
    sys.exit(main())

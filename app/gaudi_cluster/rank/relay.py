"""The node relay: this node's one control connection to the master, for all of its rank agents.

The first agent of a job on a node starts it (`relay_join`), unless the node process runs it already
(`relay_host`: a node process that lives as long as its ranks, launch/node); it authenticates to the master as
the node (role "node", the node's key from the private file), then listens on a Unix socket in the job's
directory (0700, and every peer's uid checked) for the node's agents. Each agent's lines come to the
relay; the master gets one `summary` every 1–2 s for the whole node (`protocol.beat_every`;
`relay_beats`: what the master's per-rank bookkeeping would work out, at a per-node cost), the ranks'
output lines as they come (the direct launcher's: no ssh session carries them), each rank's exit at
once, and `gone` for an agent that left without one. The master's stops and beats go to every agent, so
an agent keeps its own rules: it stops its rank when the master's beats stop or its link closes. The
relay ends once its last agent has left (or the master has: then every agent is cut off, which stops its
rank at once). After the master's stop it ends by reaping the node: whatever the job's pid files still
name is killed (at once when its agents have left, else once the stop's grace is over), and `reaped`
tells the master the node needs no `reap` over ssh or srun.

    python -m gaudi_cluster.rank.relay --job-id J --job-root R --control HOST:PORT --heartbeat-timeout S

At 1,000 nodes x 8 ranks this is what keeps the master at 1,000 connections and 1,000 messages a
second instead of 8,000 of each. The threads here (one per agent, 8 on a Gaudi server) are the
node's, never the master's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from gaudi_cluster.rank import jobdir, reap
from gaudi_cluster.rank.relay_beats import NodeBeats
from gaudi_cluster.wire import messages, protocol
from gaudi_cluster.wire.channel import Channel, Identity, Unsendable, connect_and_authenticate

PID_NAME = "relay.pid"
LINGER_S = 2.0  # after the last agent left: room for a late one before the relay ends
IDLE_POLL_S = 0.02
STARTER_POLL_S = 0.2
# At the end: how long the master may take to close its side after ours (a busy master reads late).
CLOSE_WAIT_S = 5.0
SAID = 3  # lines said of one kind of trouble from one peer: a stream of them is not a stream of logs


class _Link:
    """One agent's connection to the relay, and the rank it joined as (once the master seated it)."""

    def __init__(self, channel: Channel, pid: int | None = None) -> None:
        self.channel = channel
        self.pid = pid  # the agent's, as the kernel gave it (SO_PEERCRED)
        self.rank: int | None = None
        self.exited = False
        self.dropped = 0  # its lines dropped (the first SAID of them said)

    def who(self) -> str:
        return "not joined yet" if self.rank is None else f"rank {self.rank}"


class Relay:
    def __init__(self, job_id: str, job_dir: Path, control: str, heartbeat_timeout_s: float) -> None:
        self.job_id, self.job_dir, self.control = job_id, job_dir, control
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.host = socket.gethostname()
        self.master: Channel | None = None
        self.beats = NodeBeats()
        self.links: dict[int, _Link] = {}  # rank -> its agent's link, once joined
        self.joining: dict[int, _Link] = {}  # rank -> a link whose join the master has not answered
        self.lock = threading.Lock()
        self.last_master = time.monotonic()
        self.last_leave = time.monotonic()
        self.joined_any = False
        self.ignored = 0  # the master's lines dropped (no session MAC, or no message for a relay)
        self.dropped = 0  # the agents' lines dropped (each agent's first SAID said)
        self.unsent = 0  # messages no line to the master could carry (the first SAID said)
        self.done = threading.Event()
        self.ending = ""  # why the relay ends: the first reason given to end()
        self.listening = threading.Event()
        self.reap_by: float | None = None  # once the master said stop: when the relay reaps the rest
        # The reap after the stop: begun (once), and done with its word sent to the master. The
        # relay's end waits for the second: closing the master's link first would drop that word.
        self.reaping = False
        self.reaped = threading.Event()
        self.said_to: TextIO | None = None  # its lines' stream: stdout (the relay's log) unless set

    def say(self, text: str) -> None:
        say(text, self.said_to)

    # --- the master's side ----------------------------------------------------------------------

    def connect(self, timeout_s: float) -> None:
        private = jobdir.read_private(self.job_dir)
        if private is None or not private.token:
            raise ConnectionError(
                f"no secret for job {self.job_id} in {self.job_dir} (the master stages it before "
                "launching); fix: start ranks through gaudi-cluster"
            )
        me = Identity(
            private.token, private.node, self.job_id, self.host, protocol.NODE_RANK, os.getpid(), role="node"
        )
        self.node = private.node
        self.master = connect_and_authenticate(self.control, me, timeout_s)
        # The master beats at least four times within it: this much silence is a master lost (a
        # partition), and a send blocked this long (its window full) fails instead of hanging the relay.
        self.master.settimeout(self.heartbeat_timeout_s)

    def send_master(self, message: messages.Message) -> bool:
        """Whether it went; one no line carries is said and skipped, the session kept in order."""
        assert self.master is not None
        try:
            return self.master.send(message)
        except Unsendable as error:
            self.unsent += 1
            if self.unsent <= SAID:
                self.say(f"did not send the master {error}")
            return False

    def from_master(self) -> None:
        assert self.master is not None
        try:
            while (message := self.master.receive(messages.TO_RELAY)) is not None:
                try:
                    self._from_master(message)
                except Exception as error:  # no line may end the node's link to the master
                    self._ignore(f"handling it failed: {type(error).__name__}")
        except Exception as error:  # as if the master were gone: the agents must learn it
            self.master.close_reason = f"reading it failed: {type(error).__name__}"
        finally:
            self._master_lost(self.master.close_reason or "ended")

    def _master_lost(self, why: str) -> None:
        """The master's link ended (closed, silent past the heartbeat timeout, or a line no session
        takes: one over MAX_LINE cannot be authentic, and what followed it is unreadable): every
        agent is cut off (and stops its rank), then the relay ends. Said, unless the relay was
        ending anyway (its last agent left)."""
        links = self.all_links()
        if not self.done.is_set():
            self.say(f"the master's link ended ({why}): cutting off this node's {len(links)} agents")
        for link in links:
            link.channel.close()
        self.end(f"the master's link ended ({why})")

    def end(self, why: str) -> None:
        """Let the relay end (its tick loop returns); its last line gives the first reason."""
        if not self.done.is_set():
            self.ending = why
        self.done.set()

    def _ignore(self, why: str) -> None:
        # Only the master's sealed messages count: an injected stop (or beat) changes nothing.
        self.ignored += 1
        if self.ignored <= SAID:  # a stream of forgeries must not become a stream of lines
            self.say(f"ignored a control message ({why})")

    def _from_master(self, message: messages.Message | messages.Dropped) -> None:
        if isinstance(message, messages.Dropped):
            self._ignore(message.reason)
            return
        self.last_master = time.monotonic()
        if isinstance(message, messages.Seated | messages.Refused):
            with self.lock:
                link = self.joining.pop(message.rank, None) if message.rank is not None else None
                if link is not None and isinstance(message, messages.Seated):
                    self.links[message.rank] = link
            if link is not None:
                link.channel.send(message)
                if isinstance(message, messages.Refused):
                    link.channel.close()
        elif isinstance(message, messages.Stop | messages.Beat):
            if isinstance(message, messages.Stop):
                wait_s = (message.grace or 0.0) + protocol.RELAY_STOP_MARGIN_S
                with self.lock:
                    first = self.reap_by is None
                    if first:
                        self.reap_by = time.monotonic() + wait_s
                if first:
                    # At the deadline itself, not at the next second's tick: the master waits only
                    # a little longer than the margin for this node's word before it reaps it itself.
                    timer = threading.Timer(wait_s, self.reap_if_stopped, kwargs={"at_deadline": True})
                    timer.daemon = True
                    timer.start()
            self.to_agents(message)
            if isinstance(message, messages.Stop):  # its agents may all have left already (ranks that
                self.reap_if_stopped()  # failed on their own first): no leave is left to reap on
        elif isinstance(message, messages.Unstage):
            jobdir.remove_private(self.job_dir)

    def tick(self) -> None:
        """Once a second: the relay's end once its agents are gone; every beat_every seconds, the node's
        summary to the master."""
        every, second = protocol.beat_every(self.heartbeat_timeout_s), 0
        while not self.done.wait(protocol.BEAT_INTERVAL_S):
            second += 1
            try:
                self._tick(summary=second % every == 0)
            except Exception as error:  # one second's summary, never the relay (this is its main thread)
                self.say(f"the node's summary failed this second: {type(error).__name__}: {error}")

    def _tick(self, summary: bool = True) -> None:
        assert self.master is not None
        with self.lock:
            beats = self.beats.message(sorted(self.links), time.monotonic()) if summary else None
            idle = not self.links and not self.joining
        if beats is not None and not self.send_master(beats) and not self.master.closed:
            # Its hot lists alone always fit (numbers, MAX_RANKS_PER_NODE of each): the node's ranks
            # stay heard even when their steady fields and work times did not fit a line.
            self.send_master(replace(beats, steady=(), work=()))
        self.reap_if_stopped()
        if idle and self.joined_any and time.monotonic() - self.last_leave > LINGER_S:
            self.end("its last agent left")

    def reap_if_stopped(self, at_deadline: bool = False) -> None:
        """After the master's stop, once every agent has left (or at the stop's deadline): kill what
        the job's pid files on this node still name (a rank whose agent was killed, an agent that
        did not end), tell the master so, and end. Its `reap` over ssh or srun is then not needed."""
        with self.lock:
            links = [*self.links.values(), *self.joining.values()]
            late = at_deadline or (self.reap_by is not None and time.monotonic() >= self.reap_by)
            due = self.reap_by is not None and (not links or late)
            if not due or self.reaping:
                return
            self.reaping = True
        try:
            killed = reap.reap_dir(self.job_dir, keep={PID_NAME})
            agents = {link.pid for link in links if link.pid and link.pid != os.getpid()}  # none here
            for pid in agents:  # an agent that did not end (no pid file yet)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            # Logged before the master hears it: on the master's own node the supervisor kills this
            # process (the launcher's group) as soon as every relay's word is in.
            self.say(f"the node reaped after the master's stop ({len(killed)} killed)")
            if self.master is not None and not self.master.closed:
                self.send_master(messages.Reaped(len(killed)))
        finally:  # a reap that failed must not hold the relay's end
            self.reaped.set()
        self.end("the node reaped after the master's stop")

    def _say_left_clean(self) -> None:
        """Ending on its own, before any stop (every agent exited: a rank that failed first, a node
        process that waited for its agents): where no pid file but the relay's is left, the node
        needs no reap either, so the master is told as after a reap. An agent killed leaves its
        file (its rank may live on): that node is left to the master's reap."""
        assert self.master is not None
        with self.lock:
            if self.reaping or self.links or self.joining or self.master.closed:
                return
        if any(path.name != PID_NAME for path in self.job_dir.glob("*.pid")):
            return
        self.send_master(messages.Reaped(0))

    # --- the agents' side -----------------------------------------------------------------------

    def all_links(self) -> list[_Link]:
        with self.lock:
            return [*self.links.values(), *self.joining.values()]

    def to_agents(self, message: messages.Stop | messages.Beat) -> None:
        """A stop or a beat from the master, to every seated agent (one still joining waits for its seat)."""
        with self.lock:
            seated = list(self.links.values())
        for link in seated:
            link.channel.send(message)

    def serve_agent(self, channel: Channel, pid: int | None = None) -> None:
        link = _Link(channel, pid)
        try:
            self._serve(link)
        except Exception as error:  # one agent's trouble ends its link, never the relay
            channel.close_reason = f"serving it failed: {type(error).__name__}"
        finally:
            self._leave(link)

    def _drop(self, link: _Link, why: str) -> None:
        with self.lock:
            self.dropped += 1
        link.dropped += 1
        # Counted per agent: one agent's flood never hides another's line. Its lines are this
        # user's own, but a stream of them is not a stream of logs.
        if link.dropped <= SAID:
            self.say(f"dropped a line from an agent ({link.who()}: {why})")

    def _serve(self, link: _Link) -> None:
        while (message := link.channel.receive(messages.FROM_AGENT)) is not None:
            if isinstance(message, messages.Dropped):
                self._drop(link, message.reason)
            elif isinstance(message, messages.Join):
                if link.rank is not None:
                    self._drop(link, "a second join on its link")
                    continue
                link.rank = message.rank
                with self.lock:
                    self.joining[message.rank] = link
                    self.joined_any = True
                self.send_master(replace(message, node=self.node))
            elif link.rank is None:
                self._drop(link, f"a {message.TYPE.value} before the join")
            elif isinstance(message, messages.Beat):
                with self.lock:
                    self.beats.record(link.rank, message)
            elif isinstance(message, messages.Output):
                self.send_master(replace(message, rank=link.rank))
            elif isinstance(message, messages.Exit):
                link.exited = True
                with self.lock:  # its work times not yet sent go first: the report has every step
                    last = self.beats.message([link.rank], time.monotonic(), flush=True)
                if last.work:
                    self.send_master(last)
                # Its code must arrive whatever its last lines were: they are cut to fit one line.
                exit_ = replace(message, rank=link.rank)
                self.send_master(messages.fitted_exit(exit_, protocol.MAX_SEALED_BODY))

    def _leave(self, link: _Link) -> None:
        # The relay's own doing (a refusal, the master gone) or the agent's plain end need no word;
        # a link cut for what its agent sent (a line over MAX_LINE) does.
        why = link.channel.close_reason
        cut = why not in ("", "closed by the peer", "broken")
        if cut:
            agent = "an agent not joined yet" if link.rank is None else f"rank {link.rank}'s agent"
            self.say(f"closed the link of {agent}: {why}")
        link.channel.close()
        with self.lock:
            seated = link.rank is not None and self.links.get(link.rank) is link
            if seated:
                del self.links[link.rank]  # type: ignore[arg-type]
                self.beats.forget(link.rank)  # type: ignore[arg-type]
            elif link.rank is not None and self.joining.get(link.rank) is link:
                del self.joining[link.rank]
            self.last_leave = time.monotonic()
        if seated and not link.exited and not self.done.is_set():
            reason = "its agent left the node relay without an exit" + (f" ({why})" if cut else "")
            self.send_master(messages.Gone(link.rank, reason))  # type: ignore[arg-type]
        self.reap_if_stopped()

    def accept(self, listener: socket.socket) -> None:
        while not self.done.is_set():
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            pid = _same_user_pid(sock)
            if pid is None:
                sock.close()
                continue
            threading.Thread(target=self.serve_agent, args=(Channel(sock), pid), daemon=True).start()

    # --- main -----------------------------------------------------------------------------------

    def run(self, connect_timeout_s: float, starter: int | None = None) -> int:
        """The relay as a process of its own (an agent started it): until the end of the node's job."""
        # Until it listens, nobody but the agent that started it needs it: a job that ended before
        # the master admitted this node must not leave it retrying a master that is gone. The agent
        # names itself (starter): read here, after the imports, our parent may already be init.
        threading.Thread(target=self._follow_starter, args=(starter or os.getppid(),), daemon=True).start()
        try:
            self.connect(connect_timeout_s)
        except ConnectionError as error:
            self.say(f"error: {error}")
            return 1
        # From here a stop signal for the whole step or container (scancel, docker stop, Ctrl-C)
        # also reaches the agents, which give their ranks the grace to save: the relay must still
        # carry their exits, and it ends by itself once they have left.
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        self.serve(pid_file=True)
        return 0

    def serve(self, pid_file: bool, listening: Callable[[], None] | None = None) -> None:
        """Listen for the node's agents (`listening` is called then) and relay until the end. The pid
        file names this process for `gaudi-cluster reap`: a node process running the relay writes
        none (its agents' own files name what a reap must end)."""
        listener = listen(self.job_dir)
        self.listening.set()
        if pid_file:
            (self.job_dir / PID_NAME).write_text(f"{os.getpgrp()} {os.getpid()}\n")
        if listening is not None:
            listening()
        reader = threading.Thread(target=self.from_master, daemon=True)
        reader.start()
        threading.Thread(target=self.accept, args=(listener,), daemon=True).start()
        try:
            self.tick()
        finally:
            with contextlib.suppress(OSError):
                listener.close()
                os.unlink(self.job_dir / jobdir.RELAY_SOCKET)
            if pid_file:
                with contextlib.suppress(OSError):
                    (self.job_dir / PID_NAME).unlink()
            if self.master is not None:
                if self.reaping:  # ended meanwhile (its node process, the master's link): word first
                    self.reaped.wait(CLOSE_WAIT_S)
                self._say_left_clean()
                self._close_master(reader)
            self._say_end()

    def _close_master(self, reader: threading.Thread) -> None:
        """Close the master's link once the master has read it all. Closing a TCP socket with bytes
        unread (a beat or an unstage the master just sent) resets the connection, and a reset throws
        away what this side had not yet delivered: the last ranks' exits. So the relay's FIN goes
        after its last lines, the master closes on reading it, and that ends the relay's reader."""
        assert self.master is not None
        self.master.shut_sending()
        reader.join(CLOSE_WAIT_S)
        self.master.close()

    def _say_end(self) -> None:
        """Its last line: why it ended, and anything a rank's exit may have missed on the way."""
        link = (self.master.close_reason or "closed here") if self.master is not None else "never made"
        unsent = f", {self.unsent} messages no line carried" if self.unsent else ""
        self.say(f"ended: {self.ending or 'no reason given'} (the master's link: {link}{unsent})")

    def end_once_idle(self, timeout_s: float) -> None:
        """Every agent of the node has exited (the node process running the relay waited for them):
        end as soon as their links are gone, and after a stop once the node is reaped, without
        lingering for a late agent."""
        deadline = time.monotonic() + timeout_s
        while not self.done.is_set() and time.monotonic() < deadline:
            with self.lock:
                if not self.links and not self.joining and (self.reap_by is None or self.reaped.is_set()):
                    break
            time.sleep(IDLE_POLL_S)
        else:
            if not self.done.is_set():
                self.end(f"its node process ended it with {len(self.all_links())} agents still linked")
            return
        self.end("its node process's agents have all exited")

    def _follow_starter(self, starter: int) -> None:
        while not self.listening.wait(STARTER_POLL_S):
            if os.getppid() != starter:
                self.say("the agent that started this relay left before the master admitted the node; ending")
                os._exit(1)


def say(text: str, to: TextIO | None = None) -> None:
    print(f"gaudi-cluster[relay]: {text}", file=to or sys.stdout, flush=True)


def listen(job_dir: Path) -> socket.socket:
    """The agents' socket, replacing a dead relay's: only this user may connect (0700 directory)."""
    path = jobdir.relay_socket_path(job_dir)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(64)
    return listener


def _same_user_pid(sock: socket.socket) -> int | None:
    """SO_PEERCRED: the peer's pid when it runs as this relay's user (on top of the directory's 0700),
    else None."""
    try:
        pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except OSError:
        return None
    return pid if uid == os.getuid() else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gaudi_cluster.rank.relay", allow_abbrev=False)
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--job-root", required=True, type=Path)
    parser.add_argument("--control", required=True, help="HOST:PORT of the master's control channel")
    parser.add_argument(
        "--heartbeat-timeout", required=True, type=float, help="silence that loses the master"
    )
    parser.add_argument("--connect-timeout", type=float, default=30.0)
    parser.add_argument("--starter-pid", type=int, help="the agent that started it (relay_join)")
    args = parser.parse_args(argv)
    job_dir = jobdir.create(args.job_root, args.job_id)
    relay = Relay(args.job_id, job_dir, args.control, args.heartbeat_timeout)
    return relay.run(args.connect_timeout, args.starter_pid)


if __name__ == "__main__":
    sys.exit(main())

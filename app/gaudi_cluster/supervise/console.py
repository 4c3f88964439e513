"""Master: where the ranks' lines go (the launcher's output, or a node relay's `output` messages):
every rank line into its rank's file, some onto the console.

The console shows one line per event: rank 0's lines (every rank's with --tee), the launcher's own
lines, and the master's. The ranks of a data-parallel job print the same thing N times, so the others'
lines stay in `<job dir>/ranks/rank-<N>.log` on the master, always, whatever the console shows. A
progress bar printed off a terminal (tqdm on a pipe: one line per redraw) is folded into the live
status line instead, and a blank rank line is kept out of the console.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from gaudi_cluster.env.envfile import mask_secrets

log = logging.getLogger("gaudi_cluster.supervise.console")

RANKS_DIR = "ranks"
# pdsh prefixes remote lines with "host: "; rank agents' lines already name host and rank.
_PDSH_LINE = re.compile(r"^(?P<host>[^\s:]+): (?P<rest>.*)$")
_RANK_LINE = re.compile(r"^\[(?P<host>[\w.-]+) rank (?P<rank>\d+)\] (?P<text>.*)$", re.DOTALL)
# tqdm's default bar: "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [...]"
_PROGRESS = re.compile(r"^(?:(?P<desc>.*?):\s*)?(?P<percent>\d{1,3})%\|[^|]*\|\s*(?P<count>\S+/\S+)")
MAX_OPEN_LOGS = 64  # 1,000 nodes x 8 ranks would exhaust the descriptor limit


@dataclass(frozen=True)
class RankLine:
    host: str
    rank: int
    text: str


def rank_line(line: str) -> RankLine | None:
    """A rank agent's `[host rank N] text` line, as it arrives directly or through pdsh."""
    match = _RANK_LINE.match(line)
    if match is None:
        remote = _PDSH_LINE.match(line)
        match = _RANK_LINE.match(remote["rest"]) if remote else None
    if match is None:
        return None
    return RankLine(match["host"], int(match["rank"]), match["text"])


def progress_text(text: str) -> str | None:
    """`Writing model shards 100% 1/1` for a tqdm bar's line; None for any other line."""
    match = _PROGRESS.match(text.strip())
    if match is None:
        return None
    desc = (match["desc"] or "").strip()
    return f"{desc + ' ' if desc else ''}{match['percent']}% {match['count']}"


class RankLogs:
    """Every rank's lines in `<directory>/rank-<N>.log`, appended as they come.

    At most max_open files are open at once, the least recently written closed first, so a job of
    thousands of ranks needs no more descriptors than a small one."""

    def __init__(self, directory: Path, max_open: int = MAX_OPEN_LOGS) -> None:
        self.directory = directory
        self.max_open = max_open
        self._open: collections.OrderedDict[int, IO[str]] = collections.OrderedDict()
        self._failed = False

    def path(self, rank: int) -> Path:
        return self.directory / f"rank-{rank}.log"

    def write(self, rank: int, text: str) -> None:
        if self._failed:
            return
        try:
            handle = self._open.pop(rank, None) or self._opened(rank)
            self._open[rank] = handle
            handle.write(text + "\n")
        except OSError as error:
            self._failed = True  # one warning, not one per line
            log.warning("cannot write the ranks' log files in %s: %s", self.directory, error)

    def _opened(self, rank: int) -> IO[str]:
        if len(self._open) >= self.max_open:
            _, oldest = self._open.popitem(last=False)
            oldest.close()
        self.directory.mkdir(mode=0o700, exist_ok=True)
        return self.path(rank).open("a", encoding="utf-8", errors="replace")

    def flush(self) -> None:
        for handle in self._open.values():
            with contextlib.suppress(OSError):
                handle.flush()

    def close(self) -> None:
        while self._open:
            with contextlib.suppress(OSError):
                self._open.popitem()[1].close()


class RankOutput:
    """Routes each line of the launcher's output and each line a relay carried (from the two threads
    that read them: one at a time)."""

    def __init__(
        self,
        show: Callable[[str], None],
        progress: Callable[[str], None],
        logs: RankLogs | None,
        tee: bool = False,
        tail: collections.deque[str] | None = None,
    ) -> None:
        self.show = show
        self.progress = progress
        self.logs = logs
        self.tee = tee
        self.quiet = False  # set once the attempt is over: the files still get every line
        # The launcher's own last lines, for the failure report when it ends on its own.
        self.tail: collections.deque[str] = tail if tail is not None else collections.deque(maxlen=30)
        self._lock = threading.Lock()

    def route(self, line: str) -> None:
        parsed = rank_line(line)
        with self._lock:
            if parsed is not None:
                self._rank_line(parsed.host, parsed.rank, parsed.text)
                return
            self.tail.append(line)
            if self.quiet:
                return
            remote = _PDSH_LINE.match(line)
            shown = mask_secrets(line)  # DeepSpeed's runner logs its pdsh command, values included
            self.show(f"[{remote['host']}] {remote['rest']}" if remote else f"[launcher] {shown}")

    def route_rank(self, host: str, rank: int, lines: Iterable[str]) -> None:
        """A rank's lines as its node's relay carried them (no prefix to parse)."""
        with self._lock:
            for text in lines:
                self._rank_line(host, rank, text)

    def flush(self) -> None:
        if self.logs is not None:
            with self._lock:
                self.logs.flush()

    def _rank_line(self, host: str, rank: int, text: str) -> None:
        if self.logs is not None:
            self.logs.write(rank, text)
        bar = progress_text(text)
        if bar is not None:
            self.progress(f"rank {rank}: {bar}")
        elif text.strip() and (self.tee or rank == 0) and not self.quiet:
            self.show(f"[{host} rank {rank}] {text}")

"""Rank (the agent's process): the rank's lines written to the launch session's stdout, a pipe the
node's other agents write to as well. A write of at most PIPE_BUF bytes to a pipe is atomic; a larger
one may be split, another agent's line then landing inside one of ours and both lost to the master's
parser. So lines go out packed in whole-line writes of at most PIPE_BUF bytes.
"""

from __future__ import annotations

import os
import select
from collections.abc import Iterable, Iterator
from typing import BinaryIO


def atomic_writes(lines: Iterable[bytes], limit: int = select.PIPE_BUF) -> Iterator[bytes]:
    """Whole lines (each with its newline) packed in order into chunks of at most `limit` bytes; a line
    longer than that is a chunk of its own (no write can keep it whole)."""
    chunk = b""
    for line in lines:
        if chunk and len(chunk) + len(line) > limit:
            yield chunk
            chunk = b""
        chunk += line
    if chunk:
        yield chunk


def write_lines(stream: BinaryIO, lines: Iterable[bytes]) -> None:
    """Each chunk in one write on the stream's descriptor where it has one (the rest of a partial
    write follows it); what the stream buffered goes first. One without a descriptor (a test's
    capture) just gets the chunks."""
    stream.flush()
    try:
        fd: int | None = stream.fileno()
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        fd = None
    for chunk in atomic_writes(lines):
        if fd is None:
            stream.write(chunk)
            continue
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view) :]
    if fd is None:
        stream.flush()

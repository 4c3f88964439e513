"""A rank's lines on the launch session's pipe, shared with the node's other agents: whole lines in
writes of at most PIPE_BUF bytes (atomic on a pipe), so that no other agent's line lands inside ours."""

from __future__ import annotations

import io
import os
import select
import threading

from gaudi_cluster.rank import shared_pipe
from gaudi_cluster.rank.shared_pipe import atomic_writes

from tests.unit.test_exit_threads import FLOOD, SlowConsole
from tests.unit.test_supervise import supervise


def test_lines_are_packed_whole_in_order_and_within_the_limit():
    lines = [f"[host rank 0] {i:04d} ".encode() + b"x" * 200 + b"\n" for i in range(1000)]
    chunks = list(atomic_writes(lines))
    assert b"".join(chunks) == b"".join(lines)
    assert all(len(chunk) <= select.PIPE_BUF for chunk in chunks)
    assert all(chunk.endswith(b"\n") for chunk in chunks)
    assert len(chunks) < len(lines) / 10  # packed, not a write a line


def test_a_line_longer_than_the_limit_is_a_chunk_of_its_own():
    long = b"y" * (select.PIPE_BUF + 10) + b"\n"
    assert list(atomic_writes([b"a\n", long, b"b\n"])) == [b"a\n", long, b"b\n"]


def test_every_write_to_the_descriptor_is_one_chunk(monkeypatch):
    sizes: list[int] = []
    real_write = os.write

    def recording_write(fd: int, data: bytes | memoryview) -> int:
        sizes.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(shared_pipe.os, "write", recording_write)
    read_end, write_end = os.pipe()
    lines = [b"z" * 204 + b"\n"] * 300  # 61 KB: the old single write was split by the kernel at will
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(read_all(read_end)))
    reader.start()
    with os.fdopen(write_end, "wb") as stream:
        shared_pipe.write_lines(stream, lines)
    reader.join(timeout=10)
    assert received == [b"".join(lines)]
    assert sizes and max(sizes) <= select.PIPE_BUF


def test_a_stream_without_a_descriptor_gets_the_lines():
    stream = io.BytesIO()
    shared_pipe.write_lines(stream, [b"a\n", b"b\n"])
    assert stream.getvalue() == b"a\nb\n"


def read_all(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as source:
        return source.read()


def test_two_agents_on_one_launch_pipe_never_break_each_others_lines(tmp_path, monkeypatch):
    """The real agents under the master's supervisor (the deepspeed launcher's shape: every agent of a
    node writes to one session's pipe), the master's console slow so that the pipe stays full: rank 1's
    lines, written while rank 0 floods, reach rank 1's file whole, and rank 0's stay whole too.
    Before, an agent wrote up to 64 KB at once and the kernel split it around rank 1's line: rank 1's
    file was missing in 4 of 5 runs and rank 0's held broken lines. How many of rank 1's lines get
    through depends on the host's pace: an agent still writing 5 s after its rank ended drops the rest
    of the launch pipe's share (its own log on the node keeps them, rank/agent.py)."""
    monkeypatch.setattr("tests.unit.test_supervise.io.StringIO", SlowConsole)
    ticks = "; ".join(["sleep 0.2; echo done"] * 5)
    outcome, _out, _, _ = supervise(tmp_path, [FLOOD, ticks])
    assert outcome.exit_code == 0
    ticked = (tmp_path / "ranks" / "rank-1.log").read_text()
    assert ticked and ticked in ["done\n" * n for n in range(1, 6)], ticked[:300]
    flood = (tmp_path / "ranks" / "rank-0.log").read_text().splitlines()
    broken = [line for line in flood if line != "x" * 200]
    assert flood and not broken, broken[:3]

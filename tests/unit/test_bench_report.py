"""The bench's markdown table: one table row per figure, whatever its note carries."""

from __future__ import annotations

from bench.common import Row, stat
from bench.report import markdown


def test_a_note_with_a_failed_runs_log_tail_stays_on_its_rows_line():
    note = "kill/raw: no first step:\n[INFO] runner | workers: a,b\n[INFO] run"
    row = Row("failure.kill_named_s", "Worker kill → failure named", "s", stat([0.3]), note=note)
    meta = {"date": "2026-12-06", "machine": "2 cores", "duration_s": 1.0}
    table = markdown([row], meta).splitlines()
    rows = [line for line in table if line.startswith("| Worker kill")]
    assert len(rows) == 1
    assert "no first step: [INFO] runner / workers: a,b [INFO] run" in rows[0]
    assert rows[0].count(" | ") == 7  # eight cells: the note added none

"""Why a rank failed, in words: its final exception line, and a hint with the fix for well-known causes.

Pure: it reads the last lines a rank printed (its agent keeps them) and how it ended.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# `OSError: [Errno 28] ...`, `torch.distributed.DistBackendError: ...`, `KeyboardInterrupt`
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure)(?::\s.*)?$")


@dataclass(frozen=True)
class Hint:
    cause: str
    fix: str


_HINTS: tuple[tuple[re.Pattern[str], Hint], ...] = (
    (
        re.compile(r"No space left on device|Errno 28|ENOSPC"),
        Hint("the disk holding this rank's output is full", "free space there or point --output_dir at a "
             "larger volume (gaudi-cluster doctor shows every node's free space)"),
    ),
    (
        re.compile(r"out of memory|OutOfMemoryError|Cannot allocate memory|MemoryError", re.IGNORECASE),
        Hint("the rank ran out of memory", "lower --per_device_train_batch_size or use a ZeRO stage that "
             "shards more (ds_zero2/ds_zero3)"),
    ),
    (
        re.compile(r"Connection refused|connect\(\) timed out", re.IGNORECASE),
        Hint("the rank could not reach the rendezvous (MASTER_ADDR:MASTER_PORT)", "check --master-addr and "
             "--master-port, and that nothing blocks that port between the nodes"),
    ),
    (
        re.compile(r"(timed out|timeout).*(gloo|hccl|nccl|collective|all_?reduce|barrier)|"
                   r"(gloo|hccl|nccl|collective).*(timed out|timeout)", re.IGNORECASE),
        Hint("a collective timed out: a peer stopped or fell far behind", "look for the first failing rank "
             "above; raise DEEPSPEED_TIMEOUT (minutes) only if the job is merely slow"),
    ),
)  # fmt: skip

OOM_KILL = Hint(
    "killed by SIGKILL with no error of its own: most likely the kernel's out-of-memory killer",
    "check `dmesg` on that node, then lower the batch size or shard more (ZeRO)",
)


def final_exception(tail: Sequence[str]) -> str | None:
    """The last exception line a rank printed (the end of its traceback), if any."""
    for line in reversed(tail):
        text = line.strip()
        if _EXCEPTION.match(text):
            return text[:300]
    return None


def hint_for(tail: Sequence[str], killed_by: str | None = None) -> Hint | None:
    """A known cause in the rank's last lines, or an OOM kill; None when nothing is recognised."""
    text = "\n".join(tail[-30:])
    for pattern, hint in _HINTS:
        if any(pattern.search(line) for line in text.splitlines()):
            return hint
    if killed_by == "SIGKILL" and final_exception(tail) is None:
        return OOM_KILL
    return None


def explain(tail: Sequence[str], killed_by: str | None = None) -> str:
    """`: <exception line> (likely cause: ...; fix: ...)`, or '' when there is nothing to add."""
    parts = []
    exception = final_exception(tail)
    if exception:
        parts.append(f": {exception}")
    hint = hint_for(tail, killed_by)
    if hint:
        parts.append(f" (likely cause: {hint.cause}; fix: {hint.fix})")
    return "".join(parts)

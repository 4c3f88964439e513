"""Failure reports say why: the rank's own exception line and a hint for well-known causes."""

from __future__ import annotations

import pytest
from gaudi_cluster.supervise.outcome import RankFailure
from gaudi_cluster.view.diagnosis import explain, final_exception, hint_for

ENOSPC = [
    "Traceback (most recent call last):",
    '  File "/opt/venv/lib/python3.11/site-packages/torch/serialization.py", line 834, in __exit__',
    "    self.file_like.write_end_of_file()",
    "RuntimeError: [enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0",
    "During handling of the above exception, another exception occurred:",
    "OSError: [Errno 28] No space left on device",
]


def test_the_summary_carries_the_final_exception_and_the_fix():
    line = RankFailure.exited("worker-2", 2, 1, ENOSPC).summary("j1")
    assert line.startswith(
        "job j1 failed: host worker-2 rank 2 exited with code 1: OSError: [Errno 28] No space left"
    )
    assert "likely cause: the disk holding this rank's output is full; fix: free space" in line
    assert "\n" not in line


def test_a_rank_killed_by_sigkill_gets_the_oom_hint_and_one_that_exited_does_not():
    assert "out-of-memory killer" in RankFailure.signalled("w", 0, 9, 137, ["step 3"]).summary("j1")
    assert "likely cause" not in RankFailure.exited("w", 0, 137, ["step 3"]).summary("j1")


@pytest.mark.parametrize(
    ("tail", "killed_by", "cause"),
    [
        (["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"], None, "out of memory"),
        (["step 12", "loss 3.1"], "SIGKILL", "out-of-memory killer"),
        (
            ["torch.distributed.DistNetworkError: Connection refused (c10d TCPStore 10.0.0.1:29500)"],
            None,
            "rendezvous",
        ),
        (
            ["RuntimeError: [../gloo/transport/tcp/pair.cc:598] Timed out waiting 300000ms for recv"],
            None,
            "collective",
        ),
        (["RuntimeError: HCCL collective all_reduce timed out after 1800 s"], None, "collective"),
    ],
)
def test_well_known_causes_get_a_hint(tail, killed_by, cause):
    hint = hint_for(tail, killed_by)
    assert hint is not None and cause in hint.cause and hint.fix


def test_nothing_made_up_for_an_unknown_failure():
    assert final_exception(["ValueError: bad --lr"]) == "ValueError: bad --lr"
    assert hint_for(["ValueError: bad --lr"]) is None
    assert explain(["just some output"]) == ""
    assert hint_for(["KeyboardInterrupt"], "SIGKILL") is None  # it said why itself

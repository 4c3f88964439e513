"""The fabric check's plan and verdicts that need no torch: the ring's rounds, a failed call's kind, a pair
merged from its two sides' answers, and whether the pairs so far already name a node (the rounds left
would tell no more). Pure; train/fabric_check.py runs them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def ring_rounds(world: int) -> list[list[tuple[int, int]]]:
    """The ring's neighbour pairs (i, i+1 mod n) in rounds where no rank is in two pairs."""
    pairs = [(i, (i + 1) % world) for i in range(world)] if world > 2 else [(0, 1)] if world == 2 else []
    rounds: list[list[tuple[int, int]]] = []
    for pair in pairs:
        for r in rounds:
            if not any(set(pair) & set(other) for other in r):
                r.append(pair)
                break
        else:
            rounds.append([pair])
    return rounds


def kind_of(error: BaseException) -> str:
    """timeout (no answer by the deadline) | closed (the peer went away) | error (anything else)."""
    text = f"{type(error).__name__} {error}".lower()
    if isinstance(error, TimeoutError) or "timed out" in text or "timeout" in text:
        return "timeout"
    if any(word in text for word in ("closed", "reset by peer", "broken pipe", "refused", "end of file")):
        return "closed"
    return "error"


def merge_sides(pair: Sequence[int], sides: Mapping[int, dict[str, Any] | None], timeout: float) -> dict:
    """One pair's result from what each of its ranks posted (None: nothing by the deadline)."""
    kinds = {r: (side or {"kind": "silent"})["kind"] for r, side in sides.items()}
    result: dict[str, Any] = {"ranks": list(pair), "sides": {str(r): k for r, k in kinds.items()}}
    late = [r for r, side in sides.items() if side and side.get("late")]
    if late:  # still held by an earlier test when this one opened: its failure here is that one's
        result["late"] = late
    if all(k == "ok" for k in kinds.values()):
        posted = [side for side in sides.values() if side]
        return {**result, "bytes": posted[0]["bytes"], "seconds": max(s["seconds"] for s in posted)}
    order = ("silent", "closed", "timeout", "error")
    result["kind"] = min((k for k in kinds.values() if k != "ok"), key=order.index)
    errors = [side["error"] for side in sides.values() if side and side.get("error")]
    result["error"] = errors[0] if errors else f"no answer within {timeout:g} s"
    tails = [line for side in sides.values() if side for line in side.get("log_tail", [])]
    return {**result, "log_tail": tails} if tails else result


def settled(
    results: Sequence[Mapping[str, Any]],
    rounds: Sequence[Sequence[tuple[int, int]]],
    hosts: Mapping[int, str],
) -> bool:
    """Whether the pairs so far already name a node: every failed link (ranks on two hosts, neither late)
    has a host whose every link in the whole schedule was tested and failed. Later rounds tell no more."""
    links = [(hosts.get(a), hosts.get(b)) for r in rounds for a, b in r if hosts.get(a) != hosts.get(b)]
    failed = [
        (hosts.get(p["ranks"][0]), hosts.get(p["ranks"][1]))
        for p in results
        if "error" in p and not p.get("late") and hosts.get(p["ranks"][0]) != hosts.get(p["ranks"][1])
    ]
    if not failed:
        return False
    tested = {(hosts.get(p["ranks"][0]), hosts.get(p["ranks"][1])) for p in results}

    def named(host: str | None) -> bool:
        mine = [link for link in links if host in link]
        return all(link in tested for link in mine) and sum(host in link for link in failed) == len(mine)

    return all(any(named(h) for h in link) for link in failed)

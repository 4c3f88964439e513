"""The fabric check's rank program: ring-neighbour pair all-reduces, then all-reduces of the whole world
at a few sizes, with the job's backend; rank 0 prints one `GC_FABRIC {json}` line with every figure.

Every test has one deadline, so a dead link costs one time limit, never a hang: the ranks meet on a
TCPStore of their own (rank 0 sees who never checked in); rank 0 opens each ring round and the world test
on the store, each rank gives its test `--timeout` seconds from then (every wait inside it shares that
deadline) and posts its own side; what rank 0 has not heard of by the deadline and a grace is silent. Once
the pairs so far name a node, the rounds left are not run (they cannot tell more). A watchdog ends a rank
stuck past every limit. Started by `gaudi-cluster doctor --fabric-check` / `master --fabric-check` through the
job's launcher.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from train import node_facts
from train.fabric_rounds import kind_of, merge_sides, ring_rounds, settled

MARK = "GC_FABRIC "
GRACE_S = 2.0  # past a test's deadline rank 0 still takes the answers of ranks that met it
_ABANDONED: list[Any] = []  # groups left mid-transfer at a deadline: destroying one waits its transfer out


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fabric_check")
    p.add_argument("--sizes", default="4096,1048576,8388608", help="message sizes in bytes, comma-separated")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds each test may take")
    p.add_argument("--backend", default="auto", help="gloo | hccl | nccl | auto (from the device)")
    p.add_argument("--pair-size", type=int, default=8388608, help="bytes of each pair test")
    p.add_argument(
        "--gaudinet",
        default=os.environ.get("GAUDINET_PATH", ""),
        help="where L3 scale-out's gaudinet.json must be (HPU; default $GAUDINET_PATH, as HCCL reads it)",
    )
    p.add_argument("--output_dir", help="where the launch's report goes (nothing of ours is written)")
    return p.parse_args(argv)


def _device_and_backend(choice: str) -> tuple[Any, str]:
    import torch

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if choice in ("hccl", "auto"):
        try:
            import habana_frameworks.torch.distributed.hccl  # noqa: F401  (registers the hccl backend)

            return torch.device("hpu"), "hccl"
        except ImportError:
            if choice == "hccl":
                raise
    if choice in ("nccl", "auto") and torch.cuda.is_available():
        torch.cuda.set_device(local)
        return torch.device("cuda", local), "nccl"
    return torch.device("cpu"), "gloo"


def _timed(run: Callable[[], None], iters: int, median: bool = False) -> float:
    """Seconds per call: the mean (nccl-tests' figure), or with `median` the middle call, which a
    busy CPU's scheduling hiccup cannot move (the pairs, compared with each other, use it)."""
    run()  # warm-up: connections and buffers, not the link, would dominate the first one
    times = []
    started = time.perf_counter()
    for _ in range(iters):
        run()
        if median:
            times.append(time.perf_counter() - started)
            started = time.perf_counter()
    return statistics.median(times) if median else (time.perf_counter() - started) / iters


def _runner(op: Callable[[], Any], sync: Callable[[], None], deadline: float) -> Callable[[], None]:
    """One all-reduce that gives up at the test's deadline (the group is left, not destroyed)."""

    def run() -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the test's deadline passed")
        work = op()
        if work is not None and not work.wait(timedelta(seconds=left)):
            raise TimeoutError("the test's deadline passed")
        sync()

    return run


def _left(deadline: float) -> timedelta:
    return timedelta(seconds=max(deadline - time.monotonic(), 0.1))


def _collect(store: Any, keys: Sequence[str], until: float) -> dict[str, Any]:
    """Each key's JSON value among those posted by `until` (monotonic seconds)."""
    found: dict[str, Any] = {}
    while True:
        for key in keys:
            if key not in found and store.check([key]):
                found[key] = json.loads(store.get(key))
        if len(found) == len(keys) or time.monotonic() >= until:
            return found
        time.sleep(0.05)


def _opened(store: Any, key: str, value: str | None, wait_s: float) -> bool:
    """Rank 0 opens (value "go") or ends ("stop") a test; the others wait for its word."""
    if value is not None:
        store.set(key, value)
        return value == "go"
    store.set_timeout(timedelta(seconds=wait_s))
    store.wait([key])
    return store.get(key) == b"go"


def _within(deadline: float, test: Callable[[], Any], late: Any) -> Any:
    """`test`'s answer, or `late` if it has none by the deadline (its thread is left running)."""
    answer: list[Any] = []
    thread = threading.Thread(target=lambda: answer.append(test()), daemon=True)
    thread.start()
    thread.join(max(deadline - time.monotonic(), 0.0) + 0.5)
    return answer[0] if answer else late


def _note(what: str) -> None:
    """A line in this rank's log with the wall clock: where a slow check spent its time."""
    print(f"fabric check: {what} at {time.time():.2f}", flush=True)


def _error(error: BaseException, backend: str) -> dict[str, Any]:
    text = str(error).splitlines()[0][:300] if str(error) else type(error).__name__
    side: dict[str, Any] = {"kind": kind_of(error), "error": text}
    tail = node_facts.hccl_log_tail() if backend == "hccl" or "HABANA_LOGS" in os.environ else []
    return {**side, "log_tail": tail} if tail else side


def main(argv: list[str] | None = None) -> int:
    args = _parse(list(sys.argv[1:] if argv is None else argv))
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    limit_s = args.timeout
    limit = timedelta(seconds=limit_s)
    rounds = ring_rounds(world)
    # Past every test (rendezvous, each ring round, the world) and their graces this rank is stuck: end it.
    budget = (limit_s + GRACE_S) * (len(rounds) + 3) + 10
    watchdog = threading.Timer(budget, lambda: os._exit(4))
    watchdog.daemon = True
    watchdog.start()
    device, backend = _device_and_backend(args.backend)
    _note("started")
    report: dict[str, Any] = {"world": world, "backend": backend, "timeout_s": limit_s, "hosts": {}}
    store = dist.TCPStore(addr, port, world, rank == 0, timeout=limit, wait_for_workers=False)
    store.set(f"hello/{rank}", socket.gethostname())
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:  # one node's facts, from its first rank
        with contextlib.suppress(Exception):
            store.set(f"facts/{rank}", json.dumps(node_facts.facts(args.gaudinet)))
    hosts: dict[int, str] = {}
    if rank == 0:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline and not store.check([f"hello/{r}" for r in range(world)]):
            time.sleep(0.1)
        hosts = {r: store.get(f"hello/{r}").decode() for r in range(world) if store.check([f"hello/{r}"])}
        report["hosts"] = {str(r): h for r, h in hosts.items()}
        missing = [r for r in range(world) if r not in hosts]
        if missing:
            report["no_answer"] = {"stage": "rendezvous", "ranks": missing}
            store.set("round/0", "stop")
            store.set("world", "stop")
            return _finish(report, 3, store)
    _note("met")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if backend != "gloo":  # hccl/nccl pairs are subgroups of the world, so the world comes first
        dist.init_process_group(
            backend, store=dist.PrefixStore("world", store), rank=rank, world_size=world, timeout=limit
        )

    def own_store(deadline: float) -> Any:
        """A store connection of the test's own: a call stuck in it cannot block this rank's next word."""
        return dist.TCPStore(addr, port, None, False, timeout=_left(deadline), wait_for_workers=False)

    def pair_side(key: str, a: int, b: int, deadline: float) -> dict[str, Any]:
        group = None
        try:
            data = torch.ones(args.pair_size // 4, dtype=torch.float32, device=device)
            if backend == "gloo":
                meet = dist.PrefixStore(key, own_store(deadline))
                group = dist.ProcessGroupGloo(meet, 0 if rank == a else 1, 2, _left(deadline))
                op = lambda: group.allreduce([data])  # noqa: E731
            else:
                group = dist.new_group([a, b], timeout=_left(deadline))
                op = lambda: dist.all_reduce(data, group=group, async_op=True)  # noqa: E731
            seconds = _timed(_runner(op, sync, deadline), args.iters, median=True)
            return {"kind": "ok", "bytes": args.pair_size, "seconds": seconds}
        except Exception as error:  # the deadline, a reset peer: the pair's answer is the error's kind
            _ABANDONED.append(group)
            return _error(error, backend)

    def world_side(deadline: float) -> list[dict[str, Any]]:
        mine: list[dict[str, Any]] = []
        size = 0
        try:
            if backend == "gloo":
                meet = dist.PrefixStore("world", own_store(deadline))
                dist.init_process_group(
                    backend, store=meet, rank=rank, world_size=world, timeout=_left(deadline)
                )
            for size in [int(s) for s in args.sizes.split(",") if s]:
                data = torch.ones(max(size // 4, 1), dtype=torch.float32, device=device)
                run = _runner(lambda d=data: dist.all_reduce(d, async_op=True), sync, deadline)
                mine.append({"bytes": size, "seconds": _timed(run, args.iters)})
        except Exception as error:
            mine.append({"bytes": size, **_error(error, backend)})
        return mine

    # gloo's connect can outlast the timeout it is given (a handshake queued behind a held link's
    # backlog): its tests run in a thread of their own, answered at the deadline whatever it does.
    # hccl/nccl groups are made by every rank in one order, so theirs stay on this thread.
    on_time = _within if backend == "gloo" else (lambda deadline, test, late: test())

    results: list[dict[str, Any]] = []
    overran = 0.0  # how far this rank's last test ran past its deadline (a call that ignored it)
    for number, pairs in enumerate(rounds):
        word = ("stop" if settled(results, rounds, hosts) else "go") if rank == 0 else None
        if not _opened(store, f"round/{number}", word, budget):
            break
        deadline = time.monotonic() + limit_s
        for k, (a, b) in enumerate(pairs):
            if rank not in (a, b):
                if backend != "gloo":
                    dist.new_group([a, b], timeout=limit)
                continue
            side = on_time(
                deadline,
                lambda key=f"pair/{number}/{k}", a=a, b=b, end=deadline: pair_side(key, a, b, end),
                {"kind": "timeout", "error": f"the pair did not finish within {limit_s:g} s"},
            )
            if overran > GRACE_S:
                side["late"] = round(overran, 1)
            store.set(f"pair/{number}/{k}/{rank}", json.dumps(side))
        overran = time.monotonic() - deadline
        _note(f"ring round {number} done")
        if rank == 0:
            keys = [f"pair/{number}/{k}/{r}" for k, pair in enumerate(pairs) for r in pair]
            got = _collect(store, keys, deadline + GRACE_S)
            for k, pair in enumerate(pairs):
                sides = {r: got.get(f"pair/{number}/{k}/{r}") for r in pair}
                results.append(merge_sides(pair, sides, limit_s))
    if rank == 0:
        report["pairs"] = results
    word = ("go" if all("error" not in p for p in results) else "stop") if rank == 0 else None
    if not _opened(store, "world", word, budget):
        return _finish(report, 3, store) if rank == 0 else 3
    deadline = time.monotonic() + limit_s
    _note("world test open")
    late = [{"bytes": 0, "kind": "timeout", "error": f"the world test did not finish within {limit_s:g} s"}]
    mine = on_time(deadline, lambda: world_side(deadline), late)
    store.set(f"full/{rank}", json.dumps(mine))
    if rank != 0:
        with contextlib.suppress(Exception):  # rank 0 may have gone with its store: its report is out
            store.set_timeout(timedelta(seconds=budget))
            store.wait(["done"])
        return 0
    got = _collect(store, [f"full/{r}" for r in range(world)], deadline + GRACE_S)
    silent = [{"bytes": 0, "kind": "silent", "error": f"no answer within {limit_s:g} s"}]
    report["full"] = {str(r): got.get(f"full/{r}", silent) for r in range(world)}
    failed = any("error" in m for run in report["full"].values() for m in run)
    return _finish(report, 3 if failed else 0, store)


def _finish(report: dict[str, Any], code: int, store: Any) -> int:
    """Rank 0's report line; its store serves a moment longer, so the others read that the check ended."""
    world = int(report["world"])
    keys = [f"facts/{r}" for r in range(world)]
    report["facts"] = {k.split("/")[1]: json.loads(store.get(k)) for k in keys if store.check([k])}
    print(MARK + json.dumps(report, sort_keys=True), flush=True)
    store.set("done", "1")
    time.sleep(1.0)
    return code


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # no destructor of an abandoned group may wait out its transfer

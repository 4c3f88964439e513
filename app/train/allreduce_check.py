"""The fabric check's rank program: ring-neighbour pair all-reduces, then all-reduces of the whole world
at a few sizes, with the job's backend; rank 0 prints one `GC_FABRIC {json}` line with every figure.

Every step has its own time limit, so a dead link ends as a named missing answer, never a hang: the
ranks meet on a TCPStore of their own (rank 0 sees who never checked in), each pair is its own process
group (a pair that times out names its two ranks), and a watchdog ends a rank stuck past every limit.
Started by `gaudi-cluster doctor --fabric` / `master --fabric-check` through the job's launcher.
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
from datetime import timedelta
from typing import Any

from train import node_facts

MARK = "GC_FABRIC "


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="allreduce_check")
    p.add_argument("--sizes", default="4096,1048576,8388608", help="message sizes in bytes, comma-separated")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds each test may take")
    p.add_argument("--backend", default="auto", help="gloo | hccl | nccl | auto (from the device)")
    p.add_argument("--pair-size", type=int, default=8388608, help="bytes of each pair test")
    p.add_argument("--gaudinet", default="", help="where L3 scale-out's gaudinet.json must be (HPU)")
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


def _timed(run: Any, sync: Any, iters: int, median: bool = False) -> float:
    """Seconds per call: the mean (nccl-tests' figure), or with `median` the middle call, which a
    busy CPU's scheduling hiccup cannot move (the pairs, compared with each other, use it)."""
    run()  # warm-up: connections and buffers, not the link, would dominate the first one
    sync()
    times = []
    started = time.perf_counter()
    for _ in range(iters):
        run()
        if median:
            sync()
            times.append(time.perf_counter() - started)
            started = time.perf_counter()
    sync()
    return statistics.median(times) if median else (time.perf_counter() - started) / iters


def main(argv: list[str] | None = None) -> int:
    args = _parse(list(sys.argv[1:] if argv is None else argv))
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    limit = timedelta(seconds=args.timeout)
    rounds = ring_rounds(world)
    # Past every limit (rendezvous, each pair round, init, each size) this rank is stuck: end it.
    budget = args.timeout * (len(rounds) + 3 + len(args.sizes.split(","))) + 10
    watchdog = threading.Timer(budget, lambda: os._exit(4))
    watchdog.daemon = True
    watchdog.start()
    device, backend = _device_and_backend(args.backend)
    report: dict[str, Any] = {"world": world, "backend": backend, "timeout_s": args.timeout, "hosts": {}}
    store = dist.TCPStore(addr, port, world, rank == 0, timeout=limit, wait_for_workers=False)
    store.set(f"hello/{rank}", socket.gethostname())
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:  # one node's facts, from its first rank
        with contextlib.suppress(Exception):
            store.set(f"facts/{rank}", json.dumps(node_facts.facts(backend, args.gaudinet)))
    if rank == 0:
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline and not store.check([f"hello/{r}" for r in range(world)]):
            time.sleep(0.1)
        missing = [r for r in range(world) if not store.check([f"hello/{r}"])]
        report["hosts"] = {str(r): store.get(f"hello/{r}").decode() for r in range(world) if r not in missing}
        if missing:
            report["no_answer"] = {"stage": "rendezvous", "ranks": missing}
            return _finish(report, 3, store)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if backend != "gloo":  # hccl/nccl pairs are subgroups of the world, so the world comes first
        dist.init_process_group(
            backend, store=dist.PrefixStore("world", store), rank=rank, world_size=world, timeout=limit
        )
    for number, pairs in enumerate(rounds):
        for k, (a, b) in enumerate(pairs):
            key = f"pair/{number}/{k}"
            if rank not in (a, b):
                if backend != "gloo":
                    dist.new_group([a, b], timeout=limit)
                continue
            result: dict[str, Any] = {"ranks": [a, b]}
            try:
                if backend == "gloo":
                    group = dist.ProcessGroupGloo(
                        dist.PrefixStore(key, store), 0 if rank == a else 1, 2, limit
                    )
                    data = torch.ones(args.pair_size // 4, dtype=torch.float32)
                    seconds = _timed(
                        lambda g=group, d=data: g.allreduce([d]).wait(), sync, args.iters, median=True
                    )
                else:
                    sub = dist.new_group([a, b], timeout=limit)
                    data = torch.ones(args.pair_size // 4, dtype=torch.float32, device=device)
                    seconds = _timed(
                        lambda d=data, g=sub: dist.all_reduce(d, group=g), sync, args.iters, median=True
                    )
                result.update(bytes=args.pair_size, seconds=seconds)
            except Exception as error:  # a timeout or a reset peer: the pair's answer is the error
                result.update(error=str(error).splitlines()[0][:300] if str(error) else type(error).__name__)
                if backend == "hccl":
                    result["log_tail"] = node_facts.hccl_log_tail()
            if rank == a:
                store.set(key, json.dumps(result))
    pair_results = []
    if rank == 0:
        for number, pairs in enumerate(rounds):
            for k in range(len(pairs)):
                key = f"pair/{number}/{k}"
                try:
                    store.wait([key], timedelta(seconds=args.timeout + 5))
                    pair_results.append(json.loads(store.get(key)))
                except Exception:
                    a, b = pairs[k]
                    pair_results.append({"ranks": [a, b], "error": f"no result within {args.timeout:g} s"})
        report["pairs"] = pair_results
        store.set("pairs_ok", "1" if not any("error" in p for p in pair_results) else "0")
    store.wait(["pairs_ok"], timedelta(seconds=budget))
    if store.get("pairs_ok") != b"1":
        return _finish(report, 3, store) if rank == 0 else 3
    if backend == "gloo":
        dist.init_process_group(
            backend, store=dist.PrefixStore("world", store), rank=rank, world_size=world, timeout=limit
        )
    sizes = [int(s) for s in args.sizes.split(",") if s]
    mine = []
    for size in sizes:
        data = torch.ones(max(size // 4, 1), dtype=torch.float32, device=device)
        try:
            seconds = _timed(lambda d=data: dist.all_reduce(d), sync, args.iters)
            mine.append({"bytes": size, "seconds": seconds})
        except Exception as error:
            mine.append({"bytes": size, "error": str(error).splitlines()[0][:300]})
            break
    store.set(f"full/{rank}", json.dumps(mine))
    if rank == 0:
        full: dict[str, Any] = {}
        for r in range(world):
            try:
                store.wait([f"full/{r}"], timedelta(seconds=args.timeout + 5))
                full[str(r)] = json.loads(store.get(f"full/{r}"))
            except Exception:
                full[str(r)] = [{"bytes": 0, "error": f"no result within {args.timeout:g} s"}]
        report["full"] = full
        store.set("done", "1")
        code = _finish(report, 0, store)
        time.sleep(1.0)  # rank 0 serves the store: the others read "done" before it goes
        return code
    # Rank 0 may have gone with its store already: its report is out, nothing is left to do.
    with contextlib.suppress(Exception):
        store.wait(["done"], timedelta(seconds=budget))
    return 0


def _finish(report: dict[str, Any], code: int, store: Any = None) -> int:
    if store is not None:  # facts already given; none is waited for
        world = int(report["world"])
        keys = [f"facts/{r}" for r in range(world)]
        report["facts"] = {k.split("/")[1]: json.loads(store.get(k)) for k in keys if store.check([k])}
    print(MARK + json.dumps(report, sort_keys=True), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())

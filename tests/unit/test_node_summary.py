"""A node relay's `summary` against the master's own per-rank bookkeeping: on random beats (seeded),
the master that applies each node's summary holds the same states, names the same stragglers with
the same figures, and keeps the same work histories as the master that applies every rank's beat."""

from __future__ import annotations

import json
import random

from gaudi_cluster.rank.relay_beats import NodeBeats, buckets
from gaudi_cluster.supervise.ranks import RankTable
from gaudi_cluster.view.jobview import AgentState, StragglerWatch
from gaudi_cluster.wire import messages, protocol

_HOT = ("step", "progress_age", "progress_received", "median", "timed", "max_steps", "samples_per_step",
        "last_line", "last_seen", "exited", "host", "local_rank")  # fmt: skip


def seats(nodes: int, per_node: int, order: random.Random) -> list[AgentState]:
    ranks = [r for r in range(nodes * per_node)]
    order.shuffle(ranks)  # seated in no particular order, as they join
    return [AgentState(f"h{r // per_node}", r, 100 + r, 0.0, local_rank=r % per_node) for r in ranks]


def over_the_wire(summary: messages.Summary) -> messages.Summary:
    line = json.dumps(messages.render(summary)).encode()
    assert len(line) < protocol.MAX_LINE
    parsed = messages.parse_line(line, messages.FROM_RELAY_SESSION)
    assert parsed == summary
    return parsed  # type: ignore[return-value]


def test_a_node_summary_gives_the_master_what_every_rank_beat_gives_it(monkeypatch):
    # Buckets as fine as the pairs, so the histories compare bucket by bucket (coarser ones merge
    # neighbouring steps: test_work_buckets_are_aligned_and_bounded).
    monkeypatch.setattr(protocol, "WORK_BUCKETS", 64)
    rng = random.Random(33)
    named = 0
    for trial in range(12):
        nodes, per_node = rng.choice([(1, 2), (3, 8), (20, 8), (6, 3)])
        per_rank, per_node_table = RankTable(), RankTable()
        seated_a = seats(nodes, per_node, random.Random(trial))
        seated_b = seats(nodes, per_node, random.Random(trial))
        for agent in seated_a:
            per_rank.seat(agent)
        for agent in seated_b:
            per_node_table.seat(agent)
        node_of = {a.rank: a.rank // per_node for a in seated_b}
        conns = {n: {a.rank: a for a in seated_b if node_of[a.rank] == n} for n in range(nodes)}
        relays = {n: NodeBeats() for n in range(nodes)}
        by_rank_a = {a.rank: a for a in seated_a}
        speed = {r: rng.choice([0.4, 0.4, 0.41, 0.5, 0.9]) for r in by_rank_a}
        step = dict.fromkeys(by_rank_a, 0)
        watch_a, watch_b = StragglerWatch(), StragglerWatch()
        for second in range(1, 50):
            now = float(second)
            for rank, agent in by_rank_a.items():  # each agent's beat: 0-3 new steps
                if rng.random() < 0.1:
                    beat = messages.Beat(
                        progress_age=rng.uniform(0, 5), last_line=rng.choice([None, "loss 1"])
                    )
                else:
                    new = range(step[rank] + 1, step[rank] + 1 + rng.randrange(0, 4))
                    step[rank] += len(new)
                    work = tuple((s, speed[rank] * rng.uniform(0.8, 1.25)) for s in new)
                    beat = messages.Beat(
                        step=step[rank] if rng.random() < 0.9 else None, max_steps=rng.choice([None, 500]),
                        samples_per_step=64, progress_age=round(rng.uniform(0, 2), 3), work=work,
                        last_line=rng.choice([None, f"loss {second}"]),
                    )  # fmt: skip
                per_rank.heard([agent], now, beat)
                relays[node_of[rank]].record(rank, beat)
            for node, relay in relays.items():  # once a second, the node's one line
                summary = over_the_wire(relay.message(sorted(conns[node]), now))
                per_node_table.heard_summary(conns[node], now, summary)
            a, b = per_rank.table(), per_node_table.table()
            assert a.ranks == b.ranks
            for name in _HOT:
                assert getattr(a, name) == getattr(b, name), (trial, second, name)
            assert watch_a.check(a) == watch_b.check(b), (trial, second)
            assert (watch_a.streak, watch_a.judged_step) == (watch_b.streak, watch_b.judged_step)
        for node, relay in relays.items():  # the relay's last word (its ranks exit): the work left
            summary = over_the_wire(relay.message(sorted(conns[node]), 1e9, flush=True))
            per_node_table.heard_summary(conns[node], 1e9, summary)
        histories_a, histories_b = per_rank.work_histories(), per_node_table.work_histories()
        assert histories_a.keys() == histories_b.keys()
        for rank in histories_a:  # the same buckets; sums in another order may differ in the last bit
            ours, theirs = list(histories_a[rank]), list(histories_b[rank])
            assert [s for s, _ in ours] == [s for s, _ in theirs], (trial, rank)
            assert all(abs(x - y) < 1e-9 for (_, x), (_, y) in zip(ours, theirs, strict=True))
            assert histories_a[rank].steps == histories_b[rank].steps
        named += len(watch_b.flagged)
        assert watch_a.flagged == watch_b.flagged
    assert named >= 5  # the data does name stragglers


def test_a_summary_speaks_only_for_the_ranks_its_relay_seated():
    table = RankTable()
    mine, theirs = AgentState("h0", 0, 1, 0.0), AgentState("h1", 1, 2, 0.0)
    table.seat(mine)
    table.seat(theirs)
    lie = messages.Beat(rank=1, last_line="forged")
    forged = messages.Summary((0, 1), (5, 99), (0.1, 0.1), (5, 99), medians=(None, 9.0), steady=(lie,))
    table.heard_summary({0: mine}, 3.0, forged)
    snap = table.table()
    assert (snap.step[0], snap.step[1], snap.median[1], snap.last_line[1]) == (5, None, None, "")
    assert snap.last_seen[1] == 0.0  # not heard: only its own relay speaks for it


def test_work_buckets_are_aligned_and_bounded():
    pairs = [(s, 1.0) for s in range(10, 300)]
    merged = buckets(pairs, 32)
    assert len(merged) <= 32 and sum(n for _, _, n in merged) == len(pairs)
    width = merged[1][0] - merged[0][0]
    assert width & (width - 1) == 0 and all(step % width == 0 for step, _, _ in merged[1:])
    assert buckets([(3, 0.5), (4, 0.25)], 32) == ((3, 0.5, 1), (4, 0.25, 1))


def test_a_bad_summary_is_dropped_with_its_reason():
    good = {"type": "summary", "ranks": [0, 1], "steps": [1, None], "ages": [0.5, None], "timed": [1, None]}
    assert messages.parse(good) == messages.Summary((0, 1), (1, None), (0.5, None), (1, None))
    for bad, why in (
        ({**good, "steps": [1]}, "steps is not a list of length 2"),
        ({**good, "ages": [-1.0, None]}, "ages holds a value of the wrong kind"),
        ({**good, "timed": [True, None]}, "timed holds a value of the wrong kind"),
        ({**good, "medians": [0.5, "x"]}, "medians holds"),
        ({**good, "medians": [0.5]}, "medians is not a list of length 0 or 2"),
        ({**good, "ages": [1e999, None]}, "ages holds"),
        ({**good, "work": [[0, 1, 0.5, 0]]}, "a work bucket"),
        ({**good, "work": [[0, 1, 0.5]]}, "work holds"),
        ({**good, "work": [[0, 1.5, 0.5, 1]]}, "a work bucket"),
        ({**good, "steady": [{"last_line": "x"}]}, "rank"),
        ({**good, "ranks": list(range(protocol.MAX_RANKS_PER_NODE + 1))}, "ranks is not a list"),
    ):
        try:
            messages.parse(bad)
        except messages.BadMessage as error:
            assert why in str(error), (bad, error)
        else:
            raise AssertionError(f"accepted {bad}")

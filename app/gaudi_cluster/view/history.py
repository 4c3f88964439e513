"""One rank's work per step over the whole run, in bounded memory: what the report plots. Pure.

Steps fall into buckets of `width` consecutive steps (aligned on multiples of the width); each bucket
keeps the sum and count of its steps' seconds. When there are more than `capacity` buckets, the width
doubles and neighbours merge, so a rank keeps between capacity/2 and capacity points however long the
job runs (a list of every step was 50,000 tuples per rank: ~48 GB at 8,000 ranks).

Means per bucket rather than every k-th step: every step counts, so a periodic slow step (a
checkpoint, an eval every N steps) cannot alias to always or never being seen, and buckets aligned on
step numbers line up across ranks (the report takes per-node medians and maxima bucket by bucket).
Compact arrays, not tuples: 20 bytes a bucket (~5 KB a rank) instead of ~120 bytes a point.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterable, Iterator

CAPACITY = 256  # points a rank keeps at most: the report's plot is ~900 pixels wide


class WorkHistory:
    """(step, seconds of this rank's own work) pairs, downsampled to at most `capacity` points."""

    __slots__ = ("_counts", "_keys", "_sums", "capacity", "width")

    def __init__(self, pairs: Iterable[tuple[int, float]] = (), capacity: int = CAPACITY) -> None:
        if capacity < 2:
            raise ValueError("a work history keeps at least 2 points")
        self.capacity = capacity
        self.width = 1  # steps per bucket: a power of two
        self._keys = array("q")  # bucket number (step // width), ascending
        self._sums = array("d")
        self._counts = array("I")
        self.extend(pairs)

    def extend(self, pairs: Iterable[tuple[int, float]]) -> None:
        for step, seconds in pairs:
            key, keys = int(step) // self.width, self._keys
            if keys and key == keys[-1]:  # the usual cases inline: 16,000 steps a second at scale
                self._sums[-1] += seconds
                self._counts[-1] += 1
                continue
            if not keys or key > keys[-1]:
                keys.append(key)
                self._sums.append(float(seconds))
                self._counts.append(1)
            else:
                self._add(key, float(seconds))
            if len(keys) > self.capacity:
                self._halve()

    def add_buckets(self, buckets: Iterable[tuple[int, float, int]]) -> None:
        """(first step, seconds summed, steps) from a node relay (its buckets are aligned on a power
        of two, so each falls within one of ours once ours are as wide; until then, into the one of
        its first step)."""
        for step, total, count in buckets:
            self._add(int(step) // self.width, float(total), int(count))
            if len(self._keys) > self.capacity:
                self._halve()

    def _add(self, key: int, seconds: float, count: int = 1) -> None:
        keys = self._keys
        if not keys or key > keys[-1]:  # the usual case: a later step
            keys.append(key)
            self._sums.append(seconds)
            self._counts.append(count)
            return
        at = len(keys) - 1 if key == keys[-1] else bisect.bisect_left(keys, key)
        if keys[at] == key:
            self._sums[at] += seconds
            self._counts[at] += count
        else:  # an earlier step arriving late (a resent beat): its own bucket, in order
            keys.insert(at, key)
            self._sums.insert(at, seconds)
            self._counts.insert(at, count)

    def _halve(self) -> None:
        """Double the width: buckets 2k and 2k+1 become bucket k."""
        keys, sums, counts = array("q"), array("d"), array("I")
        for key, total, count in zip(self._keys, self._sums, self._counts, strict=True):
            merged = key // 2
            if keys and keys[-1] == merged:
                sums[-1] += total
                counts[-1] += count
            else:
                keys.append(merged)
                sums.append(total)
                counts.append(count)
        self.width *= 2
        self._keys, self._sums, self._counts = keys, sums, counts

    def __iter__(self) -> Iterator[tuple[int, float]]:
        """(first step of the bucket, mean seconds of its steps), in step order."""
        width = self.width
        for key, total, count in zip(self._keys, self._sums, self._counts, strict=True):
            yield key * width, total / count

    def __len__(self) -> int:
        return len(self._keys)

    def __bool__(self) -> bool:
        return bool(self._keys)

    @property
    def steps(self) -> int:
        """How many (step, seconds) pairs went in."""
        return sum(self._counts)

    def copy(self) -> WorkHistory:
        twin = WorkHistory(capacity=self.capacity)
        twin.width = self.width
        twin._keys, twin._sums, twin._counts = (
            array("q", self._keys),
            array("d", self._sums),
            array("I", self._counts),
        )
        return twin

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WorkHistory):
            return NotImplemented
        return (self.width, self._keys, self._sums, self._counts) == (
            other.width,
            other._keys,
            other._sums,
            other._counts,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"WorkHistory({len(self)} points, {self.width} steps each)"

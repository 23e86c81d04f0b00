"""Recorded oracle histories and the invariant checks of the contract (docs/design.md).

Times are CLOCK_MONOTONIC nanoseconds, which all processes on one host share. An operation that
raised is not recorded: it may have allocated a timestamp (a gap), never a duplicate.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Op:
    kind: str  # "write", "read", "apply"
    start: int
    end: int
    value: int
    proc: str = ""
    applied_at: int | None = None  # for writes: when their apply_write started, if any


def load(paths: Iterable[Path]) -> list[Op]:
    ops = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.strip():
                ops.append(Op(**json.loads(line)))
    return ops


def check(ops: list[Op]) -> list[str]:
    """Return every violation found (empty when the history is fine)."""
    problems: list[str] = []
    writes = [o for o in ops if o.kind == "write"]
    reads = [o for o in ops if o.kind == "read"]
    applies = [o for o in ops if o.kind == "apply"]

    seen: dict[int, Op] = {}
    for w in writes:
        if w.value in seen:
            problems.append(f"write timestamp {w.value} handed out twice ({seen[w.value]}, {w})")
        seen[w.value] = w

    # Prefix maxima over operations ordered by completion time.
    def prefix(items: list[Op]) -> tuple[list[int], list[int]]:
        items = sorted(items, key=lambda o: o.end)
        ends, best, top = [], [], -1
        for o in items:
            top = max(top, o.value)
            ends.append(o.end)
            best.append(top)
        return ends, best

    def max_before(table: tuple[list[int], list[int]], t: int) -> int:
        ends, best = table
        i = bisect.bisect_left(ends, t)
        return best[i - 1] if i else -1

    everything = prefix(writes + reads + applies)
    applied = prefix(applies)
    read_table = prefix(reads)
    for w in writes:
        before = max_before(everything, w.start)
        if w.value <= before:
            problems.append(f"write {w.value} not above {before}, finished before it started")
    for r in reads:
        floor = max_before(applied, r.start)
        if r.value < floor:
            problems.append(f"read {r.value} below apply_write({floor}) that completed before")
        prev = max_before(read_table, r.start)
        if r.value < prev:
            problems.append(f"read {r.value} went backwards from {prev}")

    # A read strictly between a write's allocation and the start of its apply_write must not
    # reach the write: it would later see the write appear below its timestamp.
    # Another writer's higher apply_write legitimately lifts read_ts past it, so only a read that
    # no apply (started before the read ended) can explain counts.
    apply_starts = sorted(applies, key=lambda o: o.start)
    a_starts, a_best, top = [], [], -1
    for a in apply_starts:
        top = max(top, a.value)
        a_starts.append(a.start)
        a_best.append(top)
    by_start = sorted(reads, key=lambda o: o.start)
    starts = [o.start for o in by_start]
    for w in writes:
        if w.applied_at is None:
            continue
        i = bisect.bisect_right(starts, w.end)
        for r in by_start[i:]:
            if r.start >= w.applied_at:
                break
            j = bisect.bisect_left(a_starts, r.end)
            explained = j > 0 and a_best[j - 1] >= w.value
            if r.end < w.applied_at and r.value >= w.value and not explained:
                problems.append(f"read {r.value} passed unapplied write {w.value}")
    return problems

"""What this process has seen of each timeline, so that a database that went back in time (a
restore, a point-in-time recovery) is refused instead of handing out timestamps again.

The contract (docs/design.md, "What an oracle promises"; read_ts and write_ts only move
forward, GREATEST in every statement), restricted to what one process can check: for
answers this process recorded before it sent the statement that answers now,
- write_ts returns w > every write_ts, peek_write_ts and read_ts answer, and every t of a
  completed apply_write (write_ts is above every write and read timestamp handed out, and
  apply_write(t) leaves write_ts >= t);
- peek_write_ts returns p >= all of those (the latest allocation; every row keeps
  write_ts >= read_ts, and apply_write raises both);
- read_ts returns r >= every read_ts answer and every applied t. Not >= an earlier write_ts:
  a write allocated and not applied stays above read_ts.
So a `Mark` keeps two numbers: `write`, the highest of everything, and `read`, the highest read
or applied timestamp. A check compares with the mark as it was before the statement was sent:
a concurrent call's answer, recorded meanwhile, may rightly be higher than this one (the
database ordered the two statements either way). One comparison answers the common case: an
answer above the mark is recorded and needs no other check.

The legacy implementation answers from memory, out of durable rows: the rows are what it
observes. A new leader resumes reads at read_ts (>= `read`) and writes above the reserved upper
(>= `write`: its first write is upper + 1); its reservations and persisted reads are recorded,
and they are at or above everything it hands out, so the mark covers a leader's whole window.

Where the marks live: here, one per (database, schema, incarnation, timeline), shared by every
oracle of the process. A ReopeningOracle's next oracle, a legacy leader started after a
failover in the same process, the catalog's oracle beside the application's: each is checked
against what the others saw, so one opened after the restore cannot start from the rewound
rows. The incarnation keeps apart a deployment dropped and provisioned again, whose timestamps
restart on purpose; the epoch and the implementation are not in the key, since a flip never
lowers a timeline (it bootstraps the target to the maximum). Another process has marks of its
own, or none: the operator's high-water mark covers the processes that start after a restore.

Sync facades run oracles on threads of their own: two threads may record at once and one
value be lost. The mark then holds a lower value this process did see: a fallback may be
missed in that moment, never reported falsely.
"""

from __future__ import annotations

import threading

from tsoracle.errors import TimestampFallback
from tsoracle.oracle import metrics
from tsoracle.store import Backend


class Mark:
    """The highest timestamps seen on one timeline of one deployment (module docstring)."""

    __slots__ = ("timeline", "read", "write")

    def __init__(self, timeline: str) -> None:
        self.timeline = timeline
        self.read = 0
        self.write = 0

    def saw_read(self, ts: int) -> None:
        """A read position (a read_ts answer, an applied or persisted read frontier)."""
        if ts > self.read:
            self.read = ts
            if ts > self.write:
                self.write = ts

    def saw_write(self, ts: int) -> None:
        """A write position (a write_ts or peek answer, a reserved upper)."""
        if ts > self.write:
            self.write = ts

    def fell(self, kind: str, got: int, seen: int) -> TimestampFallback:
        """Count a fallback; the error to raise."""
        metrics.FALLBACK.inc(self.timeline)
        return TimestampFallback(self.timeline, kind, got, seen)


_marks: dict[tuple[str, str, str, str], Mark] = {}
_lock = threading.Lock()


def mark_for(backend: Backend, incarnation: str, timeline: str) -> Mark:
    """The process's mark of `timeline` in the deployment `backend` addresses."""
    url = backend.url
    # A SQLite location is its absolute path; a server's, the URL with its secrets masked
    # (never shown: a key, not a message).
    where = url.dsn if url.kind == "sqlite" else url.safe
    key = (where, url.schema, incarnation, timeline)
    mark = _marks.get(key)
    if mark is None:
        with _lock:
            mark = _marks.setdefault(key, Mark(timeline))
    return mark

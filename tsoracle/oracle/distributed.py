"""The distributed oracle: every operation is one statement against the timeline's row.

The backend linearizes the operations, so any number of processes may share a timeline. With
fencing on, each statement also evaluates the guard on the row it touches, so a process the
deployment has moved past gets `Fenced` from the same statement, with no extra round trip.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from tsoracle.coalesce import shared_calls
from tsoracle.errors import ClockSkew, TimestampExhausted, UnknownTimeline
from tsoracle.fencing import Deployment, read_deployment, superseded
from tsoracle.fencing.tables import fenced
from tsoracle.oracle.api import TimestampOracle, WriteTimestamp
from tsoracle.oracle.timeline import Timeline
from tsoracle.store import U64_MAX, Backend
from tsoracle.store.backend import Pinned

# One statement per operation; each carries the fencing guard, checked by the row it touches.
_SQL = {
    "write": fenced("UPDATE {timestamps} SET write_ts = GREATEST(write_ts + 1, %(now)s::numeric)"
                    " WHERE {row} AND write_ts < %(max)s::numeric"
                    " AND write_ts + 1 <= %(ceiling)s::numeric AND {guard} RETURNING write_ts"),
    "peek": fenced("SELECT write_ts, {guard} FROM {timestamps} WHERE {row}"),
    "read": fenced("SELECT read_ts, {guard} FROM {timestamps} WHERE {row}"),
    "apply": fenced("UPDATE {timestamps} SET write_ts = GREATEST(write_ts, %(ts)s::numeric),"
                    " read_ts = GREATEST(read_ts, %(ts)s::numeric)"
                    " WHERE {row} AND {guard} RETURNING read_ts"),
    "confirm": fenced("SELECT {guard} FROM {timestamps} WHERE {row}"),
}


class DistributedOracle(TimestampOracle):
    implementation = "distributed"
    pinned_connections = 2  # batched reads, batched confirmations (see __init__)

    def __init__(
        self,
        backend: Backend,
        timeline: Timeline,
        deployment: Deployment,
        *,
        read_only: bool,
        fencing_override: str | None,
        now: Callable[[], int] | None,
        max_clock_skew_ms: int | None,
        batching: bool = True,
        pipeline_depth: int = 1,
    ) -> None:
        super().__init__(backend, timeline, deployment, read_only=read_only,
                         fencing_override=fencing_override, now=now,
                         max_clock_skew_ms=max_clock_skew_ms)
        self.pipeline_depth = pipeline_depth
        self._sql = _SQL
        self._base = {"timeline": self.timeline.name, "implementation": "distributed",
                      **self.deployment.guard_params()}
        # Batched reads and confirmations each keep a connection for the first batch in flight;
        # further ones (up to `pipeline_depth`, coalesce.Pipelined) borrow from the pool.
        self._read_conn, confirm_conn = self.backend.pinned(), self.backend.pinned()
        self._pinned = [self._read_conn, confirm_conn]
        self._reads = shared_calls(
            [partial(self._query_read, self._read_conn),
             *[partial(self._query_read, None)] * (pipeline_depth - 1)],
            self.batch_observer("read_ts")) if batching else None
        self._confirms = shared_calls(
            [partial(self._query_confirm, confirm_conn),
             *[partial(self._query_confirm, None)] * (pipeline_depth - 1)],
            self.batch_observer("confirm_leadership"))

    async def _fetch(self, name: str, **params: Any) -> list[tuple[Any, ...]]:
        self.count_query(name)
        return await self.backend.fetch(self._sql[name], {**self._base, **params})

    async def _fetch_on(self, name: str, conn: Pinned | None) -> list[tuple[Any, ...]]:
        """On `conn`, or on any pool connection when None."""
        if conn is None:
            return await self._fetch(name)
        self.count_query(name)
        return await conn.fetch(self._sql[name], self._base)

    async def _quiesce(self) -> None:
        await super()._quiesce()
        # A batch whose callers all gave up (cancelled) still runs on a pinned connection.
        if self._reads is not None:
            await self._reads.idle()
        await self._confirms.idle()

    async def _close_resources(self) -> None:
        for pinned in self._pinned:
            await pinned.close()
        await super()._close_resources()

    async def _write_ts(self) -> WriteTimestamp:
        now = self.now() if self.timeline.wall_clock else 0
        ceiling = U64_MAX
        if self.timeline.wall_clock and self.max_clock_skew_ms is not None:
            ceiling = min(U64_MAX, now + self.max_clock_skew_ms)
        enc = self.backend.enc
        mark = self._mark
        floor = mark.write  # before the statement: see oracle/highwater.py
        rows = await self._fetch("write", now=enc(now), max=enc(U64_MAX), ceiling=enc(ceiling))
        if not rows:
            raise await self._why_no_write(now)
        ts = self.backend.dec(rows[0][0])
        if ts > mark.write:
            mark.write = ts
        elif ts <= floor:
            raise mark.fell("write_ts", ts, floor)
        return WriteTimestamp(ts, ts + 1)

    async def _peek_write_ts(self) -> int:
        mark = self._mark
        floor = mark.write
        ts = await self._guarded_value(await self._fetch("peek"))
        if ts > mark.write:
            mark.write = ts
        elif ts < floor:
            raise mark.fell("write_ts", ts, floor)
        return ts

    async def _read_ts(self) -> int:
        if self._reads is None:
            return await self._query_read(self._read_conn)
        return await self._reads.call()

    async def _query_read(self, conn: Pinned | None) -> int:
        mark = self._mark
        floor = mark.read
        ts = await self._guarded_value(await self._fetch_on("read", conn))
        if ts > mark.read:
            mark.saw_read(ts)
        elif ts < floor:
            raise mark.fell("read_ts", ts, floor)
        return ts

    async def _guarded_value(self, rows: list[tuple[Any, ...]]) -> int:
        """The timestamp of a `SELECT value, guard` row, or the reason there is none."""
        if not rows:
            raise UnknownTimeline(self.timeline.name)
        value, ok = rows[0]
        if not ok:
            raise await self._why_refused()
        return self.backend.dec(value)

    async def _apply_write(self, ts: int) -> None:
        rows = await self._fetch("apply", ts=self.backend.enc(ts))
        if not rows:
            raise await self._why_refused()

    async def _confirm_leadership(self) -> None:
        await self._confirms.call()

    async def _query_confirm(self, conn: Pinned | None) -> None:
        rows = await self._fetch_on("confirm", conn)
        if not rows:
            raise UnknownTimeline(self.timeline.name)
        if not rows[0][0]:
            raise await self._why_refused()

    async def _why_refused(self) -> Exception:
        rows = await self._fetch("confirm")
        if not rows:
            return UnknownTimeline(self.timeline.name)
        return superseded(self.deployment, await read_deployment(self.backend), "distributed")

    async def _why_no_write(self, now: int) -> Exception:
        rows = await self.backend.fetch(self._sql["peek"], self._base)
        if not rows:
            return UnknownTimeline(self.timeline.name)
        current, ok = self.backend.dec(rows[0][0]), rows[0][1]
        if not ok:
            return superseded(self.deployment, await read_deployment(self.backend), "distributed")
        if current >= U64_MAX:
            return TimestampExhausted.at_end(self.timeline.name)
        return ClockSkew.ahead(self.timeline.name, current + 1, now, self.max_clock_skew_ms or 0)

"""The legacy oracle: timestamps served from memory by the one leader process.

Timestamps come from a window reserved durably ahead of time, so no call does I/O except the
rare reservation. It is valid only while this process is the leader: with fencing on, results are
released after a (shared) `confirm_leadership` that asks the storage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tsoracle.errors import ClockSkew, TimestampExhausted
from tsoracle.fencing import Deployment, Leadership
from tsoracle.oracle.api import TimestampOracle, WriteTimestamp
from tsoracle.oracle.timeline import Timeline
from tsoracle.store import U64_MAX, Backend

DISABLED_MAX_STALENESS_S = 1.0  # reads under fencing Disabled confirm at least this often
DEFAULT_WINDOW = 1000  # ms on EpochMilliseconds, timestamps on counting timelines


class LegacyOracle(TimestampOracle):
    implementation = "legacy"
    pinned_connections = 1  # the leadership's batched confirmations

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
        window: int = DEFAULT_WINDOW,
        pipeline_depth: int = 1,
    ) -> None:
        super().__init__(backend, timeline, deployment, read_only=read_only,
                         fencing_override=fencing_override, now=now,
                         max_clock_skew_ms=max_clock_skew_ms)
        if window < 1:
            raise ValueError("window must be at least 1")
        self.window = window
        self.pipeline_depth = pipeline_depth
        self.leadership = Leadership(
            self.backend, self.timeline.name, self.deployment,
            fencing_override=self.fencing_override,
            on_batch=self.batch_observer("confirm_leadership"), on_query=self.count_query,
            pipeline_depth=pipeline_depth,
        )
        self._read = 0
        self._write = 0
        self._upper = 0
        self._extending = asyncio.Lock()
        self._prefetch: asyncio.Task[None] | None = None
        self.resumed_at = 0

    async def start(self) -> None:
        """Take over the timeline; a previous leader is fenced from now on."""
        mark = self._mark
        read_floor, write_floor = mark.read, mark.write
        state = await self.leadership.start()
        # The rows went back below what this process saw (a restored database): resuming from
        # them would hand out again what a leader here already did (oracle/highwater.py).
        if state.upper < write_floor:
            raise mark.fell("write_ts", state.upper, write_floor)
        if state.read_ts < read_floor:
            raise mark.fell("read_ts", state.read_ts, read_floor)
        mark.saw_read(state.read_ts)
        mark.saw_write(state.upper)
        # The old leader may have handed out anything up to its reserved upper, and every read
        # it returned was persisted first: reads resume there, writes above the upper.
        self._read = state.read_ts
        self._write = self._upper = state.upper
        self.resumed_at = state.upper  # histories record this as the leader's starting point
        await self._extend(self._write + 1)

    async def _write_ts(self) -> WriteTimestamp:
        while True:
            self.leadership.check()
            now = self.now() if self.timeline.wall_clock else 0
            nxt = max(self._write + 1, now)
            if nxt > U64_MAX:
                raise TimestampExhausted.at_end(self.timeline.name)
            if self.timeline.wall_clock and self.max_clock_skew_ms is not None \
                    and nxt > now + self.max_clock_skew_ms:
                raise ClockSkew.ahead(self.timeline.name, nxt, now, self.max_clock_skew_ms)
            if nxt <= self._upper:
                self._write = nxt  # no await since computing nxt: allocation is atomic
                break
            await self._extend(nxt)
        self._maybe_prefetch()
        await self._release(allocation=True)
        return WriteTimestamp(nxt, nxt + 1)

    async def _peek_write_ts(self) -> int:
        value = self._write
        await self._release()
        return value

    async def _read_ts(self) -> int:
        value = self._read
        await self._release()
        return value

    async def _apply_write(self, ts: int) -> None:
        while ts > self._upper:
            await self._extend(ts)
        self._write = max(self._write, ts)
        if ts <= self._read:
            await self._release()
            return
        # Durable before any read_ts can return it (the guarded write also confirms).
        await self.leadership.persist_read(ts)
        self._read = max(self._read, ts)

    async def _confirm_leadership(self) -> None:
        await self.leadership.confirm()

    async def _release(self, *, allocation: bool = False) -> None:
        """Confirm the leadership before a result leaves: always for an allocation (a
        superseded leader must not hand out write timestamps, whatever the mode); for reads
        unless the mode is Disabled, and even then at least every DISABLED_MAX_STALENESS_S,
        which bounds stale reads and lets the leader learn of a mode change."""
        self.leadership.check()
        if allocation or self.leadership.confirms_reads \
                or self.leadership.since_confirmed() >= DISABLED_MAX_STALENESS_S:
            await self.leadership.confirm()

    async def _extend(self, needed: int) -> None:
        """Reserve a window covering `needed` before any timestamp in it is handed out."""
        async with self._extending:
            if needed <= self._upper:
                return
            target = min(U64_MAX, needed + self.window)
            self._upper = await self.leadership.reserve(target, self._read)
            self._mark.saw_write(self._upper)  # everything it hands out is at or below

    def _maybe_prefetch(self) -> None:
        # Reserve the next window in the background once half of this one is used, so callers
        # rarely wait for a reservation.
        if self._prefetch is not None and not self._prefetch.done():
            return
        now = self.now() if self.timeline.wall_clock else 0
        if max(self._write, now) + self.window // 2 < self._upper:
            return
        self._prefetch = asyncio.get_running_loop().create_task(self._prefetch_once())

    async def _prefetch_once(self) -> None:
        try:
            now = self.now() if self.timeline.wall_clock else 0
            await self._extend(max(self._write, now) + self.window // 2 + 1)
        except Exception:  # the next caller that needs the window sees the error itself
            pass

    async def _quiesce(self) -> None:
        await super()._quiesce()
        if self._prefetch is not None and not self._prefetch.done():
            self._prefetch.cancel()
            await asyncio.wait({self._prefetch})  # its reservation must not outlive the pool
        await self.leadership.idle()

    async def _close_resources(self) -> None:
        if self._prefetch is not None and not self._prefetch.done():
            self._prefetch.cancel()  # only if quiescing timed out
        await self.leadership.close()
        await super()._close_resources()

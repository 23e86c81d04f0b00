"""The TimestampOracle interface shared by every implementation, with its instrumentation."""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import NamedTuple, TypeVar

from tsoracle.errors import (
    ClockSkew,
    ConfigError,
    Fenced,
    OracleClosed,
    OracleError,
    ReadOnly,
)
from tsoracle.fencing import Deployment
from tsoracle.oracle import highwater, metrics
from tsoracle.oracle.timeline import Timeline
from tsoracle.store import U64_MAX, Backend

T = TypeVar("T")

CLOSE_GRACE_S = 5.0  # beyond the retry budget, for operations in flight when close() is called


class WriteTimestamp(NamedTuple):
    """A write timestamp and the frontier a writer may advance its output to afterwards."""

    timestamp: int
    advance_to: int


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def check_ts(ts: object) -> int:
    if isinstance(ts, bool) or not isinstance(ts, int) or not 0 <= ts <= U64_MAX:
        raise ConfigError(f"timestamp {ts!r} is not an integer in [0, {U64_MAX}]")
    return ts


class TimestampOracle(ABC):
    """Per-timeline timestamps: `write_ts`, `peek_write_ts`, `read_ts`, `apply_write`.

    Subclasses implement the underscored methods; this class counts, times and guards them.
    """

    implementation = "abstract"
    pinned_connections = 0  # pool connections an open oracle keeps for itself
    pipeline_depth = 1  # batched calls in flight at once (coalesce.Pipelined)

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
    ) -> None:
        self.backend = backend
        self.timeline = timeline
        self.deployment = deployment
        self.read_only = read_only
        self.fencing_override = fencing_override
        self.now = now or wall_clock_ms
        self.max_clock_skew_ms = max_clock_skew_ms
        impl = self.implementation
        self._started = {op: metrics.STARTED.labels(op, impl) for op in metrics.OPERATIONS}
        self._ok = {op: metrics.SUCCEEDED.labels(op, impl) for op in metrics.OPERATIONS}
        self._latency = {op: metrics.LATENCY.labels(op, impl) for op in metrics.OPERATIONS}
        self._confirm_latency = metrics.CONFIRM_LATENCY.labels(impl)
        self._read_started = self._started["read_ts"]
        self._read_ok = self._ok["read_ts"]
        self._read_latency = self._latency["read_ts"]
        self._queries: dict[str, metrics.CounterChild] = {}
        self._lag_key = (timeline.name,) if timeline.wall_clock else None
        # close() waits for operations in flight instead of pulling connections from under them
        self._closed = False
        self._closing: asyncio.Task[None] | None = None
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        metrics.EPOCH.set((timeline.name,), deployment.epoch)
        # What this process saw of the timeline, shared by its oracles (oracle/highwater.py);
        # the fallback series exists from the start, so a rate over it is 0, not "no data".
        self._mark = highwater.mark_for(backend, deployment.incarnation, timeline.name)
        metrics.FALLBACK.inc(timeline.name, amount=0)

    @property
    def epoch(self) -> int:
        """The deployment epoch this oracle opened under."""
        return self.deployment.epoch

    def count_query(self, statement: str) -> None:
        counter = self._queries.get(statement)
        if counter is None:
            counter = metrics.BACKEND_QUERIES.labels(statement, self.implementation)
            self._queries[statement] = counter
        counter.inc()

    def batch_observer(self, operation: str) -> Callable[[int], None]:
        return metrics.BATCH_SIZE.labels(operation, self.implementation).observe

    async def write_ts(self) -> WriteTimestamp:
        """Allocate a timestamp above every write and read timestamp handed out so far."""
        self._writable("write_ts")
        return await self._observe("write_ts", self._write_ts)

    async def peek_write_ts(self) -> int:
        """The latest allocated write timestamp, without allocating."""
        return await self._observe("peek_write_ts", self._peek_write_ts)

    async def read_ts(self) -> int:
        """A timestamp that covers every completed apply_write and no pending write."""
        # The hottest call of all: instrumented inline rather than through _observe.
        self._read_started.inc()
        start = time.perf_counter()
        self._enter("read_ts")
        try:
            ts = await self._read_ts()
        except OracleError as exc:
            self._failed("read_ts", exc)
            raise
        finally:
            self._leave()
        self._read_latency.observe(time.perf_counter() - start)
        self._read_ok.inc()
        if self._lag_key is not None:
            metrics.READ_LAG.set(self._lag_key, self.now() - ts)
        return ts

    async def apply_write(self, ts: int) -> None:
        """Mark writes at `ts` complete: afterwards read_ts >= ts and write_ts >= ts."""
        self._writable("apply_write")
        check_ts(ts)

        async def apply() -> None:
            self._check_skew("apply_write", ts)  # inside: a refusal counts as a failed call
            await self._apply_write(ts)

        await self._observe("apply_write", apply)
        self._mark.saw_read(ts)  # read_ts >= ts and write_ts >= ts from now on

    async def confirm_leadership(self) -> None:
        """Raise Fenced unless the storage shows this process is still current."""
        start = time.perf_counter()
        try:
            await self._observe("confirm_leadership", self._confirm_leadership)
        finally:
            self._confirm_latency.observe(time.perf_counter() - start)

    async def close(self) -> None:
        """Refuse new operations, let those in flight finish, then release the connections.

        Safe to call while other tasks still use the oracle (reopen-on-fence does): they get
        OracleClosed or their answer, never a connection closed under a running statement.
        Operations get the retry budget plus CLOSE_GRACE_S to finish; a statement that never
        returns does not keep the connections open forever. Concurrent or cancelled calls
        share one shutdown, which always runs to the end.
        """
        self._closed = True
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._shut_down())
        await asyncio.shield(self._closing)

    async def _shut_down(self) -> None:
        budget = self.backend.retry.timeout + CLOSE_GRACE_S
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._quiesce(), budget)
        await self._close_resources()

    async def _quiesce(self) -> None:
        """Wait for operations in flight; subclasses also wait for their background work."""
        await self._idle.wait()

    async def _close_resources(self) -> None:
        """Close what this oracle holds; subclasses add their own before calling this."""
        await self.backend.close()

    def _enter(self, op: str) -> None:
        if self._closed:
            exc = OracleClosed()
            self._failed(op, exc)
            raise exc
        self._inflight += 1
        self._idle.clear()

    def _leave(self) -> None:
        self._inflight -= 1
        if self._inflight == 0:
            self._idle.set()

    async def __aenter__(self) -> TimestampOracle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_skew(self, op: str, ts: int) -> None:
        """On a wall-clock timeline, refuse a timestamp further ahead than write_ts may go:
        applying it would make every later write_ts fail with ClockSkew until the clock
        caught up (for years, with a typo)."""
        if not self.timeline.wall_clock or self.max_clock_skew_ms is None:
            return
        now = self.now()
        if ts > now + self.max_clock_skew_ms:
            raise ClockSkew(
                f"{op}({ts}) on timeline {self.timeline.name!r} is {ts - now} ms ahead of this "
                f"process's wall clock, more than the allowed {self.max_clock_skew_ms} ms; "
                "apply only timestamps that write_ts handed out (if it did, this clock went "
                "back since: the write stays unapplied until the clock catches up)"
            )

    def _writable(self, op: str) -> None:
        if self.read_only:
            raise ReadOnly(
                f"{op} needs a writable oracle; this one was opened read-only"
            )

    async def _observe(self, op: str, fn: Callable[[], Awaitable[T]]) -> T:
        self._started[op].inc()
        start = time.perf_counter()
        self._enter(op)
        try:
            result = await fn()
        except OracleError as exc:
            self._failed(op, exc)
            raise
        finally:
            self._leave()
        self._latency[op].observe(time.perf_counter() - start)
        self._ok[op].inc()
        return result

    def _failed(self, op: str, exc: OracleError) -> None:
        metrics.FAILED.inc(op, self.implementation, type(exc).__name__)
        if isinstance(exc, Fenced):
            metrics.FENCED.inc(self.implementation)

    @abstractmethod
    async def _write_ts(self) -> WriteTimestamp: ...

    @abstractmethod
    async def _peek_write_ts(self) -> int: ...

    @abstractmethod
    async def _read_ts(self) -> int: ...

    @abstractmethod
    async def _apply_write(self, ts: int) -> None: ...

    @abstractmethod
    async def _confirm_leadership(self) -> None: ...

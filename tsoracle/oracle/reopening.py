"""An oracle that outlives flips: on `Fenced` it opens the active implementation and retries.

A fenced statement changed nothing (the guard refused it), so running the call again on the
oracle that is now active serves it exactly once, from the implementation that may serve it.
A deployment dropped and provisioned again (`Reprovisioned`) is the exception: the call is not
run again, since its timestamps belong to the old deployment.
The Spark driver client, the test workloads and the lincheck runner all go through this one
wrapper; it has the oracle's own interface (oracle/operations.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tsoracle.errors import Fenced, LeadershipLost, OracleClosed, Reprovisioned, anew
from tsoracle.oracle.api import TimestampOracle, WriteTimestamp

T = TypeVar("T")
log = logging.getLogger("tsoracle.reopening")
MAX_REOPENS = 10


class ReopeningOracle:
    """`open()` makes a fresh oracle of the active implementation (say, with
    `implementation=None`); it may raise to refuse (a process that must not lead).

    `LeadershipLost` is not retried: another process took this legacy timeline over, and
    taking it back would fence that one in turn. It is raised again on every call while
    `still_lost()` says so (by default: until a new ReopeningOracle is made). With
    `take_over=True` it is retried like any fence instead, taking the timeline back: for
    processes whose leadership something else arbitrates (`open` refusing the others).
    """

    def __init__(self, open: Callable[[], Awaitable[TimestampOracle]], *, name: str = "",
                 still_lost: Callable[[], Awaitable[bool]] | None = None,
                 take_over: bool = False, max_reopens: int = MAX_REOPENS) -> None:
        self._open = open
        self.name = name  # for messages: the timeline
        self._still_lost = still_lost
        self._take_over = take_over
        self._max_reopens = max_reopens
        self._oracle: TimestampOracle | None = None
        self._opening: asyncio.Task[TimestampOracle] | None = None  # one open at a time
        self._retiring: set[asyncio.Task[None]] = set()  # fenced oracles draining to close
        self._lost: LeadershipLost | None = None
        self._shut = False
        self.reopens = 0

    async def call(self, fn: Callable[[TimestampOracle], Awaitable[T]]) -> T:
        """`fn(oracle)` on the current oracle, reopening and retrying while it is fenced."""
        for _ in range(self._max_reopens):
            oracle = await self.current()
            try:
                return await fn(oracle)
            except LeadershipLost as exc:
                self._retire(oracle, exc)
                if self._take_over:
                    continue
                self._lost = LeadershipLost(
                    f"another process leads the legacy timeline {self.name!r}; the legacy "
                    "implementation serves one process per timeline, so several processes need "
                    "the distributed one (spec.implementation: distributed, or `tsoracle flip "
                    "--to distributed`); a new client may take it over")
                raise anew(self._lost) from None
            except Reprovisioned as exc:
                # Timestamps restarted: running the call again on the new deployment would
                # carry an old timestamp (an apply_write, say) into it. The next call reopens.
                self._retire(oracle, exc)
                raise
            except Fenced as exc:
                self._retire(oracle, exc)
            except OracleClosed:
                if self._shut:
                    raise
                # Retired (another caller saw Fenced) between our lookup and our call: nothing
                # was served by it. If it is still current, something else closed it: forget
                # it, so the next attempt opens a fresh one instead of retrying a dead oracle.
                if self._oracle is oracle:
                    self._oracle = None
                await asyncio.sleep(0)
        raise Fenced(f"the oracle for {self.name!r} kept moving during {self._max_reopens} "
                     "reopenings")

    async def current(self) -> TimestampOracle:
        """The oracle calls go to now, opened if there is none."""
        if self._shut:
            raise OracleClosed("this client is closed; make a new one")
        if self._lost is not None:
            if self._still_lost is None or await self._still_lost():
                raise anew(self._lost)  # each caller its own: see errors.anew
            self._lost = None  # flipped to distributed since: every process may serve
        if self._oracle is not None:
            return self._oracle
        # Single flight: concurrent first calls share one open (eight opens of a legacy
        # timeline would be eight leaders fencing each other).
        if self._opening is None:
            self._opening = asyncio.get_running_loop().create_task(self._open_active())
            self._opening.add_done_callback(lambda _t: setattr(self, "_opening", None))
        return await asyncio.shield(self._opening)

    async def _open_active(self) -> TimestampOracle:
        for attempt in range(self._max_reopens):
            try:
                self._oracle = await self._open()
                return self._oracle
            except Fenced:  # a flip landed between reading the deployment and opening
                await asyncio.sleep(0.01 * (attempt + 1))
        raise Fenced(f"could not open the oracle for {self.name!r}: it keeps flipping")

    def _retire(self, oracle: TimestampOracle, exc: Fenced) -> None:
        """Stop handing out a fenced oracle; close it once its calls in flight are done."""
        if self._oracle is not oracle:
            return
        self._oracle = None
        self.reopens += 1
        log.info("oracle for %s fenced (%s); reopening on the active implementation",
                 self.name, exc)
        task = asyncio.get_running_loop().create_task(oracle.close())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def write_ts(self) -> WriteTimestamp:
        return await self.call(lambda o: o.write_ts())

    async def peek_write_ts(self) -> int:
        return await self.call(lambda o: o.peek_write_ts())

    async def read_ts(self) -> int:
        return await self.call(lambda o: o.read_ts())

    async def apply_write(self, ts: int) -> None:
        await self.call(lambda o: o.apply_write(ts))

    async def confirm_leadership(self) -> None:
        await self.call(lambda o: o.confirm_leadership())

    async def close(self) -> None:
        self._shut = True
        if self._opening is not None:
            await asyncio.gather(self._opening, return_exceptions=True)
        oracle, self._oracle = self._oracle, None
        if oracle is not None:
            await oracle.close()
        await asyncio.gather(*self._retiring, return_exceptions=True)

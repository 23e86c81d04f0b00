"""Share one backend call among the callers that are waiting at the same moment."""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Coalescer(Generic[T]):
    """`await call()` returns the result of an `fn()` that started after this caller did.

    The first caller runs `fn` itself (no task hop at low concurrency). Callers that arrive while
    a call is in flight wait for the *next* call: the in-flight one may have read the backend
    before they started, so its answer is not theirs to take. Nothing is cached.
    """

    def __init__(
        self, fn: Callable[[], Awaitable[T]], on_batch: Callable[[int], None] | None = None
    ) -> None:
        self._fn = fn
        self._on_batch = on_batch
        self._waiting: list[asyncio.Future[T]] = []
        self._busy = False
        self._drainer: asyncio.Task[None] | None = None

    async def call(self) -> T:
        if self._busy:
            fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
            self._waiting.append(fut)
            return await fut
        self._busy = True
        try:
            if self._on_batch is not None:
                self._on_batch(1)
            return await self._fn()
        finally:
            self._hand_off()

    async def idle(self) -> None:
        """Wait until no call started here is still running (before its connection closes)."""
        drainer = self._drainer
        if drainer is not None and not drainer.done():
            await asyncio.wait({drainer})

    def _hand_off(self) -> None:
        if self._waiting:
            self._drainer = asyncio.get_running_loop().create_task(self._drain())
        else:
            self._busy = False

    async def _drain(self) -> None:
        batch: list[asyncio.Future[T]] = []
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                if self._on_batch is not None:
                    self._on_batch(len(batch))
                try:
                    value = await self._fn()
                except Exception as exc:
                    for fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                for fut in batch:
                    if not fut.done():
                        fut.set_result(value)
        finally:
            self._busy = False
            for fut in [*batch, *self._waiting]:  # only reached when cancelled mid-drain
                if not fut.done():
                    fut.cancel()
            self._waiting = []


MAX_PIPELINE_DEPTH = 16
MIN_SAMPLES = 4  # calls measured before pipelining starts (a cold first call is slow)
# Below this round trip (a loopback server) a batch costs more in this process's CPU than in
# waiting, so a second batch in flight would only split the callers: one batch at a time. The
# environment variable exists for tests, which pipeline at any round trip.
PIPELINE_FROM_RTT_ENV = "TSORACLE_PIPELINE_FROM_RTT_MS"


def default_pipeline_from_rtt_s() -> float:
    return float(os.environ.get(PIPELINE_FROM_RTT_ENV, "0.5")) / 1000


class Pipelined(Generic[T]):
    """Like `Coalescer`, with up to `len(fns)` shared calls in flight (one per `fn`).

    While calls are in flight, waiting callers are collected and sent as the next call once the
    newest one has been out for round trip ÷ depth, the round trip being the shortest of the
    last few calls. So a caller waits about that long plus one round trip, instead of the rest
    of the running call plus its own. The rule of `Coalescer` holds: a caller is answered only
    by a call that started after it began waiting.
    """

    def __init__(self, fns: list[Callable[[], Awaitable[T]]],
                 on_batch: Callable[[int], None] | None = None, *,
                 pipeline_from_rtt_s: float | None = None, samples: int = 256,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if not 1 <= len(fns) <= MAX_PIPELINE_DEPTH:
            raise ValueError(f"pipeline depth must be 1 to {MAX_PIPELINE_DEPTH}, got {len(fns)}")
        self._fns = fns
        self._on_batch = on_batch
        self._free = list(range(len(fns)))[::-1]  # the first connection is used most
        self._waiting: list[asyncio.Future[T]] = []
        self._running = 0
        self._last_start = 0.0
        # Under load, a call also waits for this process's event loop; the shortest of many
        # recent calls is the one that waited least, the nearest to the bare round trip.
        self._rtts: deque[float] = deque(maxlen=samples)
        self._gap_s: float | None = None  # kept up to date by _measured (once per call)
        self._rtt: float | None = None  # min(self._rtts)
        self._from_rtt = pipeline_from_rtt_s if pipeline_from_rtt_s is not None \
            else default_pipeline_from_rtt_s()
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # The tests pass their event loop's virtual clock: the gaps are then exact.
        self._clock = clock

    @property
    def depth(self) -> int:
        return len(self._fns)

    @property
    def rtt(self) -> float | None:
        """The shortest recent call, in seconds: the round trip without queueing here."""
        return self._rtt

    def _measured(self, seconds: float) -> None:
        rtts = self._rtts
        evicted = rtts[0] if len(rtts) == rtts.maxlen else None
        rtts.append(seconds)
        # The minimum, kept cheaply: rescanned only when the sample that held it leaves.
        if self._rtt is None or seconds <= self._rtt:
            self._rtt = seconds
        elif evicted is not None and evicted <= self._rtt:
            self._rtt = min(rtts)
        pipelining = len(rtts) >= MIN_SAMPLES and self._rtt >= self._from_rtt
        self._gap_s = self._rtt / len(self._fns) if pipelining else None

    def _gap(self) -> float | None:
        """How long the newest call must be out before the next starts; None: until it ends."""
        return self._gap_s

    async def call(self) -> T:
        loop = asyncio.get_running_loop()
        if self._running == 0 and not self._waiting:
            # Nothing in flight: run it here, without a task hop (the uncontended case).
            index = self._take()
            try:
                if self._on_batch is not None:
                    self._on_batch(1)
                started = self._clock()
                value = await self._fns[index]()
                self._measured(self._clock() - started)
                return value
            finally:
                self._give_back(index)
        fut: asyncio.Future[T] = loop.create_future()
        self._waiting.append(fut)
        self._launch()
        return await fut

    async def idle(self) -> None:
        """Wait until no call started here is still running (before its connection closes)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    def _take(self) -> int:
        self._running += 1
        self._last_start = self._clock()
        return self._free.pop()

    def _give_back(self, index: int) -> None:
        self._running -= 1
        self._free.append(index)
        self._launch()

    def _launch(self, due: bool = False) -> None:
        if not self._waiting or not self._free:
            return
        loop = asyncio.get_running_loop()
        if self._running and not due:
            gap = self._gap()
            if gap is None:
                return  # the running call's end launches the next
            wait = self._last_start + gap - self._clock()
            if wait > 0:
                if self._timer is None:
                    # Event loops wake in whole milliseconds (asyncio's epoll rounds up,
                    # uvloop's clock ticks by 1 ms): a shorter gap is served at the next tick.
                    self._timer = loop.call_later(max(wait, 0.001), self._on_timer)
                return
        batch, self._waiting = self._waiting, []
        index = self._take()
        task = loop.create_task(self._run(index, batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_timer(self) -> None:
        self._timer = None
        # The loop's clock may wake us a little early: go now rather than spin to its next tick.
        self._launch(due=True)

    async def _run(self, index: int, batch: list[asyncio.Future[T]]) -> None:
        try:
            while True:
                await self._answer(index, batch)
                # Not pipelining (a fast backend): the callers that gathered meanwhile go next,
                # from this task, as `Coalescer` does: no task hop, no timer.
                if not self._waiting or self._gap() is not None:
                    return
                batch, self._waiting = self._waiting, []
                self._last_start = self._clock()
        finally:
            self._give_back(index)

    async def _answer(self, index: int, batch: list[asyncio.Future[T]]) -> None:
        try:
            if self._on_batch is not None:
                self._on_batch(len(batch))
            started = self._clock()
            value = await self._fns[index]()
            self._measured(self._clock() - started)
        except Exception as exc:
            for fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
        except BaseException:
            for fut in [*batch, *self._waiting]:  # cancelled: no answer rather than a stale one
                fut.cancel()
            self._waiting = []
            raise
        else:
            for fut in batch:
                if not fut.done():
                    fut.set_result(value)

def shared_calls(fns: list[Callable[[], Awaitable[T]]],
                 on_batch: Callable[[int], None] | None = None) -> Coalescer[T] | Pipelined[T]:
    """One call in flight for a single `fn` (the proven path), else a pipeline of them."""
    if len(fns) == 1:
        return Coalescer(fns[0], on_batch)
    return Pipelined(fns, on_batch)

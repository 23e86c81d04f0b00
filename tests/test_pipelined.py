"""coalesce.Pipelined: several shared calls in flight, each answering only later callers.

The "backend" here is an asyncio function with a fixed delay, on an event loop whose clock is
virtual (it jumps to the next timer whenever nothing is ready): these tests check the
scheduling rules, and time is their subject, so every gap and count is exact on any machine.
The same class runs against PostgreSQL in every conformance, history and lincheck test
(tests/conftest.py turns pipelining on) and in the last test here.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from tsoracle.coalesce import MIN_SAMPLES, Coalescer, Pipelined, shared_calls


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when nothing is ready: straight to the next timer.
    These tests do no I/O, so the selector is only ever polled."""

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0

    def time(self) -> float:
        return self._now

    def _run_once(self) -> None:
        scheduled = self._scheduled  # type: ignore[attr-defined]
        if not self._ready and scheduled:  # type: ignore[attr-defined]
            self._now = max(self._now, scheduled[0].when())
        super()._run_once()  # type: ignore[misc]


def virtual_time(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """Run an async test on a VirtualTimeLoop (pytest-asyncio would give it a real one)."""
    @functools.wraps(test)
    def run() -> None:
        with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
            runner.run(test())
    return run


def test_the_virtual_clock_moves_only_by_timers() -> None:
    async def body() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.gather(asyncio.sleep(0.25), asyncio.sleep(0.1))
        return t0, loop.time()

    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        assert runner.run(body()) == (0.0, 0.25)


class Backend:
    """Answers with the number of calls started so far; `delay` seconds per call."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.started = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self.starts: list[float] = []
        self.fail_next = False

    async def call(self, conn: int) -> int:
        self.started += 1
        value = self.started
        self.starts.append(asyncio.get_running_loop().time())
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            if self.fail_next:
                self.fail_next = False
                raise RuntimeError("the backend refused")
            return value
        finally:
            self.in_flight -= 1


def pipeline(backend: Backend, depth: int, **kwargs: float) -> Pipelined[int]:
    return Pipelined([lambda c=c: backend.call(c) for c in range(depth)],
                     pipeline_from_rtt_s=kwargs.get("from_rtt", 0.0),
                     clock=asyncio.get_running_loop().time)


async def warm(p: Pipelined[int]) -> None:
    """Enough calls measured for the pipeline to know the round trip (MIN_SAMPLES)."""
    for _ in range(MIN_SAMPLES):
        await p.call()


@virtual_time
async def test_every_answer_comes_from_a_call_started_after_the_caller() -> None:
    backend = Backend(delay=0.004)
    p = pipeline(backend, 4)
    await warm(p)

    async def caller() -> None:
        await asyncio.sleep(0.0005 * (id(asyncio.current_task()) % 20))
        began = backend.started  # calls started before this caller waited
        answer = await p.call()
        assert answer > began  # a call that started earlier would have answered <= began

    await asyncio.gather(*[caller() for _ in range(300)])
    assert backend.most_in_flight > 1  # the rule held with calls overlapping


@virtual_time
async def test_in_flight_is_bounded_by_the_depth_and_spread_over_a_round_trip() -> None:
    backend = Backend(delay=0.02)
    p = pipeline(backend, 4)
    await warm(p)
    stop = asyncio.get_running_loop().time() + 0.3

    async def caller() -> None:
        while asyncio.get_running_loop().time() < stop:
            await p.call()

    backend.starts.clear()
    await asyncio.gather(*[caller() for _ in range(64)])
    assert backend.most_in_flight == 4
    gaps = [b - a for a, b in zip(backend.starts, backend.starts[1:], strict=False)]
    # Calls start round trip / depth apart (5 ms), never closer (the clock is exact here).
    assert min(gaps) >= 0.02 / 4 - 1e-9
    assert len(backend.starts) <= 0.3 / 0.005 + 4


@virtual_time
async def test_below_the_threshold_one_call_at_a_time() -> None:
    backend = Backend(delay=0.002)
    p = pipeline(backend, 4, from_rtt=0.01)  # 2 ms is "loopback" for this pipeline

    await asyncio.gather(*[p.call() for _ in range(200)])
    assert backend.most_in_flight == 1
    assert p.rtt is not None and p.rtt >= 0.002


@virtual_time
async def test_an_error_reaches_exactly_its_batch() -> None:
    backend = Backend(delay=0.005)
    p = pipeline(backend, 2)
    await warm(p)
    first = [asyncio.ensure_future(p.call()) for _ in range(10)]  # the first runs inline
    await asyncio.sleep(0)
    backend.fail_next = True  # the call now starting (the rest of the first ten) fails
    results = await asyncio.gather(*first, return_exceptions=True)
    assert any(isinstance(r, RuntimeError) for r in results)
    assert await p.call() > 0  # the pipeline goes on


@virtual_time
async def test_a_cancelled_caller_does_not_hold_up_the_others() -> None:
    backend = Backend(delay=0.01)
    p = pipeline(backend, 3)
    await warm(p)
    tasks = [asyncio.ensure_future(p.call()) for _ in range(30)]
    await asyncio.sleep(0.001)
    tasks[5].cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(done[5], asyncio.CancelledError)
    assert all(isinstance(r, int) for i, r in enumerate(done) if i != 5)
    await p.idle()
    assert backend.in_flight == 0


@virtual_time
async def test_a_failing_batch_hook_fails_its_callers_and_frees_the_slot() -> None:
    """Review finding: the hook ran before the call's try, so its callers were never answered."""
    backend = Backend(delay=0.002)
    calls = 0

    def hook(n: int) -> None:
        nonlocal calls
        calls += 1
        if calls == 6:
            raise ValueError("metrics broke")

    p = Pipelined([lambda c=c: backend.call(c) for c in range(4)], hook,
                  pipeline_from_rtt_s=0.0, clock=asyncio.get_running_loop().time)
    await warm(p)
    results = await asyncio.wait_for(
        asyncio.gather(*[p.call() for _ in range(40)], return_exceptions=True), 5)
    assert any(isinstance(r, ValueError) for r in results)
    assert all(isinstance(r, (int, ValueError)) for r in results)
    await p.idle()
    assert await p.call() > 0


def test_one_connection_keeps_the_proven_coalescer() -> None:
    async def fn() -> int:
        return 1

    assert isinstance(shared_calls([fn]), Coalescer)
    assert isinstance(shared_calls([fn, fn]), Pipelined)
    with pytest.raises(ValueError, match="pipeline depth must be 1 to 16"):
        Pipelined([fn] * 17)


async def test_pipelined_reads_on_a_distant_postgresql_keep_the_contract(pg) -> None:
    """Real PostgreSQL 5 ms away (tsoracle/latency.py): several read batches overlap, and every
    read_ts is at least every write applied before the read began. Sized by what was seen
    (reads, applied writes, overlapping batches), not by time: a slow machine runs longer."""
    import time

    import tsoracle
    from tsoracle.latency import relayed

    url = f"{pg.url()}?schema=t_pipelined"
    await tsoracle.init(url, timelines=["counter:p"])
    with relayed(url, 5.0) as far:
        async with tsoracle.connect(far, timeline="counter:p", pipeline_depth=8) as oracle:
            applied: list[tuple[float, int]] = []  # (when apply_write returned, ts)
            reads: list[tuple[float, int]] = []  # (when read_ts was called, answer)
            most = 0

            def enough() -> bool:
                return most > 1 and len(applied) > 10 and len(reads) > 1000

            async def writer() -> None:
                while not enough():
                    w = await oracle.write_ts()
                    await oracle.apply_write(w.timestamp)
                    applied.append((time.monotonic(), w.timestamp))

            async def reader() -> None:
                while not enough():
                    began = time.monotonic()
                    reads.append((began, await oracle.read_ts()))

            async def watch() -> None:
                nonlocal most
                while not enough():
                    most = max(most, oracle._reads._running)  # white box: batches in flight
                    await asyncio.sleep(0.0005)

            # The cap only catches a hang (a few seconds on an idle machine).
            try:
                await asyncio.wait_for(asyncio.gather(writer(), *[reader() for _ in range(64)],
                                                      watch()), 120)
            except TimeoutError:
                pytest.fail(f"in 120 s: at most {most} read batches in flight (2 needed), "
                            f"{len(applied)} writes applied, {len(reads)} reads")
    for began, answer in reads:
        before = [ts for done, ts in applied if done < began]
        assert answer >= max(before, default=0)

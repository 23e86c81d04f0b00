"""coalesce.Pipelined: several shared calls in flight, each answering only later callers.

The "backend" here is an asyncio function with a fixed delay: these tests check the scheduling
rules, which no real server could make deterministic. The same class runs against PostgreSQL in
every conformance, history and lincheck test (tests/conftest.py turns pipelining on).
"""

from __future__ import annotations

import asyncio

import pytest

from tsoracle.coalesce import MIN_SAMPLES, Coalescer, Pipelined, shared_calls


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
                     pipeline_from_rtt_s=kwargs.get("from_rtt", 0.0))


async def warm(p: Pipelined[int]) -> None:
    """Enough calls measured for the pipeline to know the round trip (MIN_SAMPLES)."""
    for _ in range(MIN_SAMPLES):
        await p.call()


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
    # Calls start about round trip / depth apart (5 ms), never back to back.
    assert min(gaps) >= 0.02 / 4 * 0.9
    assert len(backend.starts) <= 0.3 / 0.005 + 4


async def test_below_the_threshold_one_call_at_a_time() -> None:
    backend = Backend(delay=0.002)
    p = pipeline(backend, 4, from_rtt=0.01)  # 2 ms is "loopback" for this pipeline

    await asyncio.gather(*[p.call() for _ in range(200)])
    assert backend.most_in_flight == 1
    assert p.rtt is not None and p.rtt >= 0.002


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
                  pipeline_from_rtt_s=0.0)
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
    read_ts is at least every write applied before the read began."""
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
            stop = time.monotonic() + 3

            async def writer() -> None:
                while time.monotonic() < stop:
                    w = await oracle.write_ts()
                    await oracle.apply_write(w.timestamp)
                    applied.append((time.monotonic(), w.timestamp))

            async def reader() -> None:
                while time.monotonic() < stop:
                    began = time.monotonic()
                    reads.append((began, await oracle.read_ts()))

            async def watch() -> None:
                nonlocal most
                while time.monotonic() < stop:
                    most = max(most, oracle._reads._running)  # white box: batches in flight
                    await asyncio.sleep(0.0005)

            await asyncio.gather(writer(), *[reader() for _ in range(64)], watch())
    assert most > 1, "the reads never had two batches in flight"
    assert len(applied) > 10 and len(reads) > 1000
    for began, answer in reads:
        before = [ts for done, ts in applied if done < began]
        assert answer >= max(before, default=0)

"""Closing an oracle while other tasks still use it, which is what reopen-on-fence does."""

from __future__ import annotations

import asyncio

import tsoracle
from tsoracle.store import RetryPolicy


async def _hammer(oracle: tsoracle.TimestampOracle, done: list[int]) -> BaseException:
    try:
        while True:
            w = await oracle.write_ts()
            await oracle.apply_write(w.timestamp)
            await oracle.read_ts()
            done.append(1)
    except tsoracle.OracleError as exc:
        return exc


async def test_close_under_load_fails_callers_fast_and_cleanly(url, impl):
    # Before the fix, close() handed pinned connections back to the pool under running
    # statements, and every caller of the closed oracle retried "pool closed" as a connection
    # fault until the retry budget ran out (OracleUnavailable "still failing after N attempts").
    await tsoracle.init(url, timelines=["counter:c"], implementation=impl)
    policy = RetryPolicy(timeout=30.0)
    async with asyncio.timeout(300):  # only a hang reaches this
        for _ in range(5):
            old = await tsoracle.open_oracle(url, timeline="counter:c", implementation=impl,
                                             retry=policy)
            done: list[int] = []
            tasks = [asyncio.create_task(_hammer(old, done)) for _ in range(16)]
            while len(done) < 50:
                await asyncio.sleep(0.001)
            await old.close()
            ended = await asyncio.gather(*tasks)
            assert all(type(e) is tsoracle.OracleClosed for e in ended), ended
            assert "open a new one" in str(ended[0])
            async with tsoracle.connect(url, timeline="counter:c", implementation=impl,
                                        retry=policy) as new:
                last = 0
                for _ in range(20):
                    w = (await new.write_ts()).timestamp
                    assert w > last
                    await new.apply_write(w)
                    assert await new.read_ts() >= w
                    last = w


async def test_a_closed_oracle_says_so(sqlite_url):
    await tsoracle.init(sqlite_url)
    oracle = await tsoracle.open_oracle(sqlite_url)
    await oracle.close()
    await oracle.close()  # twice is fine
    try:
        await oracle.read_ts()
    except tsoracle.OracleClosed as exc:
        assert "tsoracle.connect" in str(exc)
    else:
        raise AssertionError("read_ts on a closed oracle answered")


async def _blocked_write(pg, url: str, policy: RetryPolicy):
    """An oracle whose write_ts is stuck on a row lock another session holds."""
    import psycopg

    await tsoracle.init(url, timelines=["counter:c"])
    oracle = await tsoracle.open_oracle(url, timeline="counter:c", retry=policy)
    await oracle.write_ts()
    locker = await psycopg.AsyncConnection.connect(pg.url().split("?")[0])
    await locker.execute("BEGIN")
    schema = url.split("schema=")[1]
    await locker.execute(f'SELECT * FROM "{schema}".timestamps FOR UPDATE')
    stuck = asyncio.create_task(oracle.write_ts())
    async with asyncio.timeout(60):
        while not stuck.done() and oracle._inflight == 0:
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    assert not stuck.done(), "the write should wait for the lock"
    return oracle, locker, stuck


async def test_close_does_not_wait_forever_for_a_stuck_statement(pg, pg_url):
    # Review finding: close() waited without limit for an operation stuck on a row lock.
    oracle, locker, stuck = await _blocked_write(pg, pg_url, RetryPolicy(timeout=1.0))
    try:
        async with asyncio.timeout(120):  # only a hang reaches this
            await oracle.close()  # returns after the retry budget + grace, lock still held
        assert oracle.backend.pool is None
        assert not stuck.done()
    finally:
        await locker.execute("ROLLBACK")
        await locker.close()
    async with asyncio.timeout(120):
        outcome = await asyncio.gather(stuck, return_exceptions=True)
    assert isinstance(outcome[0], tsoracle.WriteTimestamp | tsoracle.OracleError), outcome


async def test_a_cancelled_close_still_releases_everything(pg, pg_url):
    oracle, locker, stuck = await _blocked_write(pg, pg_url, RetryPolicy(timeout=30.0))
    closing = asyncio.create_task(oracle.close())
    await asyncio.sleep(0.1)
    closing.cancel()
    await asyncio.gather(closing, return_exceptions=True)
    await locker.execute("ROLLBACK")  # the stuck write finishes; the shutdown goes on
    await locker.close()
    async with asyncio.timeout(120):
        await stuck
        await oracle.close()  # a second call joins the same shutdown
    assert oracle.backend.pool is None

"""The oracle contract (docs/design.md, "What an oracle promises"), run against every
implementation and backend."""

from __future__ import annotations

import asyncio

import pytest

import tsoracle
from tests.support.clock import FakeClock
from tsoracle.oracle.metrics import FAILED
from tsoracle.store import U64_MAX

pytestmark = pytest.mark.serializable  # CockroachDB's isolation too (conftest.py)

COUNTER = "counter:orders"


async def setup(url: str, impl: str, timelines=(COUNTER,), initial_ts: int = 0) -> None:
    await tsoracle.init(url, timelines=list(timelines), implementation=impl,
                        initial_ts=initial_ts)


async def test_initial_state_at_zero(url, impl):
    await setup(url, impl)
    async with tsoracle.connect(url, timeline=COUNTER, implementation=impl) as o:
        assert await o.read_ts() == 0
        assert await o.peek_write_ts() == 0
        w = await o.write_ts()
        assert w == tsoracle.WriteTimestamp(1, 2)
        assert await o.peek_write_ts() == 1
        assert await o.read_ts() == 0


async def test_near_the_maximum_value(url, impl):
    await setup(url, impl, initial_ts=U64_MAX - 3)
    async with tsoracle.connect(url, timeline=COUNTER, implementation=impl) as o:
        assert await o.read_ts() == U64_MAX - 3
        got = [(await o.write_ts()).timestamp for _ in range(3)]
        assert got == [U64_MAX - 2, U64_MAX - 1, U64_MAX]
        await o.apply_write(U64_MAX)
        assert await o.read_ts() == U64_MAX
        with pytest.raises(tsoracle.TimestampExhausted):
            await o.write_ts()
        assert await o.peek_write_ts() == U64_MAX


async def test_repeated_peeks_do_not_advance(url, impl):
    await setup(url, impl)
    async with tsoracle.connect(url, timeline=COUNTER, implementation=impl) as o:
        w = (await o.write_ts()).timestamp
        assert [await o.peek_write_ts() for _ in range(5)] == [w] * 5
        assert (await o.write_ts()).timestamp == w + 1


async def test_write_ts_exceeds_all_previous_reads_and_writes(url, impl):
    await setup(url, impl)
    async with tsoracle.connect(url, timeline=COUNTER, implementation=impl) as o:
        seen = 0
        for i in range(50):
            w = (await o.write_ts()).timestamp
            assert w > seen
            if i % 3 == 0:
                await o.apply_write(w)
            seen = max(seen, w, await o.read_ts())


async def test_apply_write_below_between_and_above(url, impl):
    await setup(url, impl)
    async with tsoracle.connect(url, timeline=COUNTER, implementation=impl) as o:
        for _ in range(10):
            await o.write_ts()
        await o.apply_write(4)  # between read_ts (0) and write_ts (10)
        assert await o.read_ts() == 4
        assert await o.peek_write_ts() == 10
        await o.apply_write(2)  # below read_ts: nothing moves back
        assert await o.read_ts() == 4
        assert await o.peek_write_ts() == 10
        await o.apply_write(25)  # above write_ts: both move up
        assert await o.read_ts() == 25
        assert await o.peek_write_ts() == 25
        assert (await o.write_ts()).timestamp == 26


async def test_read_never_passes_an_unapplied_write(url, impl):
    await setup(url, impl)
    async with tsoracle.connect(url, timeline=COUNTER, implementation=impl) as o:
        pending = (await o.write_ts()).timestamp
        later = (await o.write_ts()).timestamp
        await o.apply_write(pending)
        assert await o.read_ts() == pending < later
        await o.apply_write(later)
        assert await o.read_ts() == later


async def test_epoch_milliseconds_tracks_the_wall_clock(url, impl):
    clock = FakeClock(5_000)
    await setup(url, impl, timelines=["EpochMilliseconds"])
    async with tsoracle.connect(url, implementation=impl, now=clock) as o:
        assert (await o.write_ts()).timestamp == 5_000
        assert (await o.write_ts()).timestamp == 5_001  # clock did not move: count on
        clock.ms = 9_000
        assert (await o.write_ts()).timestamp == 9_000
        clock.ms = 8_000  # clock stepped back: never go backwards
        assert (await o.write_ts()).timestamp == 9_001


async def test_clock_skew_guard_refuses_far_future_write(url, impl):
    clock = FakeClock(10_000)
    await setup(url, impl, timelines=["EpochMilliseconds"])
    fast = FakeClock(50_000)  # some writer ran with a clock far ahead
    async with tsoracle.connect(url, implementation=impl, now=fast) as o:
        await o.apply_write(50_000)
    async with tsoracle.connect(url, implementation=impl, now=clock,
                                max_clock_skew_ms=1_000) as o:
        with pytest.raises(tsoracle.ClockSkew, match="ahead of"):
            await o.write_ts()
        clock.ms = 50_500  # (a new legacy leader resumes above the fast one's window)
        assert (await o.write_ts()).timestamp > 50_000


async def test_apply_write_refuses_a_far_future_timestamp(url, impl):
    # Before the fix, `tsoracle ts apply 10000000000000` was accepted on EpochMilliseconds and
    # every write_ts after it failed with ClockSkew until the wall clock caught up.
    clock = FakeClock(10_000)
    await setup(url, impl, timelines=["EpochMilliseconds"])
    async with tsoracle.connect(url, implementation=impl, now=clock,
                                max_clock_skew_ms=1_000) as o:
        counted = FAILED.total(operation="apply_write", error="ClockSkew")
        with pytest.raises(tsoracle.ClockSkew, match="apply only timestamps"):
            await o.apply_write(10_000_000_000_000)
        # Counted where an operator looks (it was not: the check ran before the counting).
        assert FAILED.total(operation="apply_write", error="ClockSkew") == counted + 1
        await o.apply_write(10_900)  # within the bound: fine
        assert (await o.write_ts()).timestamp == 10_901
        assert await o.read_ts() == 10_900


async def test_no_timestamp_reused_after_restart(url, impl):
    await setup(url, impl)
    handed = []
    async with tsoracle.connect(url, timeline=COUNTER, implementation=impl) as o:
        for _ in range(5):
            handed.append((await o.write_ts()).timestamp)
        handed.append(await o.read_ts())
    async with tsoracle.connect(url, timeline=COUNTER, implementation=impl) as o:
        assert (await o.write_ts()).timestamp > max(handed)


async def test_concurrent_writers_get_unique_increasing_timestamps(url, impl):
    await setup(url, impl)
    async with tsoracle.connect(url, timeline=COUNTER, implementation=impl) as o:
        got = await asyncio.gather(*[o.write_ts() for _ in range(200)])
        values = [w.timestamp for w in got]
        assert len(set(values)) == 200
        assert await o.peek_write_ts() == max(values)


async def test_flip_fences_processes_on_the_old_epoch(url, impl):
    other = "legacy" if impl == "distributed" else "distributed"
    await setup(url, impl)
    async with tsoracle.connect(url, timeline=COUNTER, implementation=impl) as o:
        top = (await o.write_ts()).timestamp
        result = await tsoracle.flip(url, to=other)
        assert result.changed and result.epoch == o.epoch + 1
        assert result.bootstrap[COUNTER] >= top
        with pytest.raises(tsoracle.Fenced, match="reopen"):
            await o.read_ts()
        with pytest.raises(tsoracle.Fenced):
            await o.confirm_leadership()
    async with tsoracle.connect(url, timeline=COUNTER, implementation=None) as o:
        assert o.implementation == other
        assert (await o.write_ts()).timestamp > top


async def test_flip_is_idempotent_on_the_target(url, impl):
    await setup(url, impl)
    first = await tsoracle.flip(url, to=impl)
    assert not first.changed
    again = await tsoracle.flip(url, to=impl)
    assert again.epoch == first.epoch


async def test_read_only_refuses_writes(url):
    await setup(url, "distributed")
    async with tsoracle.connect(url, timeline=COUNTER, read_only=True) as o:
        assert await o.read_ts() == 0
        with pytest.raises(tsoracle.ReadOnly):
            await o.write_ts()
        with pytest.raises(tsoracle.ReadOnly):
            await o.apply_write(3)


async def test_sync_facade_matches_async(url, impl):
    await setup(url, impl)
    with tsoracle.connect_sync(url, timeline=COUNTER, implementation=impl) as o:
        w = o.write_ts()
        assert w.timestamp == 1
        o.apply_write(w.timestamp)
        assert o.read_ts() == 1
        assert o.peek_write_ts() == 1
        o.confirm_leadership()


async def test_group_commit_shares_one_write_ts(url, impl):
    await setup(url, impl)
    appended: list[tuple[int, list[int]]] = []

    async def append(ts: int, payloads: list[int]) -> None:
        await asyncio.sleep(0.01)
        appended.append((ts, payloads))

    async with tsoracle.connect(url, timeline=COUNTER, implementation=impl) as o:
        committer = tsoracle.GroupCommitter(o, append)
        stamps = await asyncio.gather(*[committer.commit(i) for i in range(64)])
        assert sorted(p for _, ps in appended for p in ps) == list(range(64))
        assert len(appended) < 64 // 4  # writers shared groups
        for ts, payloads in appended:
            assert all(stamps[p] == ts for p in payloads)
        assert await o.read_ts() == max(stamps)

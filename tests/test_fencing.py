"""Fencing: the stale-leader anomaly of seed 000, flips under load, fencing modes."""

from __future__ import annotations

import asyncio
import time

import pytest
from history import check, load
from support.workload import Workload

import tsoracle

COUNTER = "counter:fence"


async def test_stale_leader_anomaly_without_the_epoch_check(url):
    """Step by step, with the old leader's epoch check switched off: it serves a stale read."""
    await tsoracle.init(url, timelines=[COUNTER], implementation="legacy")
    # 1. The old leader reserves a window [.., t1] and serves from memory.
    old = await tsoracle.open_oracle(url, timeline=COUNTER, implementation="legacy",
                                     fencing="Disabled")
    t1 = old._upper  # its reserved window's top
    assert await old.read_ts() == 0
    # 2. A new leader starts and reserves its own window above t1.
    new = await tsoracle.open_oracle(url, timeline=COUNTER, implementation="legacy")
    # 3. A write above t1 happens and completes through the new leader.
    w = (await new.write_ts()).timestamp
    assert w > t1
    await new.apply_write(w)
    # 4. The old leader, not checking its epoch, answers a read below that completed write.
    stale = await old.read_ts()
    assert stale < w, "without the epoch check the old leader serves a stale read"
    await old.close()
    await new.close()


async def test_stale_leader_is_fenced_by_the_storage(url):
    """The same steps with the epoch check on: the old leader gets Fenced, not a stale value."""
    await tsoracle.init(url, timelines=[COUNTER], implementation="legacy")
    old = await tsoracle.open_oracle(url, timeline=COUNTER, implementation="legacy")
    assert await old.read_ts() == 0
    new = await tsoracle.open_oracle(url, timeline=COUNTER, implementation="legacy")
    w = (await new.write_ts()).timestamp
    await new.apply_write(w)
    with pytest.raises(tsoracle.Fenced, match="newer legacy leader"):
        await old.read_ts()
    with pytest.raises(tsoracle.Fenced):  # and it stays fenced, without asking again
        await old.write_ts()
    assert await new.read_ts() == w
    await old.close()
    await new.close()


async def test_window_reservation_of_a_stale_leader_is_refused(url):
    await tsoracle.init(url, timelines=[COUNTER], implementation="legacy")
    old = await tsoracle.open_oracle(url, timeline=COUNTER, implementation="legacy",
                                     fencing="Disabled", window=5)
    new = await tsoracle.open_oracle(url, timeline=COUNTER, implementation="legacy", window=5)
    with pytest.raises(tsoracle.Fenced):
        for _ in range(20):  # runs past its 5-wide window: the reservation must fail
            await old.write_ts()
    await old.close()
    await new.close()


async def test_concurrent_confirms_share_one_backend_query(url):
    await tsoracle.init(url, timelines=[COUNTER], implementation="legacy")
    async with tsoracle.connect(url, timeline=COUNTER, implementation="legacy") as o:
        counted = o._queries
        await o.read_ts()
        before = counted["confirm_leadership"].value
        await asyncio.gather(*[o.read_ts() for _ in range(200)])
        used = counted["confirm_leadership"].value - before
        assert 1 <= used <= 10


async def test_rollout_mode_fences_only_during_the_rollout(url):
    await tsoracle.init(url, timelines=[COUNTER], fencing="Rollout")
    a = await tsoracle.open_oracle(url, timeline=COUNTER)
    await a.write_ts()
    await tsoracle.flip(url, to="legacy")
    with pytest.raises(tsoracle.Fenced):  # on the inactive implementation
        await a.read_ts()
    result = await tsoracle.flip(url, to="distributed")
    assert result.epoch == a.epoch + 2
    with pytest.raises(tsoracle.Fenced):  # active again, but the rollout is in progress
        await a.read_ts()
    dep = await tsoracle.finish_rollout(url)
    assert not dep.rollout
    assert await a.read_ts() >= 1  # old epoch, active implementation, rollout over: allowed
    await tsoracle.set_fencing(url, "Always")
    with pytest.raises(tsoracle.Fenced):
        await a.read_ts()
    await a.close()


async def test_flip_under_concurrent_load(url, tmp_path):
    """legacy -> distributed -> legacy while two processes allocate and read."""
    await tsoracle.init(url, timelines=[COUNTER], implementation="legacy")
    workers = [Workload(url, tmp_path / f"h{i}.jsonl", concurrency=16, timeline=COUNTER)
               for i in range(2)]
    flips = []
    epoch = (await tsoracle.status(url)).deployment.epoch
    for n, target in enumerate(("distributed", "legacy", "distributed", "legacy"), start=1):
        for w in workers:  # both serve (or were fenced and reopened) between flips
            await asyncio.to_thread(w.wait_for_ops, 100 * n)
        started = time.monotonic_ns()
        result = await tsoracle.flip(url, to=target)
        assert result.changed and result.epoch == epoch + 1
        epoch = result.epoch
        flips.append((started, result.bootstrap[COUNTER]))
    for w in workers:
        await asyncio.to_thread(w.wait_for_ops, 100 * 5)
    fenced = sum(w.finish()["fenced"] for w in workers)
    ops = load(w.out for w in workers)
    assert fenced >= 2  # processes on the old implementation were told so
    assert len(ops) >= 2 * 500
    assert check(ops) == []
    for started, bootstrap in flips:
        before = [o.value for o in ops if o.end < started]
        assert not before or bootstrap >= max(before)

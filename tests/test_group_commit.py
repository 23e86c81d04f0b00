"""GroupCommitter on a real oracle (SQLite): every caller of a group gets an outcome, whatever
stops the group, and the committer goes on serving later groups."""

from __future__ import annotations

import asyncio

import pytest

import tsoracle
from tsoracle.oracle.group_commit import CommitInterrupted, Conflict, GroupCommitter

COUNTER = "counter:orders"
HANG_GUARD_S = 30.0  # only there so that a hang fails the test instead of the run


async def _cancelled_task() -> None:
    """Await a task that gets cancelled: raises CancelledError in the awaiting task, as when
    an append waits on work someone else cancelled."""
    task = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
    asyncio.get_running_loop().call_soon(task.cancel)
    await task


async def test_an_append_that_raises_cancelled_error_fails_its_group_and_not_the_next(sqlite_url):
    # Before the fix the CancelledError left `_run` (it catches Exception), killing the worker:
    # the three callers waited forever (the hang guard's TimeoutError).
    await tsoracle.init(sqlite_url, timelines=[COUNTER])
    appended: list[tuple[int, list[int]]] = []
    calls = 0

    async def append(ts: int, payloads: list[int]) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            await _cancelled_task()
        appended.append((ts, payloads))

    async with tsoracle.connect(sqlite_url, timeline=COUNTER) as oracle:
        committer: GroupCommitter[int] = GroupCommitter(oracle, append)
        outcomes = await asyncio.wait_for(
            asyncio.gather(*[committer.commit(i) for i in range(3)], return_exceptions=True),
            HANG_GUARD_S)
        assert all(isinstance(o, CommitInterrupted) for o in outcomes), outcomes
        first = outcomes[0]
        assert isinstance(first, tsoracle.OracleError)
        assert first.stage == "append" and first.ts is not None
        assert f"at {first.ts}" in str(first) and "unknown" in str(first)
        assert await oracle.read_ts() < first.ts  # the interrupted group was not applied

        later = await asyncio.wait_for(committer.commit(7), HANG_GUARD_S)
        assert later > first.ts
        assert appended == [(later, [7])]
        assert await oracle.read_ts() >= later


async def test_an_interrupted_apply_says_the_payloads_were_appended(sqlite_url):
    await tsoracle.init(sqlite_url, timelines=[COUNTER])
    appended: list[int] = []

    async with tsoracle.connect(sqlite_url, timeline=COUNTER) as oracle:
        class Interrupting:
            """The real oracle, whose first apply_write awaits a cancelled task."""

            applies = 0

            async def write_ts(self) -> tsoracle.WriteTimestamp:
                return await oracle.write_ts()

            async def apply_write(self, ts: int) -> None:
                self.applies += 1
                if self.applies == 1:
                    await _cancelled_task()
                await oracle.apply_write(ts)

        async def append(ts: int, payloads: list[str]) -> None:
            appended.append(ts)

        committer: GroupCommitter[str] = GroupCommitter(Interrupting(), append)
        with pytest.raises(CommitInterrupted) as err:
            await asyncio.wait_for(committer.commit("a"), HANG_GUARD_S)
        assert err.value.stage == "apply" and err.value.ts == appended[0]
        assert "were appended" in str(err.value) and f"apply_write({appended[0]})" in str(err.value)
        later = await asyncio.wait_for(committer.commit("b"), HANG_GUARD_S)
        assert later > appended[0] and await oracle.read_ts() >= later


async def test_a_cancelled_worker_leaves_no_caller_waiting(sqlite_url):
    # Before the fix, cancelling the worker task (as a shutdown that cancels every task does)
    # left the group's callers, and the callers queued behind it, waiting forever.
    await tsoracle.init(sqlite_url, timelines=[COUNTER])
    entered = asyncio.Event()
    release = asyncio.Event()

    async def append(ts: int, payloads: list[int]) -> None:
        entered.set()
        await release.wait()

    async with tsoracle.connect(sqlite_url, timeline=COUNTER) as oracle:
        committer: GroupCommitter[int] = GroupCommitter(oracle, append)
        loop = asyncio.get_running_loop()
        in_group = [loop.create_task(committer.commit(i)) for i in range(2)]
        await asyncio.wait_for(entered.wait(), HANG_GUARD_S)
        queued = [loop.create_task(committer.commit(i)) for i in range(2, 4)]
        await asyncio.sleep(0)  # the queued callers are in the queue, behind the group
        worker = committer._groups._task  # no public handle: the test plays a shutdown
        assert worker is not None
        worker.cancel()
        done, pending = await asyncio.wait([*in_group, *queued], timeout=HANG_GUARD_S)
        assert not pending
        for task in in_group:
            exc = task.exception()
            assert isinstance(exc, CommitInterrupted) and exc.stage == "append", exc
        for task in queued:
            exc = task.exception()
            assert isinstance(exc, CommitInterrupted) and exc.stage == "queued", exc
            assert "nothing was appended" in str(exc)
        assert worker.cancelled()

        release.set()
        later = await asyncio.wait_for(committer.commit(9), HANG_GUARD_S)
        assert await oracle.read_ts() >= later


@pytest.mark.parametrize("impl", ["legacy", "distributed"])
async def test_a_group_fenced_between_append_and_apply_lands_at_the_next_applied_write(
        sqlite_url, impl):
    # What README.md says of the two-argument form: a failed apply_write fails the callers,
    # but the appended rows stay at their timestamp, invisible until any later write above it
    # is applied, and then visible. A commit that raised may still land.
    await tsoracle.init(sqlite_url, timelines=[COUNTER], implementation=impl)
    rows: dict[int, list[str]] = {}  # the application's table, keyed by timestamp
    opened: list[tsoracle.TimestampOracle] = []

    def visible(read_ts: int) -> list[str]:
        return sorted(p for ts, ps in rows.items() if ts <= read_ts for p in ps)

    async def append(ts: int, payloads: list[str]) -> None:
        rows[ts] = list(payloads)
        # Between this append and its apply, another process takes over the timeline: a
        # newer legacy leader, or a flip away from distributed.
        if impl == "distributed":
            await tsoracle.flip(sqlite_url, to="legacy")
        opened.append(await tsoracle.open_oracle(sqlite_url, timeline=COUNTER,
                                                 implementation="legacy"))

    try:
        async with tsoracle.connect(sqlite_url, timeline=COUNTER, implementation=impl) as first:
            committer: GroupCommitter[str] = GroupCommitter(first, append)
            with pytest.raises(tsoracle.Fenced):  # LeadershipLost, or Fenced by the flip
                await asyncio.wait_for(committer.commit("refused"), HANG_GUARD_S)
        (lost_at,) = rows
        successor = opened[0]
        assert visible(await successor.read_ts()) == []  # not applied: invisible for now
        w = (await successor.write_ts()).timestamp
        rows[w] = ["next"]
        await successor.apply_write(w)
        assert w > lost_at
        assert visible(await successor.read_ts()) == ["next", "refused"]  # it landed after all
    finally:
        for oracle in opened:
            await oracle.close()


async def test_a_stop_while_waiting_to_retry_a_conflict_says_nothing_was_appended(
        sqlite_url, monkeypatch):
    """Found by attack: after an append's Conflict the group waits (jitter) before its next
    timestamp; stopped there, its callers were told the append at the lost timestamp may have
    happened. Nothing was appended: they are told so."""
    await tsoracle.init(sqlite_url, timelines=[COUNTER])
    from tsoracle.oracle import commit_engine

    monkeypatch.setattr(commit_engine.random, "uniform", lambda a, b: HANG_GUARD_S)
    tried: list[int] = []

    async def append(ts: int, payloads: list[int]) -> None:
        tried.append(ts)
        raise Conflict("another writer got there first")

    async with tsoracle.connect(sqlite_url, timeline=COUNTER) as oracle:
        committer: GroupCommitter[int] = GroupCommitter(oracle, append)
        caller = asyncio.ensure_future(committer.commit(1))
        while not tried:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # in the jitter sleep before the next write_ts
        task = committer._groups._task  # no public handle: the test plays a shutdown
        assert task is not None
        task.cancel()
        with pytest.raises(CommitInterrupted) as err:
            await asyncio.wait_for(caller, HANG_GUARD_S)
        assert err.value.stage == "write_ts" and "nothing was appended" in str(err.value)
        assert len(tried) == 1

"""The commit engine (tsoracle.oracle.commit_engine) alone: groups, their outcomes when a
group fails or is stopped, and the retry loop. Pure asyncio, no database; the engine's users
are tested on real ones (test_group_commit.py, test_catalog_group.py)."""

from __future__ import annotations

import asyncio

import pytest

from tsoracle.oracle import commit_engine as engine

HANG_GUARD_S = 10  # only against a hang; nothing here waits on purpose


def stopped(exc: BaseException, started: bool) -> engine.Outcome:
    return engine.Unknown(exc) if started else engine.Failed(exc)


async def test_what_queues_while_a_group_lands_is_the_next_group_in_order():
    groups_seen: list[list[int]] = []
    gate = asyncio.Event()

    async def land(group: list[engine.Attempt[int]]) -> None:
        groups_seen.append([a.item for a in group])
        await gate.wait()
        for a in group:
            a.settle(engine.Landed(a.item * 10))

    groups: engine.Groups[int] = engine.Groups(land, stopped, max_group=3)
    first = asyncio.ensure_future(groups.submit(0))
    await asyncio.sleep(0)  # the first group (just 0) is landing
    rest = [asyncio.ensure_future(groups.submit(i)) for i in range(1, 6)]
    await asyncio.sleep(0)
    gate.set()
    outcomes = await asyncio.wait_for(asyncio.gather(first, *rest), HANG_GUARD_S)
    assert outcomes == [engine.Landed(i * 10) for i in range(6)]
    assert groups_seen == [[0], [1, 2, 3], [4, 5]]  # at most max_group, in arrival order


async def test_requeued_attempts_go_first_in_the_next_group():
    seen: list[list[str]] = []

    async def land(group: list[engine.Attempt[str]]) -> None:
        seen.append([a.item for a in group])
        for a in group:
            if a.item == "later" and len(seen) == 1:
                groups.requeue([a])
            else:
                a.settle(engine.Landed(a.item))

    groups: engine.Groups[str] = engine.Groups(land, stopped, max_group=10)
    out = await asyncio.wait_for(asyncio.gather(groups.submit("later"), groups.submit("b")),
                                 HANG_GUARD_S)
    assert out == [engine.Landed("later"), engine.Landed("b")]
    assert seen == [["later", "b"], ["later"]]


async def test_a_group_that_raises_answers_what_it_left_and_the_next_group_runs():
    async def land(group: list[engine.Attempt[int]]) -> None:
        group[0].settle(engine.Landed("told first"))
        if group[0].item == 0:
            raise RuntimeError("a bug")
        for a in group:
            a.settle(engine.Landed(a.item))

    groups: engine.Groups[int] = engine.Groups(land, stopped, max_group=10)
    out = await asyncio.wait_for(asyncio.gather(groups.submit(0), groups.submit(1)),
                                 HANG_GUARD_S)
    assert out[0] == engine.Landed("told first")  # the first outcome told stands
    assert isinstance(out[1], engine.Unknown) and isinstance(out[1].error, RuntimeError)
    assert await asyncio.wait_for(groups.submit(2), HANG_GUARD_S) == engine.Landed("told first")


async def test_a_cancelled_task_answers_its_group_and_everything_queued():
    entered = asyncio.Event()

    async def land(group: list[engine.Attempt[int]]) -> None:
        entered.set()
        await asyncio.Event().wait()  # never lands

    groups: engine.Groups[int] = engine.Groups(land, stopped, max_group=1)
    in_flight = asyncio.ensure_future(groups.submit(0))
    await asyncio.wait_for(entered.wait(), HANG_GUARD_S)
    queued = asyncio.ensure_future(groups.submit(1))
    await asyncio.sleep(0)
    assert groups._task is not None
    groups._task.cancel()
    a, b = await asyncio.wait_for(asyncio.gather(in_flight, queued), HANG_GUARD_S)
    assert isinstance(a, engine.Unknown) and isinstance(a.error, asyncio.CancelledError)  # started
    assert isinstance(b, engine.Failed) and isinstance(b.error, asyncio.CancelledError)  # never ran


async def test_a_cancellation_from_below_stops_its_group_only():
    async def land(group: list[engine.Attempt[int]]) -> None:
        if group[0].item == 0:
            doomed = asyncio.ensure_future(asyncio.sleep(HANG_GUARD_S))
            doomed.cancel()
            await doomed  # a CancelledError this task did not ask for
        for a in group:
            a.settle(engine.Landed(a.item))

    groups: engine.Groups[int] = engine.Groups(land, stopped, max_group=1)
    out = await asyncio.wait_for(asyncio.gather(groups.submit(0), groups.submit(1)),
                                 HANG_GUARD_S)
    assert isinstance(out[0], engine.Unknown) and out[1] == engine.Landed(1)


async def test_retry_tries_again_only_after_a_conflict_and_gives_up_after_the_last():
    told: list[engine.Outcome] = [engine.Conflict("a"), engine.Conflict("b"), engine.Landed("done")]
    conflicts: list[int] = []

    async def attempt(n: int) -> engine.Outcome:
        return told[n]

    result = await engine.retry(attempt, attempts=3, exhausted=lambda: RuntimeError("too many"),
                         what="a test", on_conflict=lambda: conflicts.append(1))
    assert result == "done" and len(conflicts) == 2

    async def always(n: int) -> engine.Outcome:
        return engine.Conflict("again")

    with pytest.raises(RuntimeError, match="too many"):
        await engine.retry(always, attempts=3, exhausted=lambda: RuntimeError("too many"), what="t")

    calls: list[int] = []

    async def refused(n: int) -> engine.Outcome:
        calls.append(n)
        return engine.Failed(ValueError("no"))

    with pytest.raises(ValueError, match="no"):
        await engine.retry(refused, attempts=5, exhausted=lambda: RuntimeError("x"), what="t")
    assert calls == [0]  # a refusal is not retried; nor is an unknown outcome

    async def unknown(n: int) -> engine.Outcome:
        calls.append(n)
        return engine.Unknown(TimeoutError("maybe"))

    with pytest.raises(TimeoutError):
        await engine.retry(unknown, attempts=5, exhausted=lambda: RuntimeError("x"), what="t")
    assert calls == [0, 0]


async def test_a_base_exception_out_of_land_answers_its_group_and_is_logged_once(caplog):
    """Before: the attempts were answered, but the task's exception was never retrieved, and
    asyncio reported it as such whenever the task was collected."""
    import gc

    class Stop(BaseException):
        pass

    async def land(group: list[engine.Attempt[int]]) -> None:
        raise Stop()

    groups: engine.Groups[int] = engine.Groups(land, stopped, max_group=10)
    outcome = await asyncio.wait_for(groups.submit(1), HANG_GUARD_S)
    assert isinstance(outcome, engine.Unknown)
    task = groups._task
    assert task is not None
    await asyncio.wait([task], timeout=HANG_GUARD_S)
    await asyncio.sleep(0)  # the task's done callbacks run
    del task, groups
    gc.collect()
    messages = [r.getMessage() for r in caplog.records]
    assert "the commit task stopped: Stop" in messages, messages
    assert not any("never retrieved" in m for m in messages), messages


async def test_a_task_cancelled_before_it_ran_answers_what_was_queued_for_it():
    """Found by attack: cancelled before its first step, the task never reached its
    `finally`, and the attempt queued for it waited until some later submit."""
    async def land(group: list[engine.Attempt[int]]) -> None:
        for a in group:
            a.settle(engine.Landed(a.item))

    groups: engine.Groups[int] = engine.Groups(land, stopped, max_group=10)
    waiting = asyncio.ensure_future(groups.submit(1))
    await asyncio.sleep(0)  # submitted: the task exists and has not run yet
    assert groups._task is not None
    groups._task.cancel()
    outcome = await asyncio.wait_for(waiting, HANG_GUARD_S)
    assert isinstance(outcome, engine.Failed)  # started=False: nothing of it ran
    assert await asyncio.wait_for(groups.submit(2), HANG_GUARD_S) == engine.Landed(2)

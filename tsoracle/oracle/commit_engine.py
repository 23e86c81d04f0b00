"""Group commit: one engine for the oracle's `GroupCommitter` and the catalog's ordering.

Callers queue attempts (`Groups.submit`); one task lands whatever queued while the group before
it was landing, as the next group, and every attempt ends with one of four outcomes. `retry` is
the loop around attempts: it tries again only after a `Conflict`, a bounded number of times,
with jitter, and logs each one.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")  # what an attempt carries: a payload, a plan's builder
log = logging.getLogger("tsoracle.commits")


@dataclass(frozen=True)
class Landed:
    """Committed and applied: the result to answer with."""

    result: Any


@dataclass(frozen=True)
class Conflict:
    """Nothing landed because another commit got there first: the same attempt may land at
    a fresh timestamp."""

    reason: str


@dataclass(frozen=True)
class Failed:
    """Nothing landed, and trying again would not help: the error says why."""

    error: BaseException


@dataclass(frozen=True)
class Unknown:
    """It may have landed (the database or the oracle did not confirm): never retried."""

    error: BaseException


Outcome = Landed | Conflict | Failed | Unknown


@dataclass
class Attempt(Generic[T]):
    """One queued attempt: what it carries, and its outcome once told."""

    item: T
    done: asyncio.Future[Outcome]

    def settle(self, outcome: Outcome) -> None:
        """Its outcome, once (the first one told stands)."""
        if not self.done.done():
            self.done.set_result(outcome)


class Groups(Generic[T]):
    """The queue of attempts and the one task that lands them, a group at a time.

    `land(group)` settles each attempt of its group. One it leaves unsettled, because `land`
    raised or a cancellation stopped it, gets `stopped(exc, started)`: `started` is False for
    an attempt still queued when the task itself was cancelled (nothing of it ran). A
    cancellation that `land` merely received from below stops its group only.
    """

    def __init__(self, land: Callable[[list[Attempt[T]]], Awaitable[None]],
                 stopped: Callable[[BaseException, bool], Outcome], max_group: int) -> None:
        self._land = land
        self._stopped = stopped
        self._max_group = max_group
        self._queue: list[Attempt[T]] = []
        self._task: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> Outcome:
        """Queue `item` for the next group and wait for its outcome."""
        loop = asyncio.get_running_loop()
        attempt = Attempt(item, loop.create_future())
        self._queue.append(attempt)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run())
            self._task.add_done_callback(self._ended)
        return await attempt.done

    def requeue(self, attempts: list[Attempt[T]]) -> None:
        """Attempts of the group landing now that go in the next one, first."""
        self._queue[:0] = attempts

    async def _run(self) -> None:
        group: list[Attempt[T]] = []
        try:
            while self._queue:
                group = self._queue[:self._max_group]
                del self._queue[:self._max_group]
                try:
                    await self._land(group)
                except asyncio.CancelledError as exc:
                    if _cancelling():
                        raise  # this task was cancelled: `finally` answers everyone waiting
                    self._settle(group, exc, started=True)
                except Exception as exc:
                    self._settle(group, exc, started=True)
        finally:
            # Reached with attempts waiting only when this task stops early (cancelled, or a
            # BaseException such as KeyboardInterrupt): none of them may wait forever.
            self._settle(group, asyncio.CancelledError(), started=True)
            queued, self._queue = self._queue, []
            self._settle(queued, asyncio.CancelledError(), started=False)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """Log what stopped the task other than a cancellation (a BaseException out of
        `land`; its attempts were answered): nobody awaits the task, so asyncio would only
        report it, as never retrieved, whenever the task is collected. And answer what is
        still queued for it: a task cancelled before it ran never reached its `finally`."""
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("the commit task stopped: %s", exc.__class__.__name__)
        if task is self._task:  # else a new task took over the queue
            queued, self._queue = self._queue, []
            self._settle(queued, asyncio.CancelledError(), started=False)

    def _settle(self, attempts: list[Attempt[T]], exc: BaseException, started: bool) -> None:
        for attempt in attempts:
            if not attempt.done.done():
                attempt.settle(self._stopped(exc, started))


async def retry(attempt: Callable[[int], Awaitable[Outcome]], *, attempts: int,
                exhausted: Callable[[], BaseException], what: str,
                on_conflict: Callable[[], None] | None = None) -> Any:
    """`attempt(n)` until one is not a `Conflict`, at most `attempts` times: a landed one's
    result, else its error raised (`exhausted()` after the last conflict)."""
    for n in range(attempts):
        outcome = await attempt(n)
        if isinstance(outcome, Landed):
            return outcome.result
        if not isinstance(outcome, Conflict):
            raise outcome.error
        if on_conflict is not None:
            on_conflict()
        log.debug("%s lost a race (%s, attempt %d); again at a fresh timestamp", what,
                  outcome.reason, n + 1)
        # Jittered: attempts that lost together do not all come back in the same group.
        await asyncio.sleep(random.uniform(0, min(0.05, 0.001 * 2 ** n)))
    raise exhausted()


def _cancelling() -> bool:
    """Whether the running task itself was asked to stop (`Task.cancel()`), as opposed to a
    CancelledError it merely received from a cancelled task or future it awaited."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0

"""Group commit: concurrent writers share one write_ts, one append and one apply_write."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

from tsoracle.errors import OracleClosed, OracleError
from tsoracle.oracle.api import WriteTimestamp

log = logging.getLogger(__name__)

P = TypeVar("P")


class Stamper(Protocol):
    """The two oracle operations a group commit uses: any TimestampOracle, or a wrapper that
    reopens one (the Spark tables' client)."""

    async def write_ts(self) -> WriteTimestamp: ...

    async def apply_write(self, ts: int) -> None: ...


class Conflict(Exception):
    """Raised by an append that lost a compare-and-set; the group retries at a fresh timestamp."""


class CommitInterrupted(OracleError):
    """A commit stopped by a cancellation (or another BaseException) instead of an error.

    `stage` is where it stopped: "queued" (never started: nothing was appended),
    "write_ts" (nothing was appended), "append" (whether the payloads were appended at `ts`
    is unknown) or "apply" (they were appended at `ts`; whether `apply_write(ts)` ran is
    unknown). `ts` is None until the group took a timestamp.
    """

    stage: str = "queued"
    ts: int | None = None

    @classmethod
    def at(cls, stage: str, ts: int | None) -> CommitInterrupted:
        why = {
            "queued": "the group committer's task stopped (cancelled or interrupted) before "
                      "this payload was committed: nothing was appended; commit it again",
            "write_ts": "the group commit was interrupted while taking its write timestamp: "
                        "nothing was appended; commit it again",
            "append": f"the group commit at {ts} was interrupted during its append: whether "
                      f"the payloads were appended at {ts} is unknown, and {ts} was not "
                      "applied; look for them at that timestamp before committing them again",
            "apply": f"the group commit at {ts} was interrupted during apply_write({ts}): the "
                     "payloads were appended, but whether readers see them yet is unknown; "
                     f"apply_write({ts}) (it is idempotent) makes them visible, do not commit "
                     "them again",
        }[stage]
        err = cls(why)
        err.stage, err.ts = stage, ts
        return err


class GroupCommitter(Generic[P]):
    """`await commit(payload)` returns the timestamp at which the payload became visible.

    While one group is committing, newcomers queue up and form the next group. Readers that
    read only what is at or below `read_ts` see a group once `apply_write` covers its
    timestamp. If the append fails, nobody in the group gets a timestamp and nothing is
    applied. If `apply_write` fails after the append (fenced: a flip or a newer legacy leader),
    the callers get that error, but the appended rows stay at their timestamp and become
    visible once any later write above it is applied (`abandon`, if given, is told first). An
    append that raises `Conflict` is retried at a fresh timestamp. A group stopped by a
    cancellation instead (an append that awaited a cancelled task, or the committer's own
    task cancelled) fails its callers with `CommitInterrupted`, which says how far it got;
    later groups are served as usual.

    With `durable_appends`, the append itself makes the group visible (the Spark tables'
    catalog does: its readers never read past its upper), so once it returned the group gets
    its timestamp even if `apply_write` then fails: failing the callers would make them retry
    and write their rows twice. The apply is retried in the background until it succeeds;
    `idle()` waits for those retries.
    """

    def __init__(
        self,
        oracle: Stamper,
        append: Callable[[int, list[P]], Awaitable[None]],
        *,
        max_group: int = 10_000,
        max_conflicts: int = 50,
        on_group: Callable[[int], None] | None = None,
        durable_appends: bool = False,
        abandon: Callable[[list[P]], Awaitable[None]] | None = None,
    ) -> None:
        self.oracle = oracle
        self._append = append
        self._max_group = max_group
        self._max_conflicts = max_conflicts
        self._on_group = on_group
        self._queue: list[tuple[P, asyncio.Future[int]]] = []
        self._worker: asyncio.Task[None] | None = None
        self._durable = durable_appends
        self._abandon = abandon  # told when a group fails for good (after its retries)
        self._applying: set[asyncio.Task[None]] = set()
        # Where the group in flight is, for the error of a group stopped by a cancellation.
        self._stage = "write_ts"
        self._stage_ts: int | None = None

    async def commit(self, payload: P) -> int:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.append((payload, fut))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._run())
        return await fut

    async def _run(self) -> None:
        group: list[tuple[P, asyncio.Future[int]]] = []
        try:
            while self._queue:
                group = self._queue[: self._max_group]
                del self._queue[: self._max_group]
                if self._on_group is not None:
                    self._on_group(len(group))
                payloads = [payload for payload, _ in group]
                try:
                    ts = await self._commit_group(payloads)
                except asyncio.CancelledError:
                    if _cancelling():
                        raise  # this task was cancelled: `finally` answers everyone waiting
                    # A cancellation from below (the append awaited a cancelled task) stops
                    # this group only: its callers get an outcome, the worker goes on.
                    await self._fail(group, payloads,
                                     CommitInterrupted.at(self._stage, self._stage_ts))
                    continue
                except Exception as exc:
                    await self._fail(group, payloads, exc)
                    continue
                for _, fut in group:
                    if not fut.done():
                        fut.set_result(ts)
        finally:
            # Reached with callers waiting only when this task stops early (cancelled, or a
            # BaseException such as KeyboardInterrupt): none of them may wait forever.
            for _, fut in group:
                if not fut.done():
                    fut.set_exception(CommitInterrupted.at(self._stage, self._stage_ts))
            queued, self._queue = self._queue, []
            for _, fut in queued:
                if not fut.done():
                    fut.set_exception(CommitInterrupted.at("queued", None))

    async def _fail(self, group: list[tuple[P, asyncio.Future[int]]], payloads: list[P],
                    exc: Exception) -> None:
        if self._abandon is not None:
            try:
                await self._abandon(payloads)
            except Exception:  # noqa: BLE001 (cleanup only; the callers get `exc`)
                log.warning("cleanup after a failed group commit failed", exc_info=True)
        for _, fut in group:
            if not fut.done():
                fut.set_exception(exc)

    async def _commit_group(self, payloads: list[P]) -> int:
        for _ in range(self._max_conflicts):
            self._stage, self._stage_ts = "write_ts", None
            ts = (await self.oracle.write_ts()).timestamp
            self._stage, self._stage_ts = "append", ts
            try:
                await self._append(ts, payloads)
            except Conflict:
                continue  # another writer committed above ts first: take a fresh timestamp
            self._stage = "apply"
            await self.apply(ts)
            return ts
        raise Conflict(f"gave up after {self._max_conflicts} conflicting commits")

    async def apply(self, ts: int) -> None:
        """`apply_write(ts)`; with durable appends a failure is retried in the background."""
        if not self._durable:
            await self.oracle.apply_write(ts)
            return
        try:
            await self.oracle.apply_write(ts)
        except OracleError as exc:
            log.warning("apply_write(%d) failed after a durable commit (%s); retrying in the "
                        "background", ts, type(exc).__name__)
            task = asyncio.get_running_loop().create_task(self._apply_until_done(ts))
            self._applying.add(task)
            task.add_done_callback(self._applying.discard)

    async def _apply_until_done(self, ts: int) -> None:
        delay = 0.1
        while True:
            await asyncio.sleep(delay)
            try:
                await self.oracle.apply_write(ts)
                return
            except OracleClosed:
                return  # shutting down: the catalog already holds the commit
            except OracleError:
                delay = min(delay * 2, 5.0)

    async def idle(self, timeout: float | None = None) -> None:
        """Wait for background applies (at most `timeout` seconds)."""
        if self._applying:
            await asyncio.wait(set(self._applying), timeout=timeout)


def _cancelling() -> bool:
    """Whether the running task itself was asked to stop (`Task.cancel()`), as opposed to a
    CancelledError it merely received from a cancelled task or future it awaited."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0

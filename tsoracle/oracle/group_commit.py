"""Group commit: concurrent writers share one write_ts, one append and one apply_write."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from tsoracle.oracle.api import TimestampOracle

P = TypeVar("P")


class Conflict(Exception):
    """Raised by an append that lost a compare-and-set; the group retries at a fresh timestamp."""


class GroupCommitter(Generic[P]):
    """`await commit(payload)` returns the timestamp at which the payload became visible.

    While one group is committing, newcomers queue up and form the next group. A group is
    visible to readers only after `apply_write`; if the append fails, nobody in the group
    gets a timestamp and nothing is applied. An append that raises `Conflict` is retried at a
    fresh timestamp.
    """

    def __init__(
        self,
        oracle: TimestampOracle,
        append: Callable[[int, list[P]], Awaitable[None]],
        *,
        max_group: int = 10_000,
        max_conflicts: int = 50,
        on_group: Callable[[int], None] | None = None,
    ) -> None:
        self.oracle = oracle
        self._append = append
        self._max_group = max_group
        self._max_conflicts = max_conflicts
        self._on_group = on_group
        self._queue: list[tuple[P, asyncio.Future[int]]] = []
        self._worker: asyncio.Task[None] | None = None

    async def commit(self, payload: P) -> int:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.append((payload, fut))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._run())
        return await fut

    async def _run(self) -> None:
        while self._queue:
            group = self._queue[: self._max_group]
            del self._queue[: self._max_group]
            if self._on_group is not None:
                self._on_group(len(group))
            try:
                ts = await self._commit_group([payload for payload, _ in group])
            except Exception as exc:
                for _, fut in group:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for _, fut in group:
                if not fut.done():
                    fut.set_result(ts)

    async def _commit_group(self, payloads: list[P]) -> int:
        for _ in range(self._max_conflicts):
            ts = (await self.oracle.write_ts()).timestamp
            try:
                await self._append(ts, payloads)
            except Conflict:
                continue  # another writer committed above ts first: take a fresh timestamp
            await self.oracle.apply_write(ts)
            return ts
        raise Conflict(f"gave up after {self._max_conflicts} conflicting commits")

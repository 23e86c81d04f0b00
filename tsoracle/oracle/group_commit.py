"""Group commit: concurrent writers share one write_ts, one append and one apply_write."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from tsoracle.oracle.api import TimestampOracle

P = TypeVar("P")


class GroupCommitter(Generic[P]):
    """`await commit(payload)` returns the timestamp at which the payload became visible.

    While one group is committing, newcomers queue up and form the next group. A group is
    visible to readers only after `apply_write`; if the append fails, nobody in the group
    gets a timestamp and nothing is applied.
    """

    def __init__(
        self,
        oracle: TimestampOracle,
        append: Callable[[int, list[P]], Awaitable[None]],
        *,
        max_group: int = 10_000,
        on_group: Callable[[int], None] | None = None,
    ) -> None:
        self.oracle = oracle
        self._append = append
        self._max_group = max_group
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
                ts = (await self.oracle.write_ts()).timestamp
                await self._append(ts, [payload for payload, _ in group])
                await self.oracle.apply_write(ts)
            except Exception as exc:
                for _, fut in group:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for _, fut in group:
                if not fut.done():
                    fut.set_result(ts)

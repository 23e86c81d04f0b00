"""Share one backend call among the callers that are waiting at the same moment."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Coalescer(Generic[T]):
    """`await call()` returns the result of an `fn()` that started after this caller did.

    The first caller runs `fn` itself (no task hop at low concurrency). Callers that arrive while
    a call is in flight wait for the *next* call: the in-flight one may have read the backend
    before they started, so its answer is not theirs to take. Nothing is cached.
    """

    def __init__(
        self, fn: Callable[[], Awaitable[T]], on_batch: Callable[[int], None] | None = None
    ) -> None:
        self._fn = fn
        self._on_batch = on_batch
        self._waiting: list[asyncio.Future[T]] = []
        self._busy = False
        self._drainer: asyncio.Task[None] | None = None

    async def call(self) -> T:
        if self._busy:
            fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
            self._waiting.append(fut)
            return await fut
        self._busy = True
        try:
            if self._on_batch is not None:
                self._on_batch(1)
            return await self._fn()
        finally:
            self._hand_off()

    async def idle(self) -> None:
        """Wait until no call started here is still running (before its connection closes)."""
        drainer = self._drainer
        if drainer is not None and not drainer.done():
            await asyncio.wait({drainer})

    def _hand_off(self) -> None:
        if self._waiting:
            self._drainer = asyncio.get_running_loop().create_task(self._drain())
        else:
            self._busy = False

    async def _drain(self) -> None:
        batch: list[asyncio.Future[T]] = []
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                if self._on_batch is not None:
                    self._on_batch(len(batch))
                try:
                    value = await self._fn()
                except Exception as exc:
                    for fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                for fut in batch:
                    if not fut.done():
                        fut.set_result(value)
        finally:
            self._busy = False
            for fut in [*batch, *self._waiting]:  # only reached when cancelled mid-drain
                if not fut.done():
                    fut.cancel()
            self._waiting = []

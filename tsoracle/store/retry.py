"""Bounded retries with jittered exponential backoff."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff doubles from `base` up to `cap` seconds; we give up after `timeout` seconds."""

    base: float = 0.005
    cap: float = 0.5
    timeout: float = 30.0
    max_attempts: int = 1000

    def delay(self, attempt: int) -> float:
        # "Full jitter": spreads out clients that all lost the same server at once.
        return random.uniform(0, min(self.cap, self.base * (2**attempt)))


class GaveUp(Exception):
    """Retries ran out; `last` is the final transient error."""

    def __init__(self, last: BaseException, attempts: int, elapsed: float) -> None:
        super().__init__(str(last))
        self.last = last
        self.attempts = attempts
        self.elapsed = elapsed


async def retrying(
    fn: Callable[[], Awaitable[T]],
    *,
    policy: RetryPolicy,
    transient: Callable[[BaseException], str | None],
    on_retry: Callable[[str], None] | None = None,
) -> T:
    """Run `fn`, retrying while `transient(exc)` names a reason; raise GaveUp when out of budget."""
    start = time.monotonic()
    attempt = 0
    while True:
        try:
            return await fn()
        except Exception as exc:  # classified below; anything not transient propagates
            reason = transient(exc)
            if reason is None:
                raise
            attempt += 1
            elapsed = time.monotonic() - start
            if attempt >= policy.max_attempts or elapsed >= policy.timeout:
                raise GaveUp(exc, attempt, elapsed) from exc
            if on_retry is not None:
                on_retry(reason)
            await asyncio.sleep(min(policy.delay(attempt), max(0.0, policy.timeout - elapsed)))

"""Blocking facade for Spark drivers and scripts: an event loop on a helper thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from tsoracle.eventloop import new_event_loop
from tsoracle.oracle.api import TimestampOracle, WriteTimestamp
from tsoracle.oracle.connect import open_oracle
from tsoracle.oracle.options import OracleOptions

T = TypeVar("T")


class LoopThread:
    """A private event loop running on a daemon thread."""

    def __init__(self) -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="tsoracle-loop",
                                        daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


class SyncTimestampOracle:
    """The TimestampOracle API with blocking methods; safe to call from several threads."""

    def __init__(self, oracle: TimestampOracle, runner: LoopThread) -> None:
        self.oracle = oracle
        self._runner = runner

    @property
    def epoch(self) -> int:
        return self.oracle.epoch

    @property
    def implementation(self) -> str:
        return self.oracle.implementation

    def write_ts(self) -> WriteTimestamp:
        return self._runner.run(self.oracle.write_ts())

    def peek_write_ts(self) -> int:
        return self._runner.run(self.oracle.peek_write_ts())

    def read_ts(self) -> int:
        return self._runner.run(self.oracle.read_ts())

    def apply_write(self, ts: int) -> None:
        self._runner.run(self.oracle.apply_write(ts))

    def confirm_leadership(self) -> None:
        self._runner.run(self.oracle.confirm_leadership())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run any coroutine on the oracle's loop (e.g. a group commit)."""
        return self._runner.run(coro)

    def close(self) -> None:
        try:
            self._runner.run(self.oracle.close())
        finally:
            self._runner.stop()


def open_sync(url: str, options: OracleOptions | None = None,
              **fields: Any) -> SyncTimestampOracle:
    """`open_oracle`'s blocking form: the same options (`OracleOptions`)."""
    runner = LoopThread()
    try:
        oracle = runner.run(open_oracle(url, options, **fields))
    except BaseException:
        runner.stop()
        raise
    return SyncTimestampOracle(oracle, runner)


@contextmanager
def connect_sync(url: str, options: OracleOptions | None = None,
                 **fields: Any) -> Iterator[SyncTimestampOracle]:
    """`with tsoracle.connect_sync(url, …) as oracle: oracle.read_ts()`"""
    oracle = open_sync(url, options, **fields)
    try:
        yield oracle
    finally:
        oracle.close()

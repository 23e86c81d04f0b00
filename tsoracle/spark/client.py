"""The driver-side oracle client: finds the configured oracle and survives flips.

It runs the async oracle on a private event loop thread (Spark driver code is synchronous),
keeps one oracle per timeline, and when an operation raises `Fenced` (the epoch moved: a flip or
a newer leader) it reopens on the active implementation and retries, so nothing is ever served
by the superseded one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tsoracle.errors import ConfigError, Fenced, LeadershipLost, OracleClosed
from tsoracle.extras import needs_extra
from tsoracle.fencing import read_deployment
from tsoracle.oracle import TimestampOracle, open_oracle, parse_timeline
from tsoracle.oracle.connect import open_instrumented_backend
from tsoracle.oracle.sync import LoopThread
from tsoracle.oracle.timeline import EPOCH_MILLISECONDS
from tsoracle.spark import catalog
from tsoracle.spark.locations import table_location
from tsoracle.store import Backend, RetryPolicy

T = TypeVar("T")
log = logging.getLogger("tsoracle.spark")
MAX_REOPENS = 10


class OracleClient:
    def __init__(self, url: str, *, data_dir: str | os.PathLike[str],
                 timeline: str = EPOCH_MILLISECONDS, staleness_s: float = 1.0,
                 fencing: str | None = None, retry: RetryPolicy | None = None) -> None:
        self.url = url
        self.default_timeline = parse_timeline(timeline).name
        self.data_dir = table_location(data_dir)
        self.staleness_s = staleness_s
        self._fencing = fencing
        self._retry = retry  # how long each call retries a failing database
        self._runner = LoopThread()
        self._oracles: dict[str, TimestampOracle] = {}
        self._opening: dict[str, asyncio.Task[TimestampOracle]] = {}  # one open per timeline
        self._retiring: set[asyncio.Task[None]] = set()  # fenced oracles draining to close
        self._shut = False
        self._closed_cache: dict[str, tuple[float, int]] = {}
        self.reopens = 0
        self.committers: list[Any] = []  # the tables' group committers (see close)
        self._lost: dict[str, LeadershipLost] = {}  # legacy timelines another driver took
        self.backend: Backend = self._runner.run(self._open_catalog())

    async def _open_catalog(self) -> Backend:
        backend = await open_instrumented_backend(self.url, "catalog", retry=self._retry)
        try:
            await catalog.ensure_catalog(backend)
        except BaseException:
            await backend.close()
            raise
        return backend

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> OracleClient:
        return cls(url, **kwargs)

    @classmethod
    def from_resource(cls, name: str, namespace: str, *, data_dir: str | os.PathLike[str],
                      kubeconfig: str | None = None, timeline: str | None = None,
                      **kwargs: Any) -> OracleClient:
        """Find the oracle through a TimestampOracle resource: its Secret and its status."""
        with needs_extra("operator", "finding the oracle through a TimestampOracle resource"):
            from kubernetes import client, config

        from tsoracle.resource import (
            GROUP,
            PLURAL,
            VERSION,
            parse_spec,
            read_secret_url_sync,
            resource_url,
        )

        if kubeconfig:
            api_client = config.new_client_from_config(kubeconfig)
        else:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api_client = client.ApiClient()
        obj = client.CustomObjectsApi(api_client).get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name)
        spec = parse_spec(obj.get("spec") or {})
        status = obj.get("status") or {}
        if not status.get("activeImplementation"):
            raise ConfigError(f"TimestampOracle {namespace}/{name} is not provisioned yet "
                              "(no status.activeImplementation); check its conditions")
        url = resource_url(read_secret_url_sync(api_client, namespace, spec.secret_name,
                                               spec.secret_key), spec.schema)
        self = cls(url, data_dir=data_dir, timeline=timeline or spec.timelines[0], **kwargs)
        self.resource_epoch = int(status.get("epoch") or 0)
        self.resource_implementation = status["activeImplementation"]
        return self

    # --- oracle calls, with reopen on Fenced -------------------------------------------------

    def call(self, fn: Callable[[TimestampOracle], Awaitable[T]],
             timeline: str | None = None) -> T:
        return self._runner.run(self.acall(fn, timeline))

    async def acall(self, fn: Callable[[TimestampOracle], Awaitable[T]],
                    timeline: str | None = None) -> T:
        name = timeline or self.default_timeline
        for _ in range(MAX_REOPENS):
            oracle = await self._oracle(name)
            try:
                return await fn(oracle)
            except LeadershipLost as exc:
                # Another driver took this legacy timeline over. Taking it back would fence
                # that driver in turn, and every take-over jumps a reservation window ahead.
                self._retire(name, oracle, exc)
                self._lost[name] = LeadershipLost(
                    f"another process leads the legacy timeline {name!r}; the legacy "
                    "implementation serves one process per timeline, so several Spark drivers "
                    "need the distributed one (spec.implementation: distributed, or "
                    "`tsoracle flip distributed`); a new OracleClient may take it over")
                raise self._lost[name] from None
            except Fenced as exc:
                self._retire(name, oracle, exc)
            except OracleClosed:
                if self._shut:
                    raise
                # Retired (another caller saw Fenced) between our lookup and our call: nothing
                # was served by it. If it is still registered, something else closed it: forget
                # it, so the next attempt opens a fresh one instead of retrying a dead oracle.
                if self._oracles.get(name) is oracle:
                    del self._oracles[name]
                await asyncio.sleep(0)
        raise Fenced(f"the oracle for {name!r} kept moving during {MAX_REOPENS} reopenings")

    async def _oracle(self, timeline: str) -> TimestampOracle:
        if self._shut:
            raise OracleClosed("this client is closed; create a new OracleClient")
        lost = self._lost.get(timeline)
        if lost is not None:
            if (await read_deployment(self.backend)).implementation == "legacy":
                raise lost
            del self._lost[timeline]  # flipped to distributed since: every driver may serve
        oracle = self._oracles.get(timeline)
        if oracle is not None:
            return oracle
        # Single flight: concurrent first calls share one open (eight opens of a legacy
        # timeline would be eight leaders fencing each other).
        task = self._opening.get(timeline)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._open(timeline))
            self._opening[timeline] = task
            task.add_done_callback(lambda _t: self._opening.pop(timeline, None))
        return await asyncio.shield(task)

    async def _open(self, timeline: str) -> TimestampOracle:
        for attempt in range(MAX_REOPENS):
            try:
                oracle = await open_oracle(self.url, timeline=timeline, implementation=None,
                                           fencing=self._fencing, retry=self._retry)
                break
            except Fenced:  # a flip landed between reading and opening: read again
                await asyncio.sleep(0.01 * (attempt + 1))
        else:
            raise Fenced(f"could not open the oracle for {timeline!r}: it keeps flipping")
        self._oracles[timeline] = oracle
        return oracle

    def _retire(self, timeline: str, oracle: TimestampOracle, exc: Fenced) -> None:
        """Stop handing out a fenced oracle; close it once its calls in flight are done."""
        if self._oracles.get(timeline) is not oracle:
            return
        del self._oracles[timeline]
        self.reopens += 1
        log.info("oracle for %s fenced (%s); reopening on the active implementation",
                 timeline, exc)
        task = asyncio.get_running_loop().create_task(oracle.close())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    def read_ts(self, timeline: str | None = None) -> int:
        return self.call(lambda o: o.read_ts(), timeline)

    def write_ts(self, timeline: str | None = None) -> int:
        return self.call(lambda o: o.write_ts(), timeline).timestamp

    def apply_write(self, ts: int, timeline: str | None = None) -> None:
        self.call(lambda o: o.apply_write(ts), timeline)

    def epoch(self, timeline: str | None = None) -> int:
        return self.call(lambda o: _epoch(o), timeline)

    def implementation(self, timeline: str | None = None) -> str:
        return self.call(lambda o: _implementation(o), timeline)

    def closed_ts(self, timeline: str) -> int:
        """A timestamp known closed without an oracle round trip, at most `staleness_s` old."""
        cached = self._closed_cache.get(timeline)
        now = time.monotonic()
        if cached is not None and now - cached[0] <= self.staleness_s:
            return cached[1]
        ts = self.run(catalog.upper(self.backend, timeline))
        return self.saw_closed(timeline, ts, now)

    def saw_closed(self, timeline: str, ts: int, at: float | None = None) -> int:
        """Record that `ts` is closed; the cached value only moves forward (a slow refresh
        finishing last must not take a later read back in time)."""
        cached = self._closed_cache.get(timeline)
        best = max(ts, cached[1]) if cached is not None else ts
        self._closed_cache[timeline] = (time.monotonic() if at is None else at, best)
        return best

    def run(self, coro: Awaitable[T]) -> T:
        return self._runner.run(coro)  # type: ignore[arg-type]

    # --- tables ------------------------------------------------------------------------------

    def create_table(self, spark: Any, name: str, schema: Any, *, keys: tuple[str, ...] = (),
                     timeline: str | None = None) -> Any:
        from tsoracle.spark.table import TimestampedTable

        return TimestampedTable.create(self, spark, name, schema, keys=keys,
                                       timeline=timeline or self.default_timeline)

    def table(self, spark: Any, name: str) -> Any:
        from tsoracle.spark.table import TimestampedTable

        return TimestampedTable.open(self, spark, name)

    def drop_table(self, spark: Any, name: str) -> None:
        """Delete a table: its catalog entry, then its files. Irreversible."""
        from tsoracle.spark.table import TimestampedTable

        TimestampedTable.open(self, spark, name).drop()

    def close(self) -> None:
        async def shutdown() -> None:
            # Durable commits whose apply_write is still being retried: give them a moment.
            await asyncio.gather(*(c.idle(timeout=5.0) for c in self.committers),
                                 return_exceptions=True)
            self._shut = True
            await asyncio.gather(*self._opening.values(), return_exceptions=True)
            oracles, self._oracles = list(self._oracles.values()), {}
            for oracle in oracles:
                await oracle.close()
            await asyncio.gather(*self._retiring, return_exceptions=True)
            await self.backend.close()

        try:
            self._runner.run(shutdown())
        finally:
            self._runner.stop()

    def __enter__(self) -> OracleClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _epoch(oracle: TimestampOracle) -> int:
    await oracle.confirm_leadership()
    return oracle.epoch


async def _implementation(oracle: TimestampOracle) -> str:
    await oracle.confirm_leadership()
    return oracle.implementation

"""Opening oracles, and the deployment-wide admin calls (init, flip, advance, fencing, status)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

from tsoracle.errors import Arg, ConfigError, Fenced, NotInitialized, UnknownTimeline
from tsoracle.fencing import (
    Deployment,
    check_implementation,
    check_mode,
    read_deployment,
    tables_exist,
)
from tsoracle.fencing import finish_rollout as _finish_rollout
from tsoracle.fencing import set_fencing as _set_fencing
from tsoracle.oracle import metrics
from tsoracle.oracle.advance import AdvanceResult, advance_timeline
from tsoracle.oracle.api import TimestampOracle, wall_clock_ms
from tsoracle.oracle.distributed import DistributedOracle
from tsoracle.oracle.flip import FlipResult, flip_backend
from tsoracle.oracle.legacy import LegacyOracle
from tsoracle.oracle.options import OracleOptions
from tsoracle.oracle.provision import Provisioned, provision, timeline_exists
from tsoracle.oracle.status import Status, read_status
from tsoracle.oracle.timeline import EPOCH_MILLISECONDS
from tsoracle.store import Backend, RetryPolicy, open_backend, parse_url
from tsoracle.store.backend import DEFAULT_POOL_SIZE


async def open_instrumented_backend(url: str, implementation: str = "admin", *,
                                    pool_size: int = DEFAULT_POOL_SIZE,
                                    retry: RetryPolicy | None = None,
                                    create: bool = False) -> Backend:
    """An open backend whose retries are counted under `implementation`."""
    retries = metrics.RETRIES
    backend = open_backend(
        parse_url(url), on_retry=lambda reason: retries.inc(reason, implementation),
        pool_size=pool_size, retry=retry, create=create,
    )
    await backend.open()
    return backend


async def _require_schema(backend: Backend) -> Deployment:
    if not await tables_exist(backend):
        raise NotInitialized(
            f"{backend.url.safe} has no tsoracle schema {backend.url.schema!r}; "
            "run `tsoracle init` (or let the operator provision it)"
        )
    return await read_deployment(backend)


async def open_oracle(url: str, options: OracleOptions | None = None,
                      **fields: Any) -> TimestampOracle:
    """Open an oracle the caller must `close()`; `connect` is the context-manager form.

    `fields` are `OracleOptions`' (`timeline=`, `implementation=`, …), checked before any
    connection is made; given with `options`, they override its values.
    """
    opts = OracleOptions(**fields) if options is None else dataclasses.replace(options, **fields)
    tl = opts.parsed_timeline()
    backend = await open_instrumented_backend(url, opts.implementation or "active",
                                              pool_size=opts.pool_size, retry=opts.retry)
    try:
        dep = await _require_schema(backend)
        if not await timeline_exists(backend, tl.name):
            raise UnknownTimeline(tl.name)
        chosen = opts.implementation or dep.implementation
        if chosen != dep.implementation:
            raise Fenced.worded(
                "the active implementation is {active!r} (epoch {epoch}), not {chosen!r}; use "
                "{use}, or {follow} to follow the active implementation",
                active=dep.implementation, epoch=dep.epoch, chosen=chosen,
                use=Arg("implementation", dep.implementation),
                follow=Arg("implementation", omit=True))
        if chosen == "legacy" and opts.read_only:
            # Refused here, before LegacyOracle.start(): starting is a take-over (a new leader
            # epoch) that fences the running leader, read-only or not.
            raise ConfigError(
                f"the deployment's active implementation is legacy (epoch {dep.epoch}), which "
                "serves timestamps from its leader's memory: opening it, even read-only, would "
                "take the leadership and fence the running leader; read through the leader's "
                "process, or flip the deployment to distributed (`tsoracle flip --to "
                "distributed`), whose read-only clients read from the database (from the "
                "command line, `tsoracle ts read --stored` shows the stored row without "
                "leading)")
        cls = LegacyOracle if chosen == "legacy" else DistributedOracle
        depth = opts.pipeline_depth_for(chosen, cls.pinned_connections, backend.pooled)
        if chosen == "legacy":
            legacy = LegacyOracle(
                backend, tl, dep, read_only=opts.read_only, fencing_override=opts.fencing,
                now=opts.now,
                max_clock_skew_ms=opts.max_clock_skew_ms, window=opts.window,
                pipeline_depth=depth)
            await legacy.start()
            metrics.LEADER_EPOCH.set((tl.name,), legacy.leadership.leader_epoch)
            return legacy
        return DistributedOracle(
            backend, tl, dep, read_only=opts.read_only, fencing_override=opts.fencing,
            now=opts.now, max_clock_skew_ms=opts.max_clock_skew_ms, batching=opts.batching,
            pipeline_depth=depth)
    except BaseException:
        await backend.close()
        raise


@asynccontextmanager
async def connect(url: str, options: OracleOptions | None = None,
                  **fields: Any) -> AsyncIterator[TimestampOracle]:
    """`async with tsoracle.connect(url, timeline=…, implementation=…) as oracle: …`"""
    oracle = await open_oracle(url, options, **fields)
    try:
        yield oracle
    finally:
        await oracle.close()


@asynccontextmanager
async def admin_backend(url: str, *, create: bool = False) -> AsyncIterator[Backend]:
    """A backend for deployment-wide calls (provision, flip, status) on the lower layers.

    `create` lets an embedded (SQLite) database file be created; only provisioning does that.
    """
    backend = await open_instrumented_backend(url, create=create)
    try:
        yield backend
    finally:
        await backend.close()


async def init(
    url: str,
    *,
    timelines: Iterable[str] = (EPOCH_MILLISECONDS,),
    initial_ts: int = 0,
    implementation: str = "distributed",
    fencing: str | None = None,
) -> Provisioned:
    """Create the schema, tables and timelines that are missing (idempotent)."""
    async with admin_backend(url, create=True) as backend:
        return await provision(backend, timelines, initial_ts=initial_ts,
                               implementation=implementation, fencing=fencing)


async def flip(url: str, *, to: str) -> FlipResult:
    """Make `to` the active implementation: new epoch, target bootstrapped above all others."""
    check_implementation(to)
    async with admin_backend(url) as backend:
        await _require_schema(backend)
        return await flip_backend(backend, to)


async def advance(url: str, *, timeline: str, to: int, force: bool = False) -> AdvanceResult:
    """Move `timeline` forward to `to` after a restore (forward only; `advance_timeline`)."""
    async with admin_backend(url) as backend:
        await _require_schema(backend)
        return await advance_timeline(backend, timeline, to, force=force)


async def set_fencing(url: str, mode: str) -> Deployment:
    check_mode(mode)
    async with admin_backend(url) as backend:
        await _require_schema(backend)
        return await _set_fencing(backend, mode)


async def finish_rollout(url: str) -> Deployment:
    async with admin_backend(url) as backend:
        await _require_schema(backend)
        return await _finish_rollout(backend)


async def status(url: str, *, now: Callable[[], int] | None = None) -> Status:
    async with admin_backend(url) as backend:
        await _require_schema(backend)
        return await read_status(backend, now or wall_clock_ms)

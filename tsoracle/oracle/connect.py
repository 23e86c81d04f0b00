"""Opening oracles, and the deployment-wide admin calls (init, flip, fencing, status)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

from tsoracle.coalesce import MAX_PIPELINE_DEPTH
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
from tsoracle.oracle.api import TimestampOracle, wall_clock_ms
from tsoracle.oracle.distributed import DistributedOracle
from tsoracle.oracle.flip import FlipResult, flip_backend
from tsoracle.oracle.legacy import DEFAULT_WINDOW, LegacyOracle
from tsoracle.oracle.provision import Provisioned, provision, timeline_exists
from tsoracle.oracle.status import Status, read_status
from tsoracle.oracle.timeline import EPOCH_MILLISECONDS, parse_timeline
from tsoracle.store import Backend, RetryPolicy, open_backend, parse_url

DEFAULT_MAX_CLOCK_SKEW_MS = 60_000
# Batched read_ts / confirm_leadership calls in flight at once (coalesce.Pipelined;
# docs/design.md, "Pipelined batches"): beyond the first, each borrows a pool connection.
DEFAULT_PIPELINE_DEPTH = 8


async def open_instrumented_backend(url: str, implementation: str = "admin",
                                    **kwargs: Any) -> Backend:
    """An open backend whose retries are counted under `implementation`."""
    retries = metrics.RETRIES
    backend = open_backend(
        parse_url(url), on_retry=lambda reason: retries.inc(reason, implementation),
        **kwargs,
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


async def open_oracle(
    url: str,
    *,
    timeline: str = EPOCH_MILLISECONDS,
    implementation: str | None = "distributed",
    batching: bool = True,
    read_only: bool = False,
    now: Callable[[], int] | None = None,
    fencing: str | None = None,
    max_clock_skew_ms: int | None = DEFAULT_MAX_CLOCK_SKEW_MS,
    window: int = DEFAULT_WINDOW,
    pool_size: int = 10,
    retry: RetryPolicy | None = None,
    pipeline_depth: int | None = None,
) -> TimestampOracle:
    """Open an oracle the caller must `close()`; `connect` is the context-manager form.

    `implementation=None` follows the deployment's active implementation. `pipeline_depth`:
    how many batched `read_ts` (and `confirm_leadership`) calls may be in flight at once
    (default 8, fewer when `pool_size` leaves less room: beyond the first, each borrows a
    pool connection while it runs).
    `fencing` overrides the deployment's mode for this process only (for experiments;
    production follows the deployment); like the deployment's mode it only decides whether a
    legacy leader confirms before answering from memory, never whether a fenced process may
    allocate.
    """
    tl = parse_timeline(timeline)
    if implementation is not None:
        check_implementation(implementation)
    if fencing is not None:
        check_mode(fencing)
    if implementation == "legacy" and read_only:
        raise ConfigError.worded(
            "the legacy oracle serves from its leader's memory, so it cannot be read-only; "
            "open read-only clients with {use}", use=Arg("implementation", "distributed"))
    if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
        raise ConfigError.worded("{pool} must be a positive integer, got {got!r}",
                                 pool=Arg("pool_size"), got=pool_size)
    if pipeline_depth is not None and (
            isinstance(pipeline_depth, bool) or not isinstance(pipeline_depth, int)
            or not 1 <= pipeline_depth <= MAX_PIPELINE_DEPTH):
        raise ConfigError.worded("{depth} must be an integer from 1 to {most}, got {got!r}",
                                 depth=Arg("pipeline_depth"), most=MAX_PIPELINE_DEPTH,
                                 got=pipeline_depth)
    impl_label = implementation or "active"
    backend = await open_instrumented_backend(url, impl_label, pool_size=pool_size, retry=retry)
    try:
        dep = await _require_schema(backend)
        if not await timeline_exists(backend, tl.name):
            raise UnknownTimeline(tl.name)
        chosen = implementation or dep.implementation
        if chosen != dep.implementation:
            raise Fenced.worded(
                "the active implementation is {active!r} (epoch {epoch}), not {chosen!r}; use "
                "{use}, or {follow} to follow the active implementation",
                active=dep.implementation, epoch=dep.epoch, chosen=chosen,
                use=Arg("implementation", dep.implementation),
                follow=Arg("implementation", omit=True))
        cls = LegacyOracle if chosen == "legacy" else DistributedOracle
        pinned = cls.pinned_connections
        if backend.pooled and pool_size <= pinned:
            # Pinned connections would take the whole pool and every other statement would
            # wait for a connection that never comes free.
            raise ConfigError.worded(
                "{pool} is too small for the {chosen} oracle: it keeps {pinned} connection(s) "
                "for batched calls and needs at least one more; use {enough} or more",
                pool=Arg("pool_size", pool_size), chosen=chosen, pinned=pinned,
                enough=Arg("pool_size", pinned + 1))
        depth = pipeline_depth or DEFAULT_PIPELINE_DEPTH
        if backend.pooled:
            # Batches beyond the first borrow pool connections; one stays for everything else.
            room = pool_size - pinned
            if pipeline_depth is None:
                depth = max(1, min(depth, room))
            elif depth > room:
                raise ConfigError.worded(
                    "{pool} leaves room for {room} batched call(s) in flight besides the "
                    "{pinned} connection(s) the {chosen} oracle keeps; use {smaller} or {bigger}",
                    pool=Arg("pool_size", pool_size), room=max(room, 0), pinned=pinned,
                    chosen=chosen, smaller=Arg("pipeline_depth", max(room, 1)),
                    bigger=Arg("pool_size", pinned + depth))
        common: dict[str, Any] = dict(read_only=read_only, fencing_override=fencing, now=now,
                      max_clock_skew_ms=max_clock_skew_ms,
                      pipeline_depth=depth)
        if chosen == "legacy":
            legacy = LegacyOracle(backend, tl, dep, window=window, **common)
            await legacy.start()
            metrics.LEADER_EPOCH.set((tl.name,), legacy.leadership.leader_epoch)
            return legacy
        return DistributedOracle(backend, tl, dep, batching=batching, **common)
    except BaseException:
        await backend.close()
        raise


@asynccontextmanager
async def connect(url: str, **kwargs: Any) -> AsyncIterator[TimestampOracle]:
    """`async with tsoracle.connect(url, timeline=…, implementation=…) as oracle: …`"""
    oracle = await open_oracle(url, **kwargs)
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

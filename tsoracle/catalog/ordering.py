"""Commits in oracle order: take W, land the change with the upper raised to W in one
transaction, then `apply_write(W)`; acknowledge only after that.

Why the upper: `read_ts()` returns only timestamps already applied, and a commit is applied
after it raised the upper to its W; so once a reader has T, every commit still to land has a W
above the upper, which is at least T. A commit whose W fell behind (another landed with a
higher one, or a reader sealed above it) lands nothing and tries again with a fresh W.

Legacy: the catalog is one more client of the timeline. On the legacy implementation, the
process that opens the timeline leads it; a replica whose leadership another took answers
503, and is not ready, until the timeline is flipped to distributed (docs/iceberg.md,
"Replicas"). On distributed, replicas share it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from tsoracle.catalog import state
from tsoracle.catalog.errors import CatalogError, CommitFailed, CommitStateUnknown, Unavailable
from tsoracle.catalog.metrics import COMMITS, CONFLICTS, RETRIES
from tsoracle.errors import LeadershipLost, OracleError
from tsoracle.fencing import read_deployment
from tsoracle.oracle import open_oracle
from tsoracle.oracle.reopening import ReopeningOracle
from tsoracle.store import Backend, Tx

R = TypeVar("R")
log = logging.getLogger("tsoracle.catalog")
MAX_ATTEMPTS = 8  # fresh timestamps a commit may take before it reports contention


@dataclass
class Plan(Generic[R]):
    """What one commit lands at W: pointer moves (and drops, renames), the metadata files it
    wrote beforehand (deleted if it lands nothing), and the result to answer with."""

    result: R
    swaps: list[state.Swap] = field(default_factory=list)
    drops: list[state.Pointer] = field(default_factory=list)
    renames: list[tuple[state.Pointer, state.Namespace, str]] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    extra: Callable[[Tx], Awaitable[None]] | None = None  # e.g. a namespace's properties


class Ordering:
    """The catalog's timeline: timestamps from the oracle, the upper in the catalog's rows."""

    def __init__(self, url: str, timeline: str, backend: Backend,
                 cleanup: Callable[[list[str]], Awaitable[None]]) -> None:
        self.timeline = timeline
        self.backend = backend
        self._cleanup = cleanup
        self.oracle = ReopeningOracle(
            lambda: open_oracle(url, timeline=timeline, implementation=None), name=timeline,
            still_lost=self._legacy_active)

    async def _legacy_active(self) -> bool:
        """A replica that lost a legacy timeline serves again once it is flipped away."""
        return (await read_deployment(self.backend)).implementation == "legacy"

    async def ready(self) -> None:
        """Raise `Unavailable` unless this replica can serve commits now."""
        await self._oracle_call(lambda: self.oracle.current())

    async def read_ts(self) -> int:
        """A timestamp every later commit lands above: `read_ts()`, then the upper sealed
        there (the timeline may have writers besides this catalog)."""
        ts = await self._oracle_call(lambda: self.oracle.read_ts())
        await state.raise_upper(self.backend, self.timeline, ts)
        return ts

    async def closed(self) -> int:
        """The upper: nothing can commit at or below it any more (no oracle round trip)."""
        return await state.upper(self.backend, self.timeline)

    async def commit(self, build: Callable[[int, int], Awaitable[Plan[R]]]) -> R:
        """Land `build(W, attempt)`'s plan at a fresh W, retrying while W falls behind or a
        pointer moved under it; `build` checks the requirements again each time."""
        for attempt in range(MAX_ATTEMPTS):
            landed = await self._attempt(build, attempt)
            if landed is not None:
                COMMITS.inc()
                return landed[0]
            RETRIES.inc()
        raise CommitFailed(f"the commit lost {MAX_ATTEMPTS} races for the catalog's timeline "
                           f"{self.timeline!r} in a row; try again")

    async def _attempt(self, build: Callable[[int, int], Awaitable[Plan[R]]],
                       attempt: int) -> tuple[R] | None:
        ts = (await self._oracle_call(lambda: self.oracle.write_ts())).timestamp
        plan = await build(ts, attempt)
        try:
            await self.backend.transaction(lambda tx: self._land(tx, plan, ts))
        except (state.Superseded, state.Moved) as exc:
            await self._cleanup(plan.written)
            CONFLICTS.labels(_kind(exc)).inc()
            return None
        except CatalogError:
            await self._cleanup(plan.written)
            raise
        except OracleError as exc:
            # The transaction's outcome is unknown (its COMMIT may have landed): keep the
            # files, and tell the client not to apply its changes again.
            raise CommitStateUnknown(
                f"the catalog's database did not confirm the commit ({exc.__class__.__name__}"
                "); load the table to see whether it landed before retrying") from None
        try:
            await self._oracle_call(lambda: self.oracle.apply_write(ts))
        except CatalogError as exc:
            raise CommitStateUnknown(
                f"the commit landed at {ts} but the oracle did not confirm it "
                f"({exc.message}); it becomes visible once the oracle is back") from None
        return (plan.result,)

    async def _land(self, tx: Tx, plan: Plan[R], ts: int) -> None:
        if await _landed(tx, plan):
            return  # this body ran before and its COMMIT landed; the reply was lost
        await state.claim(tx, self.backend, self.timeline, ts)
        await state.swap(tx, plan.swaps)
        for gone in plan.drops:
            await state.remove(tx, gone.namespace, gone.name, gone.kind, gone.metadata_location)
        for source, ns, name in plan.renames:
            await state.rename(tx, source, ns, name)
        if plan.extra is not None:
            await plan.extra(tx)

    async def _oracle_call(self, fn: Callable[[], Awaitable[R]]) -> R:
        try:
            return await fn()
        except LeadershipLost:
            raise Unavailable(
                f"another process leads the legacy timeline {self.timeline!r}; this catalog "
                "replica serves no commits until the deployment is flipped to the distributed "
                "implementation (`tsoracle flip --to distributed`)") from None
        except OracleError as exc:
            raise Unavailable(f"the oracle is unavailable: {exc}") from None

    async def close(self) -> None:
        await self.oracle.close()


async def _landed(tx: Tx, plan: Plan[R]) -> bool:
    """Whether this plan's effects are already there (a retried transaction body)."""
    if plan.swaps:
        first = plan.swaps[0]
        found = await state.pointer(tx, first.namespace, first.name)
        return found is not None and found.metadata_location == first.new
    if plan.renames:
        source, ns, name = plan.renames[0]
        moved = await state.pointer(tx, ns, name)
        still = await state.pointer(tx, source.namespace, source.name)
        return still is None and moved is not None \
            and moved.metadata_location == source.metadata_location
    return False


def _kind(exc: Exception) -> str:
    return "superseded" if isinstance(exc, state.Superseded) else "moved"

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

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

from tsoracle.catalog import idempotency, state
from tsoracle.catalog.errors import (
    BadRequest,
    CatalogError,
    CommitStateUnknown,
    Contended,
    Unavailable,
    location_taken,
)
from tsoracle.catalog.metrics import COMMITS, CONFLICTS, GROUP_SIZE, RETRIES
from tsoracle.errors import LeadershipLost, OracleError, Refused
from tsoracle.fencing import read_deployment
from tsoracle.oracle import open_oracle
from tsoracle.oracle.api import wall_clock_ms
from tsoracle.oracle.commit_engine import (
    Attempt,
    Conflict,
    Failed,
    Groups,
    Landed,
    Outcome,
    Unknown,
    retry,
)
from tsoracle.oracle.reopening import ReopeningOracle
from tsoracle.oracle.timeline import EPOCH_MILLISECONDS
from tsoracle.store import Backend, Tx

R = TypeVar("R")
# While a commit chained behind others of its group is built: (namespace, name) -> the metadata
# location and metadata those leave the table at (`based_on`).
BASES: ContextVar[dict[tuple[Any, ...], tuple[str, Any]] | None] = ContextVar(
    "tsoracle_bases", default=None)
log = logging.getLogger("tsoracle.catalog")
MAX_ATTEMPTS = 8  # fresh timestamps a commit may take before it reports contention
MAX_GROUP = 256  # commits landed in one transaction at most
# How long after a read timestamp was handed out reads at it keep their snapshots: snapshot
# expiry may remove nothing they need (the serializable read window of spark.Lakehouse).
DEFAULT_RETENTION_S = 3600.0


@dataclass
class Plan(Generic[R]):
    """What one commit lands at W: pointer moves (and drops, renames), the metadata files it
    wrote beforehand (deleted if it lands nothing), and the result to answer with."""

    result: R
    swaps: list[state.Swap] = field(default_factory=list)
    drops: list[state.Pointer] = field(default_factory=list)
    renames: list[tuple[state.Pointer, state.Namespace, str]] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    # (namespace, name, resolved location): the folders this plan gives tables or views; each
    # must be free of every other table's and view's when it lands.
    locations: list[tuple[state.Namespace, str, str]] = field(default_factory=list)
    mark: idempotency.Mark | None = None  # the request's Idempotency-Key, landed with it
    # (namespace, name) -> (metadata location, metadata) this plan leaves the table at: a
    # later commit to the table in the same group is built on it.
    after: dict[tuple[Any, ...], tuple[str, Any]] = field(default_factory=dict)

    def keys(self) -> set[tuple[Any, ...]]:
        """The names this plan changes: two plans that share one cannot land together."""
        return {*((s.namespace, s.name) for s in self.swaps),
                *((d.namespace, d.name) for d in self.drops),
                *((r[0].namespace, r[0].name) for r in self.renames),
                *((r[1], r[2]) for r in self.renames)}


def based_on(key: tuple[Any, ...]) -> tuple[str, Any] | None:
    """The metadata a commit being built must start from if earlier members of its group
    change the table `key` (their last one's location and metadata), else None."""
    bases = BASES.get()
    return None if bases is None else bases.get(key)


class Ordering:
    """The catalog's timeline: timestamps from the oracle, the upper in the catalog's rows."""

    def __init__(self, url: str, timeline: str, backend: Backend,
                 cleanup: Callable[[list[str]], Awaitable[None]],
                 retention_s: float = DEFAULT_RETENTION_S,
                 keys_kept_s: int = idempotency.DEFAULT_LIFETIME_S + idempotency.GRACE_S
                 ) -> None:
        self.timeline = timeline
        self.retention_ms = int(retention_s * 1000)
        self.keys_kept_ms = keys_kept_s * 1000  # Idempotency-Key rows, pruned with the marks
        self.backend = backend
        self._cleanup = cleanup
        self._groups: Groups[_Item] = Groups(self._flush, self._stopped, MAX_GROUP)
        self._told: BaseException | None = None  # the last group failure logged
        self._pruned_at = float("-inf")  # monotonic time of the last pruning of commit marks
        self._pruning: asyncio.Task[None] | None = None
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

    async def horizon(self, ts: int) -> int:
        """The oldest timestamp a read may still be at, for a commit at `ts`: reads at any T
        at or above it must keep their snapshots. On the EpochMilliseconds timeline,
        `ts - retention`; on a counting timeline, just below the first commit of the window
        (by the commit marks, which are kept at least that long), or `ts - 1` if none."""
        if self.timeline == EPOCH_MILLISECONDS:
            return ts - self.retention_ms
        first = await state.first_commit_since(self.backend, self.timeline,
                                               wall_clock_ms() - self.retention_ms)
        return (first if first is not None else ts) - 1

    async def commit(self, build: Callable[[int, int], Awaitable[Plan[R]]],
                     tables: frozenset[tuple[Any, ...]] = frozenset()) -> R:
        """Land `build(W, attempt)`'s plan at a fresh W, retrying while W falls behind or a
        pointer moved under it; `build` checks the requirements again each time. `tables`:
        the tables a commit of table changes changes, known before it is built; such commits
        to one table share a group, each built on the one before (`based_on`)."""
        result = await retry(
            lambda attempt: self._attempt(build, attempt, tables), attempts=MAX_ATTEMPTS,
            what="a commit", on_conflict=RETRIES.inc,
            exhausted=lambda: Contended(
                f"the commit lost {MAX_ATTEMPTS} races for the catalog's timeline "
                f"{self.timeline!r} in a row; try again"))
        COMMITS.inc()
        return cast(R, result)

    async def _attempt(self, build: Callable[[int, int], Awaitable[Plan[Any]]],
                       attempt: int, tables: frozenset[tuple[Any, ...]] = frozenset()
                       ) -> Outcome:
        """One try in the next group."""
        # The key is the request's: the group lands in the task of whichever came first.
        return await self._groups.submit(
            _Item(build, attempt, idempotency.CURRENT.get(), tables))

    def _stopped(self, exc: BaseException, started: bool) -> Outcome:
        """The outcome of a commit whose group failed unexpectedly (a bug) or was stopped."""
        if not started:
            return Failed(Unavailable("the catalog stopped before this commit was tried; "
                                      "nothing of it landed: send it again"))
        if exc is not self._told:  # the same error for each commit of a group: logged once
            self._told = exc
            if isinstance(exc, asyncio.CancelledError):
                log.warning("a commit group was stopped (cancelled) while landing")
            else:
                log.error("a commit group failed unexpectedly: %s", exc.__class__.__name__)
        # Whether its commits landed is not known here.
        return Unknown(CommitStateUnknown(
            f"the catalog failed unexpectedly ({exc.__class__.__name__}) around this commit; "
            "load the table to see whether it landed before retrying (or send it again with "
            "its Idempotency-Key, if it had one)"))

    async def _flush(self, group: list[Attempt[_Item]]) -> None:
        try:
            ts = (await self._oracle_call(lambda: self.oracle.write_ts())).timestamp
        except CatalogError as exc:
            for w in group:
                w.settle(Failed(exc))
            return
        built = await self._build(group, ts)
        landed = await self._land_group(built.members, ts) if built.members else None
        self._groups.requeue(built.later)
        landed_ids = {id(w) for w, _ in landed or ()}
        for w, refusal, on in built.held:
            # Refused on what earlier members leave: true only if they all landed.
            w.settle(Failed(refusal) if on <= landed_ids
                     else Conflict("built on a commit that did not land"))
        if not landed:
            return
        try:
            await self._oracle_call(lambda: self.oracle.apply_write(ts))
        except CatalogError as exc:
            for w, _ in landed:
                w.settle(Unknown(CommitStateUnknown(
                    f"the commit landed at {ts} but the oracle did not confirm it "
                    f"({exc.message}); it becomes visible once the oracle is back")))
            return
        for w, plan in landed:
            w.settle(Landed(plan.result))
        self._prune_soon()

    async def _build(self, group: list[_Queued], ts: int) -> _Built:
        """The group's plans at `ts`: built at once, except that a table commit to a table
        an earlier table commit of the group changes is built after the others, on the
        metadata the last of those leaves."""
        now: list[_Queued] = []
        chained: list[_Queued] = []
        claimed: set[tuple[Any, ...]] = set()
        for w in group:
            (chained if w.item.tables & claimed else now).append(w)
            claimed |= w.item.tables
        built = await asyncio.gather(*(w.item.build(ts, w.item.attempt) for w in now),
                                     return_exceptions=True)
        out = _Built()
        touched: dict[tuple[Any, ...], tuple[_Queued, Plan[Any]]] = {}  # the last to change
        for w, plan in [*zip(now, built, strict=True), *((w, None) for w in chained)]:
            on: dict[tuple[Any, ...], tuple[_Queued, Plan[Any]]] | None = None
            if plan is None:  # chained: built now, on the metadata its predecessors leave
                on = {k: touched[k] for k in w.item.tables if k in touched}
                if any(k not in p.after for k, (_, p) in on.items()):
                    out.later.append(w)  # dropped or renamed in this group: the next one
                    continue
                plan = await self._build_on(w, ts, {k: p.after[k] for k, (_, p) in on.items()})
            if isinstance(plan, BaseException):
                if on:
                    out.held.append((w, plan, {id(v) for v, _ in on.values()}))
                else:
                    w.settle(Failed(plan))
            elif any(k in touched and k not in (on or {}) for k in plan.keys()):
                # A name twice, unforeseen (a create beside a drop): the next group.
                await self._cleanup(plan.written)
                out.later.append(w)
            else:
                touched.update(dict.fromkeys(plan.keys(), (w, plan)))
                plan.mark = w.item.mark
                out.members.append((w, plan))
        return out

    @staticmethod
    async def _build_on(w: _Queued, ts: int, bases: dict[tuple[Any, ...], tuple[str, Any]]
                        ) -> Plan[Any] | BaseException:
        token = BASES.set(bases)
        try:
            return await w.item.build(ts, w.item.attempt)
        except Exception as exc:  # the flusher's own cancellation goes on up
            return exc
        finally:
            BASES.reset(token)

    async def _land_group(self, members: list[tuple[_Queued, Plan[Any]]], ts: int
                          ) -> list[tuple[_Queued, Plan[Any]]] | None:
        """One transaction for the group: the upper raised to `ts` and each plan landed, or
        refused alone (its table moved, its own error) while the rest land. Returns the
        members that landed (the others were answered), or None."""
        try:
            sent = _at_once(self.backend, members)
            result = await self._land_at_once(members, ts) if sent else None
            if result is None:
                result = await self.backend.transaction(self._one_by_one(members, ts, sent))
        except (state.Superseded, _NothingLanded, CatalogError, OracleError) as exc:
            await self._nothing_landed(members, exc)
            return None
        landed = []
        for i, (w, plan) in enumerate(members):
            if result[i] is True:
                landed.append((w, plan))
                continue
            if not isinstance(result[i], CommitStateUnknown):  # may have landed: keep them
                await self._cleanup(plan.written)
            self._settle(w, result[i])
        GROUP_SIZE.observe(len(landed))
        return landed

    async def _land_at_once(self, members: list[tuple[_Queued, Plan[Any]]], ts: int
                            ) -> dict[int, bool | CatalogError] | None:
        """The group in one round trip: the claim, then each plan's one pointer move (with
        its key). A group none of whose plans moved still raises the upper, as a read does.
        None: it failed as a whole (the upper passed `ts`, a key was taken, the database
        refused a plan's data, or a send whose reply was lost landed and its retry failed on
        what it left), and `_one_by_one` sorts out which."""
        now = wall_clock_ms()
        statements = [state.claim_at_once(self.backend, self.timeline, ts, now)]
        statements += [state.swap_at_once(plan.swaps[0], _key_row(plan.mark), now)
                       for _, plan in members]
        try:
            rows = await self.backend.at_once(statements)
        except Refused:
            return None
        return {i: bool(moved) for i, moved in enumerate(rows[1:])}

    def _one_by_one(self, members: list[tuple[_Queued, Plan[Any]]], ts: int,
                    sent: bool = False
                    ) -> Callable[[Tx], Awaitable[dict[int, bool | CatalogError]]]:
        """The group's transaction a statement at a time, each plan in a savepoint. `sent`:
        the group was sent at once before, and may have landed."""
        # index -> landed, moved (False) or its own refusal, as the last complete body left it
        outcome: dict[int, bool | CatalogError] = {}
        plans = [plan for _, plan in members]

        async def landed_before(tx: Tx) -> dict[int, bool | CatalogError] | None:
            if not (sent or any(v is True for v in outcome.values())):
                return None  # never ran to its end: cannot have landed
            if not await state.committed(tx, self.timeline, ts):
                return None
            # It landed, its reply lost: what it told, or (sent at once) where the pointers are.
            return dict(outcome) if outcome else await _landed_before(tx, plans)

        async def body(tx: Tx) -> dict[int, bool | CatalogError]:
            if (before := await landed_before(tx)) is not None:
                return before
            try:
                await state.claim(tx, self.timeline, ts)
            except state.Superseded:
                # The earlier attempt's COMMIT may still have been under way on the server
                # when the mark was looked for; claim waited for its lock: look again.
                if (before := await landed_before(tx)) is not None:
                    return before
                raise
            result = await _apply_each(tx, plans)
            await state.record_commit(tx, self.timeline, ts, wall_clock_ms())
            outcome.clear()
            outcome.update(result)
            return result

        return body

    async def _nothing_landed(self, members: list[tuple[_Queued, Plan[Any]]],
                              exc: Exception) -> None:
        """Answer a group whose transaction failed with `exc`."""
        if isinstance(exc, OracleError):
            # The transaction's outcome is unknown (its COMMIT may have landed): keep the
            # files, and tell the clients not to apply their changes again.
            for w, _ in members:
                w.settle(Unknown(CommitStateUnknown(
                    f"the catalog's database did not confirm the commit ("
                    f"{exc.__class__.__name__}); load the table to see whether it landed "
                    "before retrying (or send it again with its Idempotency-Key, if it had "
                    "one)")))
            return
        for i, (w, plan) in enumerate(members):
            await self._cleanup(plan.written)
            if isinstance(exc, state.Superseded):
                CONFLICTS.labels("superseded").inc()
                w.settle(Conflict("its timestamp fell behind the upper"))
            elif isinstance(exc, _NothingLanded):
                self._settle(w, exc.result[i])
            else:
                w.settle(Failed(exc))

    @staticmethod
    def _settle(w: _Queued, outcome: bool | CatalogError) -> None:
        """Answer a member that did not land: try again (its table moved) or its own error."""
        if isinstance(outcome, CommitStateUnknown):
            w.settle(Unknown(outcome))
        elif isinstance(outcome, CatalogError):
            w.settle(Failed(outcome))
        else:
            CONFLICTS.labels("moved").inc()
            w.settle(Conflict("its table moved"))

    def _prune_soon(self) -> None:
        """Forget old commits' marks, once a minute at most, beside the commits (not in their
        path); best effort: a failure only leaves them for the next time."""
        now = time.monotonic()
        if now - self._pruned_at < 60 or self._pruning is not None:
            return
        self._pruned_at = now
        self._pruning = asyncio.create_task(self._prune())

    async def _prune(self) -> None:
        try:
            now = wall_clock_ms()
            await state.prune_commits(self.backend, self.timeline, now, self.retention_ms)
            await state.prune_keys(self.backend, now - self.keys_kept_ms)
        except Exception as exc:
            log.debug("pruning commit marks failed: %s", exc.__class__.__name__)
        finally:
            self._pruning = None

    async def _oracle_call(self, fn: Callable[[], Awaitable[R]]) -> R:
        try:
            return await fn()
        except LeadershipLost:
            raise Unavailable(
                f"another process leads the legacy timeline {self.timeline!r}; this catalog "
                "replica serves no commits until the deployment is flipped to the distributed "
                "implementation (`tsoracle flip --to distributed`)") from None
        except OracleError as exc:
            # Its message may name the database (user, host, port): the log gets the kind,
            # a client nothing of it.
            log.warning("the oracle of %r failed: %s", self.timeline, exc.__class__.__name__)
            raise Unavailable("the catalog's oracle is unavailable; try again later (the "
                              "catalog's log says why)") from None

    async def close(self) -> None:
        if self._pruning is not None:
            await asyncio.gather(self._pruning, return_exceptions=True)
        await self.oracle.close()


async def _apply_each(tx: Tx, plans: list[Plan[Any]]) -> dict[int, bool | CatalogError]:
    """Each plan in a savepoint of its own: one whose table moved, or that the database
    refuses (its data, a name a concurrent change took), lands nothing and the others land, at
    once, without a retry of the whole group. A plan alone needs none (two round trips
    fewer): its failure rolls all back. Raises `_NothingLanded` if none landed."""
    alone = len(plans) == 1
    result: dict[int, bool | CatalogError] = {}
    for i, plan in enumerate(plans):
        if not alone:
            await tx.fetch("SAVEPOINT tsoracle_plan")
        try:
            await _apply(tx, plan)
            if not alone:
                await tx.fetch("RELEASE SAVEPOINT tsoracle_plan")
            result[i] = True
        except (state.Moved, Refused, CatalogError) as exc:
            if not alone:
                await tx.fetch("ROLLBACK TO SAVEPOINT tsoracle_plan")
            result[i] = _refused_alone(exc)
    if not any(v is True for v in result.values()):
        raise _NothingLanded(result)
    return result


def _at_once(backend: Backend, members: list[tuple[_Queued, Plan[Any]]]) -> bool:
    """Whether the group can be sent at once: every plan moves one existing pointer and does
    nothing else (the table commits, nearly all of a catalog's traffic)."""
    return backend.sends_at_once and all(
        len(p.swaps) == 1 and p.swaps[0].expected is not None
        and not (p.drops or p.renames or p.locations) for _, p in members)


def _key_row(mark: idempotency.Mark | None) -> tuple[str, str, int] | None:
    return None if mark is None else (mark.key, mark.fingerprint, mark.expired_ms)


async def _landed_before(db: Backend | Tx, plans: list[Plan[Any]]
                         ) -> dict[int, bool | CatalogError]:
    """Which of a group's plans (one pointer move each) landed, from where the pointers are:
    a plan landed if its table points at its metadata or at a later plan's of the group (a
    chain on one table lands up to its first move that failed, and only the first can fail).
    Any other pointer may be a later commit's over this one's: not known."""
    result: dict[int, bool | CatalogError] = {}
    for i, plan in enumerate(plans):
        move = plan.swaps[0]
        now = await state.pointer(db, move.namespace, move.name)
        ours = {p.swaps[0].new for p in plans[i:]
                if (p.swaps[0].namespace, p.swaps[0].name) == (move.namespace, move.name)}
        result[i] = (now is not None and now.metadata_location in ours) or CommitStateUnknown(
            "the catalog's database lost its reply to this commit, and the table has moved "
            "since; load the table to see whether it landed before retrying (or send it again "
            "with its Idempotency-Key, if it had one)")
    return result


async def _apply(tx: Tx, plan: Plan[Any]) -> None:
    if plan.mark is not None:
        await idempotency.record_mark(tx, plan.mark)
    await state.swap(tx, plan.swaps)
    for gone in plan.drops:
        await state.remove(tx, gone.namespace, gone.name, gone.kind, gone.metadata_location)
        await state.forget_location(tx, gone.namespace, gone.name)
    for source, ns, name in plan.renames:
        await state.rename(tx, source, ns, name)
        await state.move_location(tx, source, ns, name)
    for ns, name, location in plan.locations:
        user = await state.location_user(tx, location, ns, name)
        if user is not None:
            raise location_taken(location, (*ns, name), (*user[0], user[1]))
        await state.record_location(tx, ns, name, location)


class _NothingLanded(Exception):
    """No plan of a group landed (moved or refused): roll back the upper too."""

    def __init__(self, result: dict[int, bool | CatalogError]) -> None:
        super().__init__("nothing landed")
        self.result = result


def _refused_alone(exc: Exception) -> bool | CatalogError:
    """What a plan that failed inside its savepoint gets: False (try again with a fresh W) if
    its table moved or a concurrent change took a name it adds, else its own error."""
    if isinstance(exc, state.Moved):
        return False
    if isinstance(exc, Refused):
        if exc.kind == "duplicate":
            return False
        return BadRequest(f"the catalog's database refused this request's data ({exc}); "
                          "shorten or correct the names and properties it sends")
    assert isinstance(exc, CatalogError)
    return exc


@dataclass
class _Built:
    """A group's plans: the members that land together, the ones refused on metadata earlier
    members leave (each with the ids of those members: the refusal stands only if they all
    land), and the ones for the next group."""

    members: list[tuple[_Queued, Plan[Any]]] = field(default_factory=list)
    held: list[tuple[_Queued, BaseException, set[int]]] = field(default_factory=list)
    later: list[_Queued] = field(default_factory=list)


@dataclass(frozen=True)
class _Item:
    """What a commit attempt brings to its group: its plan's builder and attempt number, its
    request's Idempotency-Key, and the tables it changes if known before it is built."""

    build: Callable[[int, int], Awaitable[Plan[Any]]]
    attempt: int
    mark: idempotency.Mark | None = None
    tables: frozenset[tuple[Any, ...]] = frozenset()


_Queued = Attempt[_Item]

"""Fencing modes and the deployment row (the guard the storage evaluates on every statement is
`{guard}`, in fencing/tables.py).

The deployment row is the source of truth (epoch, active implementation, fencing mode, rollout
flag). Flips copy it into every per-timeline row in the same transaction, so a guarded statement
checks the row it touches. That matters on PostgreSQL: an UPDATE that waited for a flip's row lock
re-reads the locked row, but not other tables, so the check must live in that row.
"""

from __future__ import annotations

from dataclasses import dataclass

from tsoracle.errors import Arg, ConfigError, Fenced, Reprovisioned
from tsoracle.fencing.planned import PlannedBy, StalePlan
from tsoracle.store import Backend, Tx

MODES = ("Always", "Rollout", "Disabled")
IMPLEMENTATIONS = ("legacy", "distributed")

def confirms_reads(mode: str) -> bool:
    """Whether a legacy leader confirms its leadership before answering from memory."""
    return mode != "Disabled"


@dataclass(frozen=True)
class Deployment:
    epoch: int
    implementation: str
    fence: str
    rollout: bool
    incarnation: str = ""
    owner: str = ""  # the uid of the TimestampOracle resource that provisioned it, if any
    generation: int = 0  # that resource's generation last applied (flip, fencing)

    def guard_params(self) -> dict[str, object]:
        """What {guard} compares against, for a process that opened under this row."""
        return {"epoch": self.epoch, "incarnation": self.incarnation}


_READ = ("SELECT epoch, implementation, fence, rollout, incarnation, owner, generation"
         " FROM {deployment} WHERE id = 1")


# Every timestamp row in key order: the second half of `lock_deployment`'s fixed order.
_LOCK_ROWS = ("SELECT timeline, implementation, read_ts, write_ts FROM {timestamps}"
              " ORDER BY timeline, implementation FOR UPDATE")


async def lock_deployment(tx: Tx) -> tuple[Deployment, list[tuple[object, ...]]]:
    """Lock the timestamp rows, then the deployment row; return the deployment and the rows
    (timeline, implementation, read_ts, write_ts), read under those locks.

    Every transaction that changes the deployment takes its locks in this order. The rows come
    first because writers keep changing them: under SERIALIZABLE (always on CockroachDB) a
    transaction whose snapshot predates a writer's commit cannot lock that row any more, so a
    flip that read the deployment row first failed with 40001 on every attempt while writers
    ran. Where the dialect has one, a table lock taken before any read (which takes no snapshot
    in PostgreSQL) makes writers wait for us instead; CockroachDB retries a first statement that
    locks rows on its own.
    """
    for statement in tx.dialect.lock_rows("timestamps"):
        await tx.fetch(statement)
    rows = await tx.fetch(_LOCK_ROWS)
    return await read_deployment(tx, for_update=True), rows


async def read_deployment(db: Backend | Tx, *, for_update: bool = False) -> Deployment:
    rows = await db.fetch(_READ + (" FOR UPDATE" if for_update else ""))
    if not rows:
        raise Fenced("the deployment row is missing; run `tsoracle init` to provision the schema")
    epoch, impl, fence, rollout, incarnation, owner, generation = rows[0]
    return Deployment(int(epoch), str(impl), str(fence), bool(rollout), str(incarnation),
                      str(owner), int(generation))


# What a user may type for a mode, in any case: the modes, and on/off (the plugin's first
# spelling). One list for the CLI and the plugin.
MODE_ALIASES = {"on": "Always", "off": "Disabled"}
# What a mode gives up, said where it is set (CLI and plugin).
MODE_WARNINGS = {
    "Disabled": "warning: with fencing Disabled a legacy leader no longer confirms its "
                "leadership before answering from memory: after a flip or a take-over, one "
                "superseded leader can serve stale reads for up to a second (timestamps stay "
                "unique)",
    "Rollout": "note: after each flip, processes on the old epoch are fenced only for the "
               "rollout window (spec.rolloutWindowSeconds, which the operator ends; without "
               "the operator, `tsoracle finish-rollout --url …` ends it)",
}


def parse_mode(text: str) -> str | None:
    """The mode `text` names (any case, or on/off), or None."""
    spelled = {m.lower(): m for m in MODES} | MODE_ALIASES
    return spelled.get(text.strip().lower())


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ConfigError(f"fencing mode {mode!r} is not one of {', '.join(MODES)}")
    return mode


def check_implementation(implementation: str) -> str:
    if implementation not in IMPLEMENTATIONS:
        raise ConfigError(
            f"implementation {implementation!r} is not one of {', '.join(IMPLEMENTATIONS)}"
        )
    return implementation


def moved(opened: Deployment, now: Deployment, implementation: str) -> bool:
    """Whether a process opened under `opened` on `implementation` is superseded by `now`."""
    return (now.incarnation != opened.incarnation or now.epoch != opened.epoch
            or now.implementation != implementation)


def superseded(opened: Deployment, now: Deployment, implementation: str) -> Fenced:
    """The error a process gets once the deployment moved on without it."""
    if now.incarnation != opened.incarnation:
        return Reprovisioned(
            f"this {implementation} oracle was fenced: its deployment was deleted and "
            f"provisioned again (incarnation {opened.incarnation or '-'} -> {now.incarnation}), "
            "so timestamps restarted; reopen it, and do not mix its earlier timestamps with "
            "new ones"
        )
    if now.implementation != implementation:
        what = f"the active implementation is now {now.implementation!r} (epoch {now.epoch})"
    else:
        what = f"the epoch moved from {opened.epoch} to {now.epoch}"
    return Fenced.worded("this {impl} oracle was fenced: {what}; reopen it with {use}",
                         impl=implementation, what=what,
                         use=Arg("implementation", now.implementation))


def admit(dep: Deployment, by: PlannedBy | None) -> None:
    """Raise StalePlan unless the deployment (read under its lock) accepts `by`'s steps; a
    step without a planner (the CLI, a person) is always accepted."""
    if by is None:
        return
    why = by.refusal(dep.owner, dep.generation)
    if why is not None:
        raise StalePlan(why)


async def set_fencing(backend: Backend, mode: str, *, by: PlannedBy | None = None) -> Deployment:
    """Change the fencing mode everywhere in one transaction. With `by`, only for a planner
    the deployment still follows (`PlannedBy`), whose generation it then records."""
    check_mode(mode)

    async def body(tx: Tx) -> Deployment:
        dep, _ = await lock_deployment(tx)
        admit(dep, by)
        if by is not None:
            await tx.fetch("UPDATE {deployment} SET generation = %(g)s WHERE id = 1",
                           {"g": by.generation})
        params = {"fence": mode}
        await tx.fetch(
            "UPDATE {deployment} SET fence = %(fence)s,"
            " rollout = CASE WHEN %(fence)s = 'Rollout' THEN rollout ELSE FALSE END WHERE id = 1",
            params,
        )
        await tx.fetch(
            "UPDATE {timestamps} SET fence = %(fence)s,"
            " rollout = CASE WHEN %(fence)s = 'Rollout' THEN rollout ELSE FALSE END",
            params,
        )
        return await read_deployment(tx)

    return await backend.transaction(body)


async def record_generation(backend: Backend, by: PlannedBy) -> Deployment:
    """Record that the owning resource's generation is being acted on, even where the pass
    changes nothing: a pass of an older generation, planned earlier and resumed late (a paused
    operator), is then refused by every guarded step. The recorded generation only moves
    forward, and only for the owner; StalePlan when this pass is out of date."""
    # The deployment row alone is locked: no cycle with lock_deployment's order.
    await backend.fetch("UPDATE {deployment} SET generation = %(g)s"
                        " WHERE id = 1 AND owner = %(owner)s AND generation < %(g)s",
                        {"g": by.generation, "owner": by.owner})
    dep = await read_deployment(backend)
    admit(dep, by)
    return dep


async def finish_rollout(backend: Backend, *, by: PlannedBy | None = None,
                         epoch: int | None = None) -> Deployment:
    """Mark the rollout done: in Rollout mode, processes on the active side stop re-checking.

    With `by`, only for a planner the deployment still follows (StalePlan otherwise); with
    `epoch`, a pass that timed the window of an earlier flip changes nothing (a flip since
    then opened a new window)."""

    async def body(tx: Tx) -> Deployment:
        dep, _ = await lock_deployment(tx)
        admit(dep, by)
        if epoch is not None and epoch != dep.epoch:
            return dep
        await tx.fetch("UPDATE {deployment} SET rollout = FALSE WHERE id = 1")
        await tx.fetch("UPDATE {timestamps} SET rollout = FALSE")
        return await read_deployment(tx)

    return await backend.transaction(body)


async def fence_everyone(backend: Backend, *, above: int = 0,
                         by: PlannedBy | None = None) -> Deployment:
    """Bump the epoch past both the current one and `above`, and every timeline's leader epoch:
    every process reopens, as after a flip, the implementation unchanged. For a deployment that
    went back in time (restored): a process that opened under an epoch the restore brought
    back, or a legacy leader serving a window the restore forgot, must not go on. With `by`,
    only for a planner the deployment still follows (StalePlan otherwise)."""

    async def body(tx: Tx) -> Deployment:
        dep, _ = await lock_deployment(tx)
        admit(dep, by)
        epoch = max(dep.epoch, above) + 1
        await tx.fetch("UPDATE {deployment} SET epoch = %(epoch)s WHERE id = 1", {"epoch": epoch})
        await tx.fetch("UPDATE {timestamps} SET epoch = %(epoch)s,"
                       " leader_epoch = leader_epoch + 1", {"epoch": epoch})
        return await read_deployment(tx)

    return await backend.transaction(body)


async def count_pass(backend: Backend, at_least: int, by: PlannedBy) -> tuple[int, int]:
    """Count an operator pass in the deployment row: (the count the row held, the count now,
    at least `at_least`); only the owner counts (StalePlan for anyone else). The row's count is
    the database's own memory of how many passes it saw; a restore takes it back with
    everything else, so a count below the one the operator published (outside the database)
    is how a restore is told even after writers have pushed the timestamps back up."""
    rows = await backend.fetch("SELECT operator_pass, owner, generation FROM {deployment}"
                               " WHERE id = 1")
    before, owner, generation = int(rows[0][0]), str(rows[0][1]), int(rows[0][2])
    why = by.refusal(owner, generation)
    if why is not None:
        raise StalePlan(why)
    await backend.fetch("UPDATE {deployment} SET operator_pass = GREATEST(operator_pass,"
                        " %(n)s) WHERE id = 1 AND owner = %(owner)s",
                        {"n": at_least, "owner": by.owner})
    return before, max(before, at_least)


@dataclass(frozen=True)
class FlipClock:
    """When the deployment's current rollout window opened, as the database records it: the
    epoch of the flip that opened it and that flip's time (ms since the Unix epoch; 0 when
    not recorded: a schema from an earlier release, or an epoch a restore repair moved)."""

    epoch: int
    at_ms: int

    def times(self, dep: Deployment) -> bool:
        """Whether this clock times `dep`'s current window."""
        return self.epoch == dep.epoch and self.at_ms > 0


async def read_flip_clock(backend: Backend) -> FlipClock:
    rows = await backend.fetch("SELECT flip_epoch, flipped_ms FROM {deployment} WHERE id = 1")
    return FlipClock(int(rows[0][0]), int(rows[0][1])) if rows else FlipClock(0, 0)


async def start_flip_clock(backend: Backend, epoch: int, at_ms: int, by: PlannedBy) -> bool:
    """Time the window of `epoch` from `at_ms`, where nothing times it usably yet (another
    epoch's time, none, or one after `at_ms`); only for the owner. Returns whether this call
    set it."""
    rows = await backend.fetch(
        "UPDATE {deployment} SET flip_epoch = %(epoch)s, flipped_ms = %(at)s"
        " WHERE id = 1 AND epoch = %(epoch)s AND owner = %(owner)s"
        " AND (flip_epoch <> %(epoch)s OR flipped_ms <= 0 OR flipped_ms > %(at)s)"
        " RETURNING epoch",
        {"epoch": epoch, "at": at_ms, "owner": by.owner})
    return bool(rows)

"""Flipping the active implementation, with max-timestamp bootstrap and an epoch bump."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tsoracle.fencing import PlannedBy, admit, check_implementation, lock_deployment
from tsoracle.fencing.tables import ADDED_COLUMNS
from tsoracle.oracle.api import wall_clock_ms
from tsoracle.store import Backend, Tx, schema


@dataclass(frozen=True)
class FlipResult:
    epoch: int
    implementation: str
    previous: str
    changed: bool
    # timeline -> the largest timestamp any implementation handed out or reserved: the
    # target's write_ts starts there (its first write_ts is above it)
    bootstrap: dict[str, int] = field(default_factory=dict)
    # timeline -> the largest applied read frontier: the target's read_ts starts there, not at
    # `bootstrap`, so writes allocated but not applied stay invisible
    read_bootstrap: dict[str, int] = field(default_factory=dict)


async def flip_backend(backend: Backend, to: str, *, by: PlannedBy | None = None,
                       now: Callable[[], int] = wall_clock_ms) -> FlipResult:
    """One transaction: bump the epoch, bootstrap `to` above everything, fence the rest, and
    record the flip's epoch and time (`now`, ms), which time its rollout window.

    Every per-timeline row is locked first (`lock_deployment`) so no allocation can slip in
    between reading the maximum and raising the target to it. With `by` (the operator's pass),
    a deployment that no longer follows that planner raises StalePlan and changes nothing, so
    a paused or second operator cannot undo a newer decision; otherwise its generation is
    recorded with the flip.
    """
    check_implementation(to)
    await schema.add_columns(backend, ADDED_COLUMNS)  # a schema from an earlier release

    async def body(tx: Tx) -> FlipResult:
        dep, rows = await lock_deployment(tx)
        admit(dep, by)
        top: dict[str, int] = {}
        read_top: dict[str, int] = {}
        for timeline_value, impl, read_ts, write_ts in rows:
            timeline = str(timeline_value)
            read, write = backend.dec(read_ts), backend.dec(write_ts)
            if dep.implementation == to and impl != to:
                continue  # already there: report the target's own position
            top[timeline] = max(top.get(timeline, 0), read, write)
            read_top[timeline] = max(read_top.get(timeline, 0), read)
        if by is not None and by.generation > dep.generation:
            await tx.fetch("UPDATE {deployment} SET generation = %(g)s WHERE id = 1",
                           {"g": by.generation})
        if dep.implementation == to:
            return FlipResult(dep.epoch, to, to, False, top, read_top)
        epoch = dep.epoch + 1
        rollout = dep.fence == "Rollout"
        await tx.fetch(
            "UPDATE {deployment} SET epoch = %(epoch)s, implementation = %(to)s,"
            " rollout = %(rollout)s, flip_epoch = %(epoch)s, flipped_ms = %(at)s WHERE id = 1",
            {"epoch": epoch, "to": to, "rollout": rollout, "at": now()},
        )
        for timeline, value in top.items():
            await tx.fetch(
                "UPDATE {timestamps} SET write_ts = GREATEST(write_ts, %(top)s::numeric),"
                " read_ts = GREATEST(read_ts, %(read)s::numeric)"
                " WHERE timeline = %(timeline)s AND implementation = %(to)s",
                {"top": backend.enc(value), "read": backend.enc(read_top[timeline]),
                 "timeline": timeline, "to": to},
            )
        # The leader epoch bump fences any legacy leader, whichever way we flip.
        await tx.fetch(
            "UPDATE {timestamps} SET epoch = %(epoch)s, active = (implementation = %(to)s),"
            " rollout = %(rollout)s, leader_epoch = leader_epoch + 1",
            {"epoch": epoch, "to": to, "rollout": rollout},
        )
        return FlipResult(epoch, to, dep.implementation, True, top, read_top)

    return await backend.transaction(body)

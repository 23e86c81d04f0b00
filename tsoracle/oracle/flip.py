"""Flipping the active implementation, with max-timestamp bootstrap and an epoch bump."""

from __future__ import annotations

from dataclasses import dataclass, field

from tsoracle.fencing import check_implementation, lock_deployment
from tsoracle.store import Backend, Tx


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
    stale: bool = False  # refused: a newer resource generation was already applied


async def flip_backend(backend: Backend, to: str, *, generation: int | None = None) -> FlipResult:
    """One transaction: bump the epoch, bootstrap `to` above everything, fence the rest.

    Every per-timeline row is locked first (`lock_deployment`) so no allocation can slip in
    between reading the maximum and raising the target to it. `generation` (the operator's
    resource generation) is recorded with the flip; a flip asked for by an older generation than
    the one recorded changes nothing (`stale`), so a paused or second operator cannot undo it.
    """
    check_implementation(to)

    async def body(tx: Tx) -> FlipResult:
        dep, rows = await lock_deployment(tx)
        if generation is not None and generation < dep.generation:
            return FlipResult(dep.epoch, dep.implementation, dep.implementation, False,
                              stale=True)
        top: dict[str, int] = {}
        read_top: dict[str, int] = {}
        for timeline_value, impl, read_ts, write_ts in rows:
            timeline = str(timeline_value)
            read, write = backend.dec(read_ts), backend.dec(write_ts)
            if dep.implementation == to and impl != to:
                continue  # already there: report the target's own position
            top[timeline] = max(top.get(timeline, 0), read, write)
            read_top[timeline] = max(read_top.get(timeline, 0), read)
        if generation is not None and generation > dep.generation:
            await tx.fetch("UPDATE {deployment} SET generation = %(g)s WHERE id = 1",
                           {"g": generation})
        if dep.implementation == to:
            return FlipResult(dep.epoch, to, to, False, top, read_top)
        epoch = dep.epoch + 1
        rollout = dep.fence == "Rollout"
        await tx.fetch(
            "UPDATE {deployment} SET epoch = %(epoch)s, implementation = %(to)s,"
            " rollout = %(rollout)s WHERE id = 1",
            {"epoch": epoch, "to": to, "rollout": rollout},
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

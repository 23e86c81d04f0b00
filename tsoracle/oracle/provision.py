"""Provisioning: schema, deployment row and timelines, all idempotent."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tsoracle.errors import Arg, ConfigError, Fenced
from tsoracle.fencing import (
    IMPLEMENTATIONS,
    Deployment,
    check_implementation,
    check_mode,
    ensure_tables,
    lock_deployment,
    read_deployment,
    set_fencing,
)
from tsoracle.fencing.tables import TABLES
from tsoracle.oracle.timeline import EPOCH_MILLISECONDS, parse_timeline
from tsoracle.store import Backend, Tx, schema
from tsoracle.store.dialect import RETIRED_TABLES, U64_MAX

_INSERT = (
    "INSERT INTO {timestamps} (timeline, implementation, read_ts, write_ts, leader_epoch, epoch,"
    " active, fence, rollout, incarnation) VALUES (%(timeline)s, %(implementation)s,"
    " %(ts)s::numeric, %(ts)s::numeric, 0, %(epoch)s, %(active)s, %(fence)s, %(rollout)s,"
    " %(incarnation)s)"
    " ON CONFLICT (timeline, implementation) DO NOTHING"
)


@dataclass(frozen=True)
class Provisioned:
    deployment: Deployment
    created: list[str]  # timelines that did not exist before


async def provision(
    backend: Backend,
    timelines: Iterable[str] = (EPOCH_MILLISECONDS,),
    *,
    initial_ts: int = 0,
    implementation: str = "distributed",
    fencing: str | None = None,
    owner: str = "",
) -> Provisioned:
    """Create schema, tables and timelines that are missing; existing state is never changed.

    `implementation` applies only to a brand-new deployment; use `flip` to change it later.
    `fencing`, when given, sets the mode for the whole deployment. `owner` is recorded only in
    a brand-new deployment (the operator passes its resource's uid; see `claim`).
    """
    names = [parse_timeline(t).name for t in timelines]
    check_implementation(implementation)
    if isinstance(initial_ts, bool) or not isinstance(initial_ts, int) \
            or not 0 <= initial_ts <= U64_MAX:
        raise ConfigError.worded(
            "the initial timestamp ({arg}) must be an integer in [0, {top}], got {got!r}",
            arg=Arg("initial_ts"), top=U64_MAX, got=initial_ts)
    fence = check_mode(fencing or "Always")
    await ensure_tables(backend, implementation=implementation, fence=fence, owner=owner)
    if fencing is not None:
        await set_fencing(backend, fencing)

    async def body(tx: Tx) -> Provisioned:
        # Locked like a flip (same order): new rows carry the current epoch.
        dep, _ = await lock_deployment(tx)
        created = []
        for name in names:
            existing = await tx.fetch(
                "SELECT 1 FROM {timestamps} WHERE timeline = %(timeline)s", {"timeline": name}
            )
            if existing:
                continue
            created.append(name)
            for impl in IMPLEMENTATIONS:
                await tx.fetch(_INSERT, {
                    "timeline": name, "implementation": impl, "ts": backend.enc(initial_ts),
                    "epoch": dep.epoch, "active": impl == dep.implementation,
                    "fence": dep.fence, "rollout": dep.rollout, "incarnation": dep.incarnation,
                })
        return Provisioned(dep, created)

    return await backend.transaction(body)


async def timeline_exists(backend: Backend, timeline: str) -> bool:
    rows = await backend.fetch(
        "SELECT 1 FROM {timestamps} WHERE timeline = %(timeline)s", {"timeline": timeline}
    )
    return bool(rows)


async def find_deployment(backend: Backend) -> Deployment | None:
    """The deployment row, or None when the schema or the row does not exist."""
    if not await backend.table_exists("deployment"):
        return None
    try:
        return await read_deployment(backend)
    except Fenced:  # tables without their row
        return None


async def claim(backend: Backend, owner: str, *, previous: str = "") -> Deployment:
    """Record `owner` on a deployment nobody owns (made by `tsoracle init`, or released by a
    deleted resource), or still owned by `previous`, a resource that no longer exists; a
    deployment owned by someone else is left as it is.

    The generation recorded is the owner's (see `record_generation`): an adopting resource
    starts again from 0, or its generation 1 would look older than its predecessor's last."""
    await backend.fetch("UPDATE {deployment} SET owner = %(owner)s, generation = 0"
                        " WHERE id = 1 AND owner = %(previous)s",
                        {"owner": owner, "previous": previous})
    return await read_deployment(backend)


async def release(backend: Backend, owner: str) -> None:
    """Give up ownership (deletionPolicy: Retain), so that a new resource may adopt the data."""
    await backend.fetch("UPDATE {deployment} SET owner = '' WHERE id = 1 AND owner = %(owner)s",
                        {"owner": owner})


# Everything a deployment keeps in its schema: the oracle's tables (fencing/tables.py) and the
# Iceberg catalog's (catalog/state.py TABLES). They are named here so that deleting a
# deployment removes them too, from a floor that never imports those above it.
CATALOG_TABLES = ("iceberg_namespaces", "iceberg_objects", "iceberg_uppers", "iceberg_commits",
                  "iceberg_locations", "iceberg_idempotency")
DEPLOYMENT_TABLES = (*TABLES, *CATALOG_TABLES)


async def drop_deployment(backend: Backend) -> bool:
    """Remove the deployment's tables (and those of earlier releases, if there), then its
    schema if nothing else is in it (deletionPolicy: Delete). Returns whether the schema
    itself was dropped."""
    # The deployment row goes last: it is how a deletion finds that there is something to
    # drop, so a drop cut off half-way (an operator killed) is found and finished.
    rest = [t for t in (*DEPLOYMENT_TABLES, *sorted(RETIRED_TABLES)) if t != "deployment"]
    return await schema.drop(backend, (*rest, "deployment"))

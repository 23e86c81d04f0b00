"""The catalog's rows in the oracle's database: namespaces, table pointers and the upper.

A table is a pointer to its current metadata file; a commit moves it by compare-and-set. The
upper, one row per timeline, is the highest timestamp anything committed at or anyone read at:
a commit at W lands only if W is above it, and raises it to W in the same transaction. Each
commit also leaves a row (timeline, W) in the same transaction: W is never handed out twice, so
a retried transaction whose COMMIT reply was lost asks that row whether it landed, whatever the
commit did (a drop leaves no pointer to look at) and whatever landed on its tables since.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from tsoracle.store import Backend, Statement, Tx, schema

TABLES = ("iceberg_namespaces", "iceberg_objects", "iceberg_uppers", "iceberg_commits",
          "iceberg_locations", "iceberg_idempotency")
# How long a commit's row stays: far beyond any retry of its transaction (seconds), and beyond
# any clock difference between replicas (the row is stamped and pruned by their wall clocks);
# short enough that the pruning's scan stays small at high commit rates.
COMMIT_ROWS_KEPT_MS = 3600 * 1000

_DDL = (
    """CREATE TABLE IF NOT EXISTS {iceberg_namespaces} (
        namespace TEXT PRIMARY KEY, properties TEXT NOT NULL)""",
    # kind: 'table' (views share the names: a view and a table may not have the same one)
    """CREATE TABLE IF NOT EXISTS {iceberg_objects} (
        namespace TEXT NOT NULL, name TEXT NOT NULL, kind TEXT NOT NULL,
        metadata_location TEXT NOT NULL, PRIMARY KEY (namespace, name))""",
    """CREATE TABLE IF NOT EXISTS {iceberg_uppers} (
        timeline TEXT PRIMARY KEY, upper {u64:upper} NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS {iceberg_commits} (
        timeline TEXT NOT NULL, ts {u64:ts} NOT NULL, at_ms BIGINT NOT NULL,
        PRIMARY KEY (timeline, ts))""",
    # Where each table and view keeps its files (resolved: boundary.resolve), so that no two
    # share a folder; written in the transaction that creates, registers, moves or drops one.
    """CREATE TABLE IF NOT EXISTS {iceberg_locations} (
        namespace TEXT NOT NULL, name TEXT NOT NULL, location TEXT NOT NULL,
        PRIMARY KEY (namespace, name))""",
    # Idempotency-Key (idempotency.py): written in the transaction that lands the request's
    # change; status and body once its final answer is known.
    """CREATE TABLE IF NOT EXISTS {iceberg_idempotency} (
        key TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, status INTEGER, body TEXT,
        at_ms BIGINT NOT NULL)""",
)

SEP = "\x1f"  # between namespace levels in a row (the REST spec's own separator in URLs)
Namespace = tuple[str, ...]


def ns_key(namespace: Namespace) -> str:
    return SEP.join(namespace)


def ns_levels(key: str) -> Namespace:
    return tuple(key.split(SEP))


@dataclass(frozen=True)
class Pointer:
    """Where a table's current metadata is."""

    namespace: Namespace
    name: str
    kind: str
    metadata_location: str


@dataclass(frozen=True)
class Swap:
    """Move `name`'s pointer from `expected` (None: create it) to `new`."""

    namespace: Namespace
    name: str
    expected: str | None
    new: str
    kind: str = "table"


class Moved(Exception):
    """A pointer was not where the commit expected it: nothing was written."""

    def __init__(self, namespace: Namespace, name: str, found: str | None) -> None:
        super().__init__(f"{'.'.join(namespace)}.{name} moved")
        self.namespace, self.name, self.found = namespace, name, found


class Superseded(Exception):
    """The upper is at or above the commit's timestamp: nothing was written."""


class OtherTimeline(Exception):
    """The schema's tables are ordered by another timeline."""

    def __init__(self, timeline: str) -> None:
        super().__init__(timeline)
        self.timeline = timeline


async def ensure(backend: Backend, timeline: str) -> None:
    """Create the catalog's tables, and take the schema for `timeline`; raise `OtherTimeline`
    if another timeline already orders namespaces or tables in it (two timelines on one set of
    tables would let a commit land below a read timestamp the other handed out)."""
    await schema.create(backend, _DDL, schema=False)  # the oracle's schema exists already

    async def take(tx: Tx) -> None:
        others = await tx.fetch("SELECT timeline FROM {iceberg_uppers} WHERE timeline <> %(t)s",
                                {"t": timeline})
        if not others:
            return
        used = await tx.fetch("SELECT 1 FROM {iceberg_namespaces} LIMIT 1")
        if used:
            raise OtherTimeline(str(others[0][0]))
        # Nothing was ever made under the other timeline: the schema is free to take.
        await tx.fetch("DELETE FROM {iceberg_uppers} WHERE timeline <> %(t)s", {"t": timeline})

    await backend.transaction(take)
    await backend.fetch(
        "INSERT INTO {iceberg_uppers} (timeline, upper) VALUES (%(t)s, %(u)s::numeric)"
        " ON CONFLICT (timeline) DO NOTHING", {"t": timeline, "u": backend.enc(0)})


# --- namespaces -------------------------------------------------------------------------------

async def namespaces(db: Backend | Tx) -> dict[Namespace, dict[str, str]]:
    rows = await db.fetch("SELECT namespace, properties FROM {iceberg_namespaces}")
    return {ns_levels(str(k)): json.loads(p) for k, p in rows}


async def namespace(db: Backend | Tx, ns: Namespace) -> dict[str, str] | None:
    rows = await db.fetch("SELECT properties FROM {iceberg_namespaces} WHERE namespace = %(n)s",
                          {"n": ns_key(ns)})
    return json.loads(rows[0][0]) if rows else None


async def create_namespace(db: Backend | Tx, ns: Namespace, properties: dict[str, str]) -> bool:
    """False if it exists already (nothing changed)."""
    rows = await db.fetch(
        "INSERT INTO {iceberg_namespaces} (namespace, properties) VALUES (%(n)s, %(p)s)"
        " ON CONFLICT (namespace) DO NOTHING RETURNING namespace",
        {"n": ns_key(ns), "p": json.dumps(properties)})
    return bool(rows)


async def set_namespace_properties(tx: Tx, ns: Namespace, properties: dict[str, str]) -> None:
    await tx.fetch("UPDATE {iceberg_namespaces} SET properties = %(p)s WHERE namespace = %(n)s",
                   {"n": ns_key(ns), "p": json.dumps(properties)})


async def namespace_for_update(tx: Tx, ns: Namespace) -> dict[str, str] | None:
    rows = await tx.fetch("SELECT properties FROM {iceberg_namespaces} WHERE namespace = %(n)s"
                          " FOR UPDATE", {"n": ns_key(ns)})
    return json.loads(rows[0][0]) if rows else None


async def drop_namespace(tx: Tx, ns: Namespace) -> bool:
    rows = await tx.fetch("DELETE FROM {iceberg_namespaces} WHERE namespace = %(n)s"
                          " RETURNING namespace", {"n": ns_key(ns)})
    return bool(rows)


# --- tables -----------------------------------------------------------------------------------

async def objects(db: Backend | Tx, ns: Namespace, kind: str, after: str | None = None,
                  limit: int | None = None) -> list[str]:
    """Names in the database's order (its collation), from just after `after`: the cut and
    the order are the database's both, so pages neither skip nor repeat a name."""
    rows = await db.fetch(
        "SELECT name FROM {iceberg_objects} WHERE namespace = %(n)s AND kind = %(k)s"
        + (" AND name > %(a)s" if after is not None else "") + " ORDER BY name"
        + (" LIMIT %(l)s" if limit is not None else ""),
        {"n": ns_key(ns), "k": kind, "a": after, "l": limit})
    return [str(r[0]) for r in rows]


async def count_objects(db: Backend | Tx, ns: Namespace) -> int:
    rows = await db.fetch("SELECT COUNT(*) FROM {iceberg_objects} WHERE namespace = %(n)s",
                          {"n": ns_key(ns)})
    return int(rows[0][0])


async def pointer(db: Backend | Tx, ns: Namespace, name: str) -> Pointer | None:
    rows = await db.fetch("SELECT kind, metadata_location FROM {iceberg_objects}"
                          " WHERE namespace = %(n)s AND name = %(t)s",
                          {"n": ns_key(ns), "t": name})
    return Pointer(ns, name, str(rows[0][0]), str(rows[0][1])) if rows else None


# A pointer's compare-and-set: a row if it moved.
_MOVE = ("UPDATE {iceberg_objects} SET metadata_location = %(l)s WHERE namespace = %(n)s"
         " AND name = %(t)s AND kind = %(k)s AND metadata_location = %(e)s RETURNING name")


async def swap(tx: Tx, moves: Sequence[Swap]) -> None:
    """Compare-and-set every pointer in `moves`; raises `Moved` (roll back) on the first that
    is not where it was expected."""
    for m in moves:
        params = {"n": ns_key(m.namespace), "t": m.name, "e": m.expected, "l": m.new,
                  "k": m.kind}
        if m.expected is None:
            await _hold_namespace(tx, m.namespace, m.name)
            rows = await tx.fetch(
                "INSERT INTO {iceberg_objects} (namespace, name, kind, metadata_location)"
                " VALUES (%(n)s, %(t)s, %(k)s, %(l)s) ON CONFLICT (namespace, name) DO NOTHING"
                " RETURNING name", params)
        else:
            rows = await tx.fetch(_MOVE, params)
        if not rows:
            found = await pointer(tx, m.namespace, m.name)
            raise Moved(m.namespace, m.name, found.metadata_location if found else None)


async def _hold_namespace(tx: Tx, ns: Namespace, name: str) -> None:
    """Lock the namespace a name is added to, or raise `Moved` (it was dropped meanwhile): a
    namespace's drop locks the same row before it counts what is in it, so the two never pass
    each other (a table left in a dropped namespace)."""
    rows = await tx.fetch("SELECT 1 FROM {iceberg_namespaces} WHERE namespace = %(n)s"
                          " FOR UPDATE", {"n": ns_key(ns)})
    if not rows:
        raise Moved(ns, name, None)


async def remove(tx: Tx, ns: Namespace, name: str, kind: str, expected: str) -> None:
    rows = await tx.fetch("DELETE FROM {iceberg_objects} WHERE namespace = %(n)s"
                          " AND name = %(t)s AND kind = %(k)s AND metadata_location = %(e)s"
                          " RETURNING name",
                          {"n": ns_key(ns), "t": name, "k": kind, "e": expected})
    if not rows:
        found = await pointer(tx, ns, name)
        raise Moved(ns, name, found.metadata_location if found else None)


async def rename(tx: Tx, source: Pointer, ns: Namespace, name: str) -> None:
    await _hold_namespace(tx, ns, name)
    rows = await tx.fetch(
        "UPDATE {iceberg_objects} SET namespace = %(n2)s, name = %(t2)s WHERE namespace = %(n)s"
        " AND name = %(t)s AND metadata_location = %(e)s RETURNING name",
        {"n": ns_key(source.namespace), "t": source.name, "e": source.metadata_location,
         "n2": ns_key(ns), "t2": name})
    if not rows:
        found = await pointer(tx, source.namespace, source.name)
        raise Moved(source.namespace, source.name, found.metadata_location if found else None)


# --- locations --------------------------------------------------------------------------------

async def location_user(db: Backend | Tx, location: str, ns: Namespace, name: str
                        ) -> tuple[Namespace, str] | None:
    """A table or view other than `ns.name` whose folder is `location`, holds it or lies in
    it (resolved locations: no dot segments, no trailing slash)."""
    rows = await db.fetch(
        "SELECT namespace, name FROM {iceberg_locations}"
        " WHERE NOT (namespace = %(n)s AND name = %(t)s) AND (location = CAST(%(l)s AS TEXT)"
        " OR substr(CAST(%(l)s AS TEXT), 1, length(location) + 1) = location || '/'"
        " OR substr(location, 1, length(CAST(%(l)s AS TEXT)) + 1) = CAST(%(l)s AS TEXT) || '/')"
        " LIMIT 1", {"n": ns_key(ns), "t": name, "l": location})
    return (ns_levels(str(rows[0][0])), str(rows[0][1])) if rows else None


async def record_location(tx: Tx, ns: Namespace, name: str, location: str) -> None:
    await tx.fetch("INSERT INTO {iceberg_locations} (namespace, name, location)"
                   " VALUES (%(n)s, %(t)s, %(l)s) ON CONFLICT (namespace, name)"
                   " DO UPDATE SET location = excluded.location",
                   {"n": ns_key(ns), "t": name, "l": location})


async def forget_location(tx: Tx, ns: Namespace, name: str) -> None:
    await tx.fetch("DELETE FROM {iceberg_locations} WHERE namespace = %(n)s AND name = %(t)s",
                   {"n": ns_key(ns), "t": name})


async def move_location(tx: Tx, source: Pointer, ns: Namespace, name: str) -> None:
    await tx.fetch("UPDATE {iceberg_locations} SET namespace = %(n2)s, name = %(t2)s"
                   " WHERE namespace = %(n)s AND name = %(t)s",
                   {"n": ns_key(source.namespace), "t": source.name, "n2": ns_key(ns),
                    "t2": name})


async def unlocated(backend: Backend) -> list[Pointer]:
    """Tables and views whose folder is not recorded (made before the catalog recorded them)."""
    rows = await backend.fetch(
        "SELECT o.namespace, o.name, o.kind, o.metadata_location FROM {iceberg_objects} o"
        " LEFT JOIN {iceberg_locations} l ON l.namespace = o.namespace AND l.name = o.name"
        " WHERE l.name IS NULL")
    return [Pointer(ns_levels(str(n)), str(t), str(k), str(m)) for n, t, k, m in rows]


async def metadata_in_use(db: Backend | Tx, metadata_location: str) -> tuple[Namespace, str] | None:
    rows = await db.fetch("SELECT namespace, name FROM {iceberg_objects}"
                          " WHERE metadata_location = %(m)s LIMIT 1", {"m": metadata_location})
    return (ns_levels(str(rows[0][0])), str(rows[0][1])) if rows else None


# --- the upper --------------------------------------------------------------------------------

async def raise_upper(db: Backend | Tx, timeline: str, ts: int) -> bool:
    """Move the upper to `ts` if it is below; False if it was at or above `ts` already."""
    rows = await db.fetch(
        "UPDATE {iceberg_uppers} SET upper = %(ts)s::numeric WHERE timeline = %(t)s"
        " AND upper < %(ts)s::numeric RETURNING upper",
        {"t": timeline, "ts": db.dialect.encode_ts(ts)})
    return bool(rows)


async def claim(tx: Tx, timeline: str, ts: int) -> None:
    """Take `ts` as this transaction's commit timestamp, or raise `Superseded`."""
    if not await raise_upper(tx, timeline, ts):
        raise Superseded(f"the catalog's upper on {timeline!r} is at or above {ts}")


async def record_commit(tx: Tx, timeline: str, ts: int, now_ms: int) -> None:
    """Leave the mark that the transaction committing at `ts` landed."""
    await tx.fetch("INSERT INTO {iceberg_commits} (timeline, ts, at_ms)"
                   " VALUES (%(t)s, %(ts)s::numeric, %(at)s)",
                   {"t": timeline, "ts": tx.dialect.encode_ts(ts), "at": now_ms})


# --- a group's transaction sent at once (PostgreSQL) ----------------------------------------
# Sent in one round trip, so no statement sees another's reply: a failed condition that must
# stop the rest is an error (1 / 0), which rolls the whole transaction back.

def claim_at_once(tx: Backend | Tx, timeline: str, ts: int, now_ms: int) -> Statement:
    """`claim` and `record_commit` in one statement; fails (division by zero) if the upper
    is at or above `ts`."""
    return Statement(
        "WITH claimed AS (UPDATE {iceberg_uppers} SET upper = %(ts)s::numeric"
        " WHERE timeline = %(t)s AND upper < %(ts)s::numeric RETURNING timeline),"
        " marked AS (INSERT INTO {iceberg_commits} (timeline, ts, at_ms)"
        " SELECT timeline, %(ts)s::numeric, %(at)s FROM claimed RETURNING ts)"
        " SELECT 1 / (SELECT count(*) FROM marked)",
        {"t": timeline, "ts": tx.dialect.encode_ts(ts), "at": now_ms})


def swap_at_once(move: Swap, key: tuple[str, str, int] | None, now_ms: int) -> Statement:
    """Compare-and-set one existing pointer; returns a row if it moved. With `key` (key,
    fingerprint, expired_ms), the key's row is left too if it moved (`record_key`), and the
    statement fails (division by zero) if the key has a live row."""
    params = {"n": ns_key(move.namespace), "t": move.name, "e": move.expected, "l": move.new,
              "k": move.kind}
    if key is None:
        return Statement(_MOVE, params)
    return Statement(
        f"WITH moved AS ({_MOVE}), keyed AS (INSERT INTO {{iceberg_idempotency}} AS k"
        " (key, fingerprint, at_ms) SELECT %(key)s, %(f)s, %(at)s FROM moved"
        " ON CONFLICT (key) DO UPDATE SET fingerprint = excluded.fingerprint, status = NULL,"
        " body = NULL, at_ms = excluded.at_ms WHERE k.at_ms < %(old)s RETURNING key)"
        " SELECT name, 1 / (SELECT count(*) FROM keyed) FROM moved",
        {**params, "key": key[0], "f": key[1], "old": key[2], "at": now_ms})


async def committed(tx: Backend | Tx, timeline: str, ts: int) -> bool:
    """Whether a transaction committing at `ts` landed (its mark is there)."""
    rows = await tx.fetch("SELECT 1 FROM {iceberg_commits} WHERE timeline = %(t)s"
                          " AND ts = %(ts)s::numeric",
                          {"t": timeline, "ts": tx.dialect.encode_ts(ts)})
    return bool(rows)


async def prune_commits(backend: Backend, timeline: str, now_ms: int,
                        retention_ms: int = 0) -> None:
    """Forget marks older than an hour, or than the retention window if that is longer (a
    counting timeline finds the window's first commit by them)."""
    await backend.fetch("DELETE FROM {iceberg_commits} WHERE timeline = %(t)s"
                        " AND at_ms < %(cut)s",
                        {"t": timeline,
                         "cut": now_ms - max(COMMIT_ROWS_KEPT_MS, retention_ms + 60_000)})


async def first_commit_since(backend: Backend, timeline: str, since_ms: int) -> int | None:
    """The lowest timestamp committed at or after the wall-clock time `since_ms`."""
    rows = await backend.fetch("SELECT MIN(ts) FROM {iceberg_commits} WHERE timeline = %(t)s"
                               " AND at_ms >= %(s)s", {"t": timeline, "s": since_ms})
    return backend.dec(rows[0][0]) if rows and rows[0][0] is not None else None


# --- Idempotency-Key ---------------------------------------------------------------------------

async def record_key(tx: Tx, key: str, fingerprint: str, now_ms: int, expired_ms: int,
                     answer: tuple[int, str] | None = None) -> bool:
    """Leave `key`'s row (and its answer, if known) in the transaction that lands its
    request, over a row older than `expired_ms`; False if the key has a live row."""
    status, body = answer if answer is not None else (None, None)
    rows = await tx.fetch("INSERT INTO {iceberg_idempotency} AS k (key, fingerprint, status,"
                          " body, at_ms) VALUES (%(k)s, %(f)s, %(s)s, %(b)s, %(at)s)"
                          " ON CONFLICT (key) DO UPDATE SET fingerprint = excluded.fingerprint,"
                          " status = excluded.status, body = excluded.body,"
                          " at_ms = excluded.at_ms WHERE k.at_ms < %(old)s RETURNING key",
                          {"k": key, "f": fingerprint, "s": status, "b": body, "at": now_ms,
                           "old": expired_ms})
    return bool(rows)


async def answer_key(db: Backend | Tx, key: str, fingerprint: str, status: int,
                     body: str | None, now_ms: int, expired_ms: int, refusal: bool) -> None:
    """Record `key`'s final answer (`body` None: too big to keep). A success goes on the row
    its change landed with; a refusal, which landed nothing, on a row of its own, never over
    a live one (a copy of the request may have landed). A row older than `expired_ms` is
    replaced."""
    own = "" if refusal else " (k.status IS NULL AND k.fingerprint = excluded.fingerprint) OR"
    await db.fetch("INSERT INTO {iceberg_idempotency} AS k (key, fingerprint, status, body,"
                   " at_ms) VALUES (%(k)s, %(f)s, %(s)s, %(b)s, %(at)s) ON CONFLICT (key)"
                   " DO UPDATE SET fingerprint = excluded.fingerprint, status = excluded.status,"
                   " body = excluded.body, at_ms = CASE WHEN k.at_ms < %(old)s"
                   " THEN excluded.at_ms ELSE k.at_ms END"
                   " WHERE" + own + " k.at_ms < %(old)s",
                   {"k": key, "f": fingerprint, "s": status, "b": body, "at": now_ms,
                    "old": expired_ms})


async def stored_key(db: Backend | Tx, key: str, since_ms: int
                     ) -> tuple[str, int | None, str | None] | None:
    """(fingerprint, status, body) of `key`'s row, unless it is older than `since_ms`."""
    rows = await db.fetch("SELECT fingerprint, status, body FROM {iceberg_idempotency}"
                          " WHERE key = %(k)s AND at_ms >= %(s)s", {"k": key, "s": since_ms})
    if not rows:
        return None
    fp, status, body = rows[0]
    return str(fp), None if status is None else int(status), None if body is None else str(body)


async def prune_keys(backend: Backend, before_ms: int) -> None:
    """Forget Idempotency-Keys recorded before `before_ms` (their lifetime and grace over)."""
    await backend.fetch("DELETE FROM {iceberg_idempotency} WHERE at_ms < %(c)s",
                        {"c": before_ms})


async def upper(backend: Backend, timeline: str) -> int:
    rows = await backend.fetch("SELECT upper FROM {iceberg_uppers} WHERE timeline = %(t)s",
                               {"t": timeline})
    return backend.dec(rows[0][0]) if rows else 0


"""The catalog of timestamped tables, kept in the oracle's own database.

Commit protocol (compare-and-set on the timeline's upper): a commit at `ts` succeeds only if
`ts` is above the timeline's upper, which it then becomes. A linearized read at `T` first raises
the upper to `T` ("seals" it). So once anyone has read at `T`, no commit at or below `T` can land:
a writer that allocated a timestamp, was delayed, and lost the race gets `Conflict` and retries
at a fresh timestamp. Every read at `T` therefore returns the same rows forever.

Commits are idempotent: each records the unique path of its data, and a retried commit
transaction (after a lost COMMIT reply, say) that finds its own row counts as done. A stream's
batch tags live one per row in `table_tags`, unique per table, written in the commit's
transaction, so a replayed batch is recognised whichever commit it shared.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tsoracle.errors import ConfigError, NotInitialized
from tsoracle.oracle.group_commit import Conflict
from tsoracle.store import Backend, Tx, schema

_DDL = (
    """CREATE TABLE IF NOT EXISTS {table_catalog} (
        name TEXT PRIMARY KEY, timeline TEXT NOT NULL, columns TEXT NOT NULL,
        keys TEXT NOT NULL, location TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS {table_commits} (
        table_name TEXT NOT NULL, ts {u64:ts} NOT NULL, timeline TEXT NOT NULL,
        path TEXT NOT NULL, tag TEXT, PRIMARY KEY (table_name, ts))""",
    """CREATE TABLE IF NOT EXISTS {timeline_uppers} (
        timeline TEXT PRIMARY KEY, upper {u64:upper} NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS {table_tags} (
        table_name TEXT NOT NULL, tag TEXT NOT NULL, ts {u64:ts} NOT NULL,
        PRIMARY KEY (table_name, tag))""",
    """CREATE TABLE IF NOT EXISTS {table_since} (
        table_name TEXT PRIMARY KEY, since {u64:since} NOT NULL)""",
)


class TagExists(Exception):
    """A batch with this tag was committed before, at `ts`."""

    def __init__(self, tag: str, ts: int) -> None:
        super().__init__(f"tag {tag!r} was committed at {ts}")
        self.tag, self.ts = tag, ts


@dataclass(frozen=True)
class TableInfo:
    name: str
    timeline: str
    columns: list[dict[str, Any]]  # Spark StructField JSON
    keys: list[str]
    location: str


async def ensure_catalog(backend: Backend) -> None:
    await schema.create(backend, _DDL, schema=False)  # the oracle's schema exists already


async def register(backend: Backend, info: TableInfo) -> TableInfo:
    """Create the table if missing; an existing one must match exactly."""

    async def body(tx: Tx) -> TableInfo:
        await tx.fetch(
            "INSERT INTO {table_catalog} (name, timeline, columns, keys, location)"
            " VALUES (%(n)s, %(t)s, %(c)s, %(k)s, %(l)s) ON CONFLICT (name) DO NOTHING",
            {"n": info.name, "t": info.timeline, "c": json.dumps(info.columns),
             "k": json.dumps(info.keys), "l": info.location})
        await tx.fetch(
            "INSERT INTO {timeline_uppers} (timeline, upper) VALUES (%(t)s, %(u)s::numeric)"
            " ON CONFLICT (timeline) DO NOTHING",
            {"t": info.timeline, "u": backend.enc(0)})
        existing = await _lookup(tx, info.name)
        assert existing is not None
        return existing

    found = await backend.transaction(body)
    if (found.timeline, found.columns, found.keys) != (info.timeline, info.columns, info.keys):
        raise ConfigError(
            f"table {info.name!r} already exists with timeline {found.timeline!r}, columns "
            f"{_describe(found.columns)}, keys {found.keys}; it cannot be redefined"
        )
    return found


async def lookup(backend: Backend, name: str) -> TableInfo:
    info = await _lookup(backend, name)
    if info is None:
        raise NotInitialized(f"table {name!r} does not exist; create it with a schema first "
                             "(client.create_table(name, schema))")
    return info


async def _lookup(db: Backend | Tx, name: str) -> TableInfo | None:
    rows = await db.fetch("SELECT name, timeline, columns, keys, location FROM {table_catalog}"
                          " WHERE name = %(n)s", {"n": name})
    if not rows:
        return None
    n, t, c, k, loc = rows[0]
    return TableInfo(str(n), str(t), json.loads(c), json.loads(k), str(loc))


async def commit(backend: Backend, info: TableInfo, ts: int, path: str,
                 tags: tuple[str, ...] = (), expected_upper: int | None = None) -> None:
    """Compare-and-set the timeline's upper to `ts` and record the commit, atomically.

    Raises `Conflict` when the upper moved (nothing was committed) and `TagExists` when a tag
    was committed before (nothing was committed either). A body that finds its own commit (the
    same path: a retry after an ambiguous COMMIT) returns as done.
    """

    async def body(tx: Tx) -> None:
        mine = await tx.fetch("SELECT 1 FROM {table_commits} WHERE table_name = %(n)s"
                              " AND path = %(p)s", {"n": info.name, "p": path})
        if mine:
            return
        for tag in tags:
            rows = await tx.fetch("SELECT ts FROM {table_tags} WHERE table_name = %(n)s"
                                  " AND tag = %(g)s", {"n": info.name, "g": tag})
            if rows:
                raise TagExists(tag, backend.dec(rows[0][0]))
        params = {"t": info.timeline, "ts": backend.enc(ts)}
        condition = ""
        if expected_upper is not None:
            condition = " AND upper = %(e)s::numeric"
            params["e"] = backend.enc(expected_upper)
        won = await tx.fetch("UPDATE {timeline_uppers} SET upper = %(ts)s::numeric"
                             " WHERE timeline = %(t)s AND upper < %(ts)s::numeric" + condition +
                             " RETURNING upper", params)
        if not won:
            raise Conflict(f"timeline {info.timeline!r} moved past {ts}")
        await tx.fetch("INSERT INTO {table_commits} (table_name, ts, timeline, path, tag)"
                       " VALUES (%(n)s, %(ts)s::numeric, %(t)s, %(p)s, NULL)",
                       {"n": info.name, "ts": backend.enc(ts), "t": info.timeline,
                        "p": path})
        for tag in tags:
            # Unique per table: a concurrent commit of the same tag makes this one fail whole.
            await tx.fetch("INSERT INTO {table_tags} (table_name, tag, ts)"
                           " VALUES (%(n)s, %(g)s, %(ts)s::numeric)",
                           {"n": info.name, "g": tag, "ts": backend.enc(ts)})

    await backend.transaction(body)


async def committed(backend: Backend, name: str, path: str) -> int | None:
    """The timestamp of the commit of `path`, or None if it was never committed."""
    rows = await backend.fetch("SELECT ts FROM {table_commits} WHERE table_name = %(n)s"
                               " AND path = %(p)s", {"n": name, "p": path})
    return backend.dec(rows[0][0]) if rows else None


async def since(backend: Backend, name: str) -> int:
    """Reads below this timestamp were compacted away (0: the whole history is there)."""
    rows = await backend.fetch("SELECT since FROM {table_since} WHERE table_name = %(n)s",
                               {"n": name})
    return backend.dec(rows[0][0]) if rows else 0


async def compact(backend: Backend, info: TableInfo, below: int, path: str,
                  folded: list[str], expected_since: int) -> None:
    """Replace the commits at or below `below` (exactly `folded`, the paths the caller
    consolidated into `path`) by one commit at `below`, and move `since` up to it, atomically.
    Raises `Conflict` if anything changed meanwhile (another compaction)."""

    async def body(tx: Tx) -> None:
        upper_rows = await tx.fetch("SELECT upper FROM {timeline_uppers} WHERE timeline = %(t)s"
                                    " FOR UPDATE", {"t": info.timeline})
        if not upper_rows or backend.dec(upper_rows[0][0]) < below:
            raise Conflict(f"{below} is not closed on {info.timeline!r}")
        rows = await tx.fetch("SELECT since FROM {table_since} WHERE table_name = %(n)s"
                              " FOR UPDATE", {"n": info.name})
        current = backend.dec(rows[0][0]) if rows else 0
        if current != expected_since:
            raise Conflict(f"table {info.name!r} was compacted meanwhile")
        listed = await tx.fetch("SELECT path FROM {table_commits} WHERE table_name = %(n)s"
                                " AND ts <= %(b)s::numeric", {"n": info.name,
                                                              "b": backend.enc(below)})
        if sorted(str(r[0]) for r in listed) != sorted(folded):
            raise Conflict(f"the commits of {info.name!r} at or below {below} changed")
        await tx.fetch("DELETE FROM {table_commits} WHERE table_name = %(n)s"
                       " AND ts <= %(b)s::numeric", {"n": info.name, "b": backend.enc(below)})
        await tx.fetch("INSERT INTO {table_commits} (table_name, ts, timeline, path, tag)"
                       " VALUES (%(n)s, %(b)s::numeric, %(t)s, %(p)s, NULL)",
                       {"n": info.name, "b": backend.enc(below), "t": info.timeline,
                        "p": path})
        if rows:
            await tx.fetch("UPDATE {table_since} SET since = %(b)s::numeric"
                           " WHERE table_name = %(n)s", {"n": info.name,
                                                          "b": backend.enc(below)})
        else:
            await tx.fetch("INSERT INTO {table_since} (table_name, since)"
                           " VALUES (%(n)s, %(b)s::numeric)", {"n": info.name,
                                                               "b": backend.enc(below)})

    await backend.transaction(body)


async def all_paths(backend: Backend, name: str) -> set[str]:
    rows = await backend.fetch("SELECT path FROM {table_commits} WHERE table_name = %(n)s",
                               {"n": name})
    return {str(r[0]) for r in rows}


async def drop(backend: Backend, name: str) -> None:
    """Forget a table: its commits, tags and catalog entry, in one transaction."""

    async def body(tx: Tx) -> None:
        for table in ("table_tags", "table_commits", "table_since"):
            await tx.fetch("DELETE FROM {" + table + "} WHERE table_name = %(n)s", {"n": name})
        await tx.fetch("DELETE FROM {table_catalog} WHERE name = %(n)s", {"n": name})

    await backend.transaction(body)


async def seal(backend: Backend, timeline: str, ts: int) -> None:
    """Close `ts`: no commit at or below it can land any more."""
    await backend.fetch("UPDATE {timeline_uppers} SET upper = %(ts)s::numeric"
                        " WHERE timeline = %(t)s AND upper < %(ts)s::numeric",
                        {"t": timeline, "ts": backend.enc(ts)})


async def upper(backend: Backend, timeline: str) -> int:
    rows = await backend.fetch("SELECT upper FROM {timeline_uppers} WHERE timeline = %(t)s",
                               {"t": timeline})
    return backend.dec(rows[0][0]) if rows else 0


async def commits_as_of(backend: Backend, name: str, ts: int) -> list[tuple[int, str]]:
    rows = await backend.fetch("SELECT ts, path FROM {table_commits} WHERE table_name = %(n)s"
                               " AND ts <= %(ts)s::numeric ORDER BY ts",
                               {"n": name, "ts": backend.enc(ts)})
    return [(backend.dec(t), str(p)) for t, p in rows]


async def tag_ts(backend: Backend, name: str, tag: str) -> int | None:
    """When the batch tagged `tag` was committed, or None."""
    rows = await backend.fetch("SELECT ts FROM {table_tags} WHERE table_name = %(n)s"
                               " AND tag = %(g)s", {"n": name, "g": tag})
    return backend.dec(rows[0][0]) if rows else None


def _describe(columns: list[dict[str, Any]]) -> str:
    return "(" + ", ".join(f"{c['name']} {c['type']}" for c in columns) + ")"

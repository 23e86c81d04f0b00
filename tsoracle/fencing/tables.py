"""The oracle's two tables, and the SQL fragments every statement on its rows uses (`fenced`).

- `deployment`: one row, the source of truth: epoch, active implementation, fencing mode,
  rollout flag, incarnation, owner, the resource generation last applied, the operator's pass
  count and the last flip's epoch and time.
- `timestamps`: one row per (timeline, implementation), with a copy of the deployment's fencing
  state, so that a guarded statement checks the row it touches (docs/design.md, "Storage").
"""

from __future__ import annotations

import secrets

from tsoracle.store import Backend, schema
from tsoracle.store.dialect import expand

TABLES = ("timestamps", "deployment")

# What `fenced` writes into a statement for `{name}`.
FRAGMENTS = {
    # True while this process may hand out or release results: it runs the active
    # implementation and its epoch is current, or the mode is Rollout and no rollout is in
    # progress. Every mode, Disabled included, evaluates it on every statement: Disabled only
    # spares a legacy leader its confirmation round trips before answering from memory (see
    # confirms_reads), never the check that keeps an inactive implementation or a superseded
    # epoch from allocating. The incarnation names one provisioning of the schema: a client of
    # a deployment that was dropped and provisioned again (epochs and counters restart) fails
    # it instead of reusing timestamps.
    "guard": "(active AND incarnation = %(incarnation)s"
             " AND (epoch = %(epoch)s OR (fence = 'Rollout' AND NOT rollout)))",
    # The one timestamps row a statement is about.
    "row": "timeline = %(timeline)s AND implementation = %(implementation)s",
}


def fenced(template: str) -> str:
    """A statement on one timestamps row, with `{row}` and `{guard}` written in."""
    return expand(template, FRAGMENTS)


_DDL = (
    """CREATE TABLE IF NOT EXISTS {deployment} (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch BIGINT NOT NULL,
    implementation TEXT NOT NULL CHECK (implementation IN ('legacy', 'distributed')),
    fence TEXT NOT NULL CHECK (fence IN ('Always', 'Rollout', 'Disabled')),
    rollout BOOLEAN NOT NULL,
    incarnation TEXT NOT NULL DEFAULT '',
    owner TEXT NOT NULL DEFAULT '',
    generation BIGINT NOT NULL DEFAULT 0,
    operator_pass BIGINT NOT NULL DEFAULT 0,
    flip_epoch BIGINT NOT NULL DEFAULT 0,
    flipped_ms BIGINT NOT NULL DEFAULT 0
)""",
    """CREATE TABLE IF NOT EXISTS {timestamps} (
    timeline TEXT NOT NULL,
    implementation TEXT NOT NULL CHECK (implementation IN ('legacy', 'distributed')),
    read_ts {u64:read_ts} NOT NULL,
    write_ts {u64:write_ts} NOT NULL,
    leader_epoch BIGINT NOT NULL,
    epoch BIGINT NOT NULL,
    active BOOLEAN NOT NULL,
    fence TEXT NOT NULL,
    rollout BOOLEAN NOT NULL,
    incarnation TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (timeline, implementation)
)""",
)
_SEED = """
INSERT INTO {deployment} (id, epoch, implementation, fence, rollout, incarnation, owner)
VALUES (1, 1, %(implementation)s, %(fence)s, %(rollout)s, %(incarnation)s, %(owner)s)
ON CONFLICT (id) DO NOTHING
"""
# Columns added after the first release, with what older rows get: the empty incarnation (their
# clients keep working; a later drop and re-provision still gets a fresh one), no owner (the
# first operator resource to reconcile adopts it), generation 0, no operator pass counted, no
# flip timed (the operator times the window from when it first sees it: modes.FlipClock).
ADDED_COLUMNS = (
    ("deployment", "incarnation", "TEXT NOT NULL DEFAULT ''"),
    ("deployment", "owner", "TEXT NOT NULL DEFAULT ''"),
    ("deployment", "generation", "BIGINT NOT NULL DEFAULT 0"),
    ("deployment", "operator_pass", "BIGINT NOT NULL DEFAULT 0"),
    ("deployment", "flip_epoch", "BIGINT NOT NULL DEFAULT 0"),
    ("deployment", "flipped_ms", "BIGINT NOT NULL DEFAULT 0"),
    ("timestamps", "incarnation", "TEXT NOT NULL DEFAULT ''"),
)


async def ensure_tables(backend: Backend, *, implementation: str, fence: str,
                        owner: str = "") -> None:
    """Create what is missing; seed the deployment row only if it does not exist yet."""
    await schema.create(backend, _DDL)
    await schema.add_columns(backend, ADDED_COLUMNS)
    await schema.tune_hot_table(backend, "timestamps")
    await backend.fetch(_SEED, {"implementation": implementation, "fence": fence,
                                "rollout": False, "incarnation": new_incarnation(),
                                "owner": owner})


async def tables_exist(backend: Backend) -> bool:
    return await schema.tables_exist(backend, TABLES)


def new_incarnation() -> str:
    """A name for one provisioning of a schema, so that a drop and re-create is told apart."""
    return secrets.token_hex(8)

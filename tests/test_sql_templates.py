"""SQL templates and backend views, without a server: a field is a table, `{u64:column}`, or
an error; fragments are written in by the module that owns them."""

from __future__ import annotations

import re

import pytest

import tsoracle
from tsoracle.fencing.leader import _CONFIRM, _RESERVE
from tsoracle.fencing.tables import FRAGMENTS, TABLES, fenced
from tsoracle.oracle.distributed import _SQL
from tsoracle.oracle.provision import CATALOG_TABLES, DEPLOYMENT_TABLES
from tsoracle.store import open_backend, parse_url
from tsoracle.store.dialect import TABLES as SCHEMA_TABLES
from tsoracle.store.dialect import expand
from tsoracle.store.postgres import PostgresDialect
from tsoracle.store.sqlite import SqliteDialect

DIALECTS = [PostgresDialect("s"), PostgresDialect("s", cockroach=True), SqliteDialect("s")]


def test_the_dialect_knows_every_table_a_deployment_keeps():
    assert SCHEMA_TABLES == set(DEPLOYMENT_TABLES) == {*TABLES, *CATALOG_TABLES}


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: f"{d.name}")
@pytest.mark.parametrize("template", [*_SQL.values(), _RESERVE, _CONFIRM],
                         ids=lambda t: t[:30])
def test_fenced_statements_render_whole(dialect, template):
    text = dialect.render(template)
    assert not re.search(r"\{\w+(:\w+)?\}", text), text  # every field filled in
    assert "incarnation" in text or "leader_epoch" in text


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: f"{d.name}")
@pytest.mark.parametrize("field", ["{guard}", "{row}", "{timestamp}", "{u32:x}"])
def test_an_unknown_field_is_an_error_naming_it(dialect, field):
    # Before: {guard} rendered before fencing/tables.py was imported became a table "guard".
    with pytest.raises(ValueError, match=re.escape(field)):
        dialect.render(f"SELECT {field} FROM {{timestamps}}")


def test_fragments_are_written_in_where_the_statement_is_defined():
    statement = fenced("SELECT {guard} FROM {timestamps} WHERE {row}")
    assert statement == (f"SELECT {FRAGMENTS['guard']} FROM {{timestamps}} "
                         f"WHERE {FRAGMENTS['row']}")
    with pytest.raises(ValueError, match=re.escape("{timestmps}")):
        fenced("SELECT {guard} FROM {timestmps}")  # a typo fails at definition
    assert expand("SELECT {x} FROM {deployment}", {"x": "1"}) == "SELECT 1 FROM {deployment}"


async def test_closing_a_view_leaves_its_backends_connections_open(tmp_path):
    root = open_backend(parse_url(f"sqlite:///{tmp_path / 'db'}"), create=True)
    await root.open()
    view = root.for_schema("other")
    assert (view.url.schema, view.dialect.schema, root.dialect.schema) == \
        ("other", "other", "tsoracle")
    await view.close()
    assert await root.fetch("SELECT 1") == [(1,)]
    assert await view.fetch("SELECT 2") == [(2,)]  # still the root's connection
    await root.close()
    with pytest.raises(tsoracle.OracleClosed):
        await root.fetch("SELECT 1")

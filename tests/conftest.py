"""Shared fixtures: a real PostgreSQL server for the session, SQLite files per test."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tests"))

from localpg import LocalPostgres  # noqa: E402

BACKENDS = ["sqlite", "postgresql"]
IMPLEMENTATIONS = ["distributed", "legacy"]


@pytest.fixture(scope="session")
def pg(tmp_path_factory: pytest.TempPathFactory):
    server = LocalPostgres(tmp_path_factory.mktemp("pg") / "server")
    server.start()
    yield server
    server.destroy()


def fresh_schema() -> str:
    return "t_" + uuid.uuid4().hex[:12]


@pytest.fixture
def pg_url(pg: LocalPostgres) -> str:
    """A URL with a schema of its own, so tests never see each other's state."""
    return f"{pg.url()}?schema={fresh_schema()}"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'oracle.db'}"


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'oracle.db'}"
    return f"{request.getfixturevalue('pg').url()}?schema={fresh_schema()}"


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request: pytest.FixtureRequest) -> str:
    return request.param

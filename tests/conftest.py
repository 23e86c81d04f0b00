"""Shared fixtures: a real PostgreSQL server for the session, SQLite files per test."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from tsoracle_dev import jvm
from tsoracle_dev.controlplane.cluster import ControlPlane
from tsoracle_dev.kube import Kube, Operator
from tsoracle_dev.kubetools import tools_dir
from tsoracle_dev.localpg import LocalPostgres

ROOT = Path(__file__).resolve().parent.parent

# Batched reads and confirmations pipeline at any round trip in the tests (the default starts
# at 0.5 ms, which loopback never reaches): every suite runs with several batches in flight.
# Subprocesses (workloads, lincheck workers) inherit it.
os.environ.setdefault("TSORACLE_PIPELINE_FROM_RTT_MS", "0")
# Every local Spark driver the tests start (sessions, `tsoracle demo`, the docs' pages, the
# submitting side of spark-submit) is short-lived: C1 only, the serial collector
# (tsoracle_dev.jvm). spark-submit puts $SPARK_SUBMIT_OPTS on the driver JVM's command line.
os.environ["SPARK_SUBMIT_OPTS"] = jvm.with_short_lived(os.environ.get("SPARK_SUBMIT_OPTS"))

BACKENDS = ["sqlite", "postgresql"]
# CockroachDB runs every transaction SERIALIZABLE; PostgreSQL does when a DBA says so. Suites
# whose contract must hold there too are marked `pytest.mark.serializable`: their `url` also
# runs on a PostgreSQL database whose default_transaction_isolation is serializable.
SERIALIZABLE = "postgresql-serializable"
IMPLEMENTATIONS = ["distributed", "legacy"]


def _parametrized_by_test(metafunc: pytest.Metafunc, name: str) -> bool:
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else names
        if name in names:
            return True
    return False


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "url" in metafunc.fixturenames and not _parametrized_by_test(metafunc, "url"):
        serializable = metafunc.definition.get_closest_marker("serializable") is not None
        backends = BACKENDS + [SERIALIZABLE] * serializable
        metafunc.parametrize("url", [pytest.param(b, marks=() if b == "sqlite" else pytest.mark.pg)
                                     for b in backends], indirect=True)


# --- Tiers: each test is marked with what it needs (pyproject.toml registers the markers) ----
# `make test-fast` runs the tests that need none of them. A fixture of this table anywhere
# among a test's fixtures marks the test; the `url` fixture's PostgreSQL parameters carry `pg`
# (above); modules that start servers themselves mark their tests by hand.
FIXTURE_TIERS = {
    "pg": "pg",  # pg_url, database and every fixture over them request it
    "kube": "kube",  # chart, oracle_ns
    "spark": "spark",
    # test_images.py: image builds (debootstrap, minutes when cold) and a containerd of its own
    "archives": "slow", "spark_archive": "slow", "containerd": "node",
}


# pytest-xdist: what one machine has only one of. Tests marked with a key run in one worker,
# one after another: the dev cluster's node (its fixed node address, pod network, iptables
# chains and /run/tsoracle-node; test_images' own containerd too). test_lincheck.py groups its
# partition scenarios the same way.
XDIST_GROUPS = {"node": "node"}


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # a run without xdist has no such hook
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto`: a worker per core and one more. Two workers on two cores left them about a
    fifth idle (tests waiting on pods, reconciles, scrapes); a third filled them: tests 1,296 s
    against 1,420 s in fresh clones (docs/performance.md, "CI"). $PYTEST_XDIST_AUTO_NUM_WORKERS
    still decides when set (xdist's own hook reads it)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return len(os.sched_getaffinity(0)) + 1


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for name in sorted(FIXTURE_TIERS.keys() & set(getattr(item, "fixturenames", ()))):
            item.add_marker(FIXTURE_TIERS[name])
        for marker, group in XDIST_GROUPS.items():
            if item.get_closest_marker(marker) is not None:
                item.add_marker(pytest.mark.xdist_group(group))
                break


def pytest_collection_finish(session: pytest.Session) -> None:
    """A worker whose xdist groups were dropped (a pytest or xdist upgrade has done it) would
    run the node's tests beside another worker's: refuse the run instead."""
    # A worker has `workerinput`; a run started inside a worker (test_localpg's) inherits the
    # worker's environment but is no worker itself.
    if not hasattr(session.config, "workerinput") or not session.config.option.loadgroup:
        return
    lost = [item.nodeid for item in session.items
            if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        raise pytest.UsageError(f"pytest-xdist dropped the test groups ({lost[0]} and "
                                f"{len(lost) - 1} more): run with -n 0, or fix the versions")


class TierGuard:
    """A fixture of the table set up for a test without its marker (requested at run time, as
    `url` requests `pg`) fails that test: the fast tier must never start one. A plugin, not
    conftest hooks: pytest asks a session-scoped fixture's hooks of the session, at the rootdir,
    where this conftest does not apply."""

    def __init__(self) -> None:
        self.item: pytest.Item | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self.item = item

    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[object]) -> None:
        tier = FIXTURE_TIERS.get(fixturedef.argname)
        if tier and self.item is not None and self.item.get_closest_marker(tier) is None:
            pytest.fail(f"{self.item.nodeid} sets up `{fixturedef.argname}` but is not marked "
                        f"`{tier}` (tests/conftest.py, FIXTURE_TIERS)", pytrace=False)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TierGuard(), "tsoracle-tier-guard")


@pytest.fixture(scope="session")
def pg(tmp_path_factory: pytest.TempPathFactory):
    server = LocalPostgres(tmp_path_factory.mktemp("pg") / "server")
    server.destroy_when_this_process_exits()  # an interrupted or killed run leaves no server
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


@pytest.fixture
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each backend in turn (see pytest_generate_tests), with a schema of the test's own."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'oracle.db'}"
    server = request.getfixturevalue("pg")
    base = server.serializable_url() if request.param == SERIALIZABLE else server.url()
    return f"{base}?schema={fresh_schema()}"


@pytest.fixture(scope="session")
def lake_catalog(tmp_path_factory: pytest.TempPathFactory):
    """tsoracle's Iceberg catalog on a SQLite oracle, served in-process for the whole run:
    `.uri` (the catalog), `.url` (its oracle)."""
    import asyncio

    import tsoracle
    from tsoracle.catalog.serve import CatalogConfig, RunningCatalog

    home = tmp_path_factory.mktemp("lake")
    url = f"sqlite:///{home / 'oracle.db'}"
    asyncio.run(tsoracle.init(url))
    # The catalog's expiry window as short as the Lakehouse tests' read window (2 s), whose
    # maintenance test expires snapshots a few seconds old.
    with RunningCatalog(CatalogConfig(url=url, warehouse=str(home / "warehouse"),
                                      port=0, retention_s=2.0)) as running:
        yield SimpleNamespace(uri=running.url, url=url)


@pytest.fixture(scope="session")
def spark(lake_catalog):
    """One local Spark for the whole run (starting one costs seconds), with Iceberg: its
    catalog `tso` is `lake_catalog`, and a Lakehouse adds others while it runs. Spark fixes its
    jars when the JVM starts, so the run's one JVM has Iceberg's; nothing in the suite needs
    Spark without it in this process (test_spark_iceberg_session starts that in its own)."""
    from tsoracle.spark.session import iceberg_session

    session = iceberg_session(lake_catalog.uri, app_name="tsoracle-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request: pytest.FixtureRequest) -> str:
    return request.param


# --- Kubernetes: a real API server (built from Go modules) and the chart's RBAC -------------


def _reachable(kubeconfig: str, tools: Path) -> bool:
    try:
        proc = subprocess.run([str(tools / "kubectl"), "version", "--request-timeout=5s"],
                              capture_output=True, env={**os.environ, "KUBECONFIG": kubeconfig},
                              timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory):
    """An existing cluster when $KUBECONFIG reaches one, else a local control plane."""
    tools = tools_dir()
    existing = os.environ.get("KUBECONFIG")
    if existing and _reachable(existing, tools):
        yield Kube(Path(existing), tools)
        return
    plane = ControlPlane(tmp_path_factory.mktemp("controlplane") / "state", postgres=False)
    plane.purge_when_this_process_exits()  # an interrupted or killed run leaves no server
    kubeconfig = plane.up()
    try:
        yield Kube(kubeconfig, tools, plane=plane)
    finally:
        plane.down()


@pytest.fixture(scope="session")
def chart(kube: Kube, tmp_path_factory: pytest.TempPathFactory):
    """`helm install` the chart; its ServiceAccount's token runs every operator in the tests."""
    ns = kube.new_namespace("tsoracle-system")
    kube.helm("install", "tsoracle", str(ROOT / "charts" / "tsoracle"), "-n", ns)
    kube.kubectl("wait", "--for=condition=established", "--timeout=60s",
                 "crd/timestamporacles.tsoracle.io")
    kubeconfig = kube.token_kubeconfig(ns, "tsoracle",
                                       tmp_path_factory.mktemp("sa") / "kubeconfig")
    return SimpleNamespace(namespace=ns, sa="tsoracle", kubeconfig=kubeconfig)


@pytest.fixture
def database(pg: LocalPostgres) -> str:
    """A PostgreSQL database of the test's own; returns the URL a Secret would hold."""
    name = "db_" + uuid.uuid4().hex[:10]
    pg.sql(f"CREATE DATABASE {name} OWNER tsoracle", "postgres")
    return pg.url(database=name)


@pytest.fixture
def oracle_ns(kube: Kube, chart, database: str, tmp_path: Path):
    """A namespace with the backend Secret and an operator (under the chart's RBAC) watching it."""
    ns = kube.new_namespace("tso")
    kube.backend_secret(ns, "oracle-db", database)
    op = Operator(chart.kubeconfig, ns, tmp_path / "operator.log").start()
    yield SimpleNamespace(name=ns, url=database, operator=op, log=tmp_path / "operator.log")
    op.stop()


@pytest.fixture
def operator_events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """The (reason, message) of the Events the operator's executor posts with kopf.info, which
    posts them only inside a running operator."""
    from tsoracle.operator import execute

    posted: list[tuple[str, str]] = []
    monkeypatch.setattr(execute.kopf, "info",
                        lambda body, *, reason, message: posted.append((reason, message)))
    return posted

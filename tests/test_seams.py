"""The code's seams hold: floors import downwards only, each list is declared once and every
place that follows it covers it, and the docs name every metric and Degraded reason."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import tsoracle
from tsoracle.catalog import state
from tsoracle.oracle import metrics
from tsoracle.oracle.api import TimestampOracle
from tsoracle.oracle.operations import OPERATIONS
from tsoracle.oracle.provision import CATALOG_TABLES
from tsoracle.oracle.reopening import ReopeningOracle
from tsoracle.oracle.sync import SyncTimestampOracle
from tsoracle.spark.client import OracleClient
from tsoracle.store.kinds import KINDS, kind_of

PACKAGE = Path(tsoracle.__file__).parent
ROOT = PACKAGE.parent
# store < fencing < oracle < {resource, catalog} < {operator, spark, duckdb}: the operator and
# the engines' helpers (Spark, DuckDB) stand on the resource module and the Iceberg catalog
# (which knows nothing of resources) and know nothing of each other. The redactor (shared by
# the operator, the catalog and the kubectl plugin) stands on the store's URL forms. Neutral
# modules import no floor at all.
FLOORS = {"store": 0, "fencing": 1, "redact": 1, "oracle": 2, "resource": 3, "catalog": 3,
          "operator": 4, "spark": 4, "duckdb": 4}
NEUTRAL = {"errors", "coalesce", "extras", "output", "eventloop"}


def _floor(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "tsoracle" or len(parts) < 2:
        return None
    return FLOORS.get(parts[1], -1 if parts[1] in NEUTRAL else None)


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):  # function-level imports too
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return found


def test_no_floor_imports_a_higher_one():
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        own = _floor(module)
        if own is None:
            continue  # the command-line modules sit on top of everything
        for imported in _imports(path):
            theirs = _floor(imported)
            sibling = theirs == own >= 0 and imported.split(".")[1] != module.split(".")[1]
            if theirs is not None and (theirs > own or sibling):
                wrong.append(f"{module} imports {imported}")
    assert wrong == []


def test_the_library_never_imports_the_dev_tools():
    """tsoracle_dev (tools/) is installed beside the library, but its packages are the extras'."""
    wrong = [f"{path.relative_to(ROOT)} imports {imported}" for path in PACKAGE.rglob("*.py")
             for imported in _imports(path) if imported.split(".")[0] == "tsoracle_dev"]
    assert wrong == []


def test_every_place_that_follows_the_operations_covers_them():
    names = [op.name for op in OPERATIONS]
    assert tuple(names) == metrics.OPERATIONS
    for cls in (TimestampOracle, SyncTimestampOracle, ReopeningOracle, OracleClient):
        missing = [n for n in names if not callable(getattr(cls, n, None))]
        assert missing == [], f"{cls.__name__} lacks {missing}"
    from tsoracle.cli import build_parser

    ts = next(a for a in build_parser()._subparsers._group_actions[0].choices["ts"]._actions
              if a.dest == "op")
    assert list(ts.choices) == [op.command for op in OPERATIONS]


def test_the_deployment_drops_every_table_the_catalog_creates():
    pattern = r"CREATE TABLE IF NOT EXISTS \{(\w+)\}"
    created = {m for ddl in state._DDL for m in re.findall(pattern, ddl)}
    assert created == set(CATALOG_TABLES)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_each_backend_is_found_by_its_schemes(kind):
    for scheme in kind.schemes:
        assert kind_of(scheme + "x") is kind
    module = __import__(kind.module, fromlist=["BACKEND"])
    assert module.BACKEND.__module__ == kind.module


def test_an_unknown_scheme_names_every_registered_one():
    with pytest.raises(tsoracle.ConfigError) as err:
        tsoracle.store.parse_url("mysql://u:pw@h/db")
    for kind in KINDS:
        for scheme in kind.schemes:
            assert scheme in str(err.value)


def test_the_docs_name_every_metric_and_degraded_reason():
    docs = "".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))
    names = re.findall(r'(?:Family|Counter|Gauge|Histogram)\(\s*"(tsoracle_\w+)"',
                       (PACKAGE / "oracle" / "metrics.py").read_text()
                       + (PACKAGE / "operator" / "metrics.py").read_text())
    assert len(names) > 10
    assert [n for n in names if n not in docs] == []
    runbook = (ROOT / "docs" / "runbooks" / "reconcile-failing.md").read_text()
    sources = "".join(p.read_text() for p in (PACKAGE / "operator").glob("*.py")) \
        + (PACKAGE / "resource.py").read_text()
    reasons = set(re.findall(r'Problem\(\s*"(\w+)"', sources)) \
        | set(re.findall(r'degraded_reason\s*=\s*"(\w+)"', sources)) \
        | set(re.findall(r'"(\w+)" if url is not None else "(\w+)"', sources)[0])
    assert len(reasons) >= 9
    assert sorted(r for r in reasons if f"`{r}`" not in runbook) == []


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text())
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def test_the_operator_is_made_of_short_functions():
    """Issue 34: every decision is a small pure function in model.py; nothing in
    tsoracle/operator/ grows past 40 lines."""
    long = [(f"{path.name}:{fn.name}", fn.end_lineno - fn.lineno + 1)
            for path in sorted((PACKAGE / "operator").glob("*.py")) for fn in _functions(path)
            if fn.end_lineno is not None and fn.end_lineno - fn.lineno + 1 > 40]
    assert long == []


def test_the_handlers_branch_on_no_spec_or_status_field():
    """Decisions on what a resource says live in model.py (unit-tested without an API
    server); the handlers read, call and carry out."""
    source = (PACKAGE / "operator" / "handlers.py").read_text()
    tests = [ast.unparse(n.test) for n in ast.walk(ast.parse(source))
             if isinstance(n, ast.If | ast.IfExp | ast.While)]
    deciding = [t for t in tests if re.search(r"\bspec\.\w|status\.get|status\[", t)]
    assert deciding == []

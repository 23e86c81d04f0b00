"""Schema-driven fuzzing of the catalog with Apache Iceberg's own REST catalog OpenAPI document.

Schemathesis (PyPI) generates requests from `rest-catalog-open-api.yaml` of the Iceberg version
the REST Compatibility Kit runs (tools/tsoracle_dev/rck: `fetch_spec`, pinned by the file's git
blob id, cached beside the kit's jars) and sends them to a catalog started as test_catalog.py
starts it, on SQLite (about a minute; the `url` fixture instead of `sqlite_url` runs PostgreSQL
too, at twice the time). Every response must be one the document allows: no 5xx
(`not_a_server_error`), a status code documented for the operation, the documented content
type, and a body valid against the documented schema.

- The document's paths are `/v1/{prefix}/...`; this catalog serves the empty prefix, so the
  served copy of the document drops `/{prefix}` (and the parameter), and keeps `GET /v1/config`
  and the operations the catalog lists in its `endpoints`: the others are optional, and this
  catalog serves none of them.
- A namespace `db` with a table `t` and a view `v` exists before the run, and half the
  generated `namespace`, `table` and `view` path parameters, and the identifiers in commit,
  rename and transaction bodies, are those names (Schemathesis dictionaries), so operations
  reach existing objects and not only 404s.
- Schemathesis runs its examples, coverage, fuzzing and stateful phases, valid and invalid data,
  with a fixed seed, deterministic generation, MAX_EXAMPLES fuzzed cases an operation (the
  coverage and stateful phases add their own), no per-case deadline, one worker, no example
  database, and no failure limit: every failure is collected. Schemathesis keeps one failure
  per operation and kind, and 500s all carry the same body, so each 500 is also paired with the
  exception the catalog logged for it (requests go one at a time): that tells causes apart.
- The counts (requests, 5xx) and every failure are printed (`pytest -s`) and are the assertion's
  message.

Without the document (`python -m tsoracle_dev.rck fetch --spec PATH` or TSORACLE_ICEBERG_SPEC:
Iceberg publishes it in no Maven artifact) the test is skipped and says how to provide it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import traceback
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

import tsoracle
from tests.test_catalog import call
from tsoracle.catalog.serve import CatalogConfig, RunningCatalog
from tsoracle_dev.rck import SPEC_VERSION, RckError, fetch_spec

pytestmark = pytest.mark.slow  # about a minute: thousands of requests

SEED = 20251127
MAX_EXAMPLES = 20
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_schema_conformance")
RUN_TIMEOUT = 900.0

NAMESPACE, TABLE, VIEW = "db", "t", "v"
SCHEMA = {"type": "struct", "schema-id": 0,
          "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
VIEW_BODY = {
    "name": VIEW, "schema": SCHEMA,
    "view-version": {"version-id": 1, "timestamp-ms": 1, "schema-id": 0,
                     "summary": {"engine-name": "tests"},
                     "representations": [{"type": "sql", "sql": "SELECT id FROM db.t",
                                          "dialect": "spark"}],
                     "default-namespace": [NAMESPACE]},
    "properties": {}}


@pytest.fixture(scope="module")
def document() -> Path:
    try:
        return fetch_spec()
    except RckError as exc:
        pytest.skip(f"Iceberg {SPEC_VERSION}'s REST catalog OpenAPI document: {exc}")


def served_document(original: dict[str, Any], endpoints: list[str]) -> dict[str, Any]:
    """The document as this catalog serves it: no `{prefix}`, only the listed operations (and
    GET /v1/config)."""
    served = {e.replace("/{prefix}", "") for e in endpoints} | {"GET /v1/config"}
    doc = dict(original)
    paths: dict[str, Any] = {}
    for path, item in original["paths"].items():
        path = path.replace("/{prefix}", "")
        kept = {}
        for key, value in item.items():
            if key == "parameters":
                value = [p for p in value if p.get("$ref") != "#/components/parameters/prefix"]
            elif f"{key.upper()} {path}" not in served:
                continue
            kept[key] = value
        if set(kept) - {"parameters", "summary", "description"}:
            paths[path] = kept
    doc["paths"] = _wrapped_errors(paths)
    return doc


ERROR_MODEL = "#/components/schemas/ErrorModel"
WRAPPED = "#/components/schemas/IcebergErrorResponse"


def _wrapped_errors(node: Any) -> Any:
    """The view operations' error responses as the document's own `IcebergErrorResponse`
    ("JSON wrapper for all error responses (non-2xx)"): in 1.10.0 those few name the bare
    `ErrorModel` instead, unlike every other operation and the document's own examples, and
    Iceberg's Java client and reference server use the wrapper for views too."""
    if isinstance(node, dict):
        if node.get("schema") == {"$ref": ERROR_MODEL}:
            node = {**node, "schema": {"$ref": WRAPPED}}
        return {k: _wrapped_errors(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_wrapped_errors(v) for v in node]
    return node


# Names of the objects created before the run, and where generated requests use them (half the
# time): path parameters, and the identifiers in bodies (commits, renames, transactions).
DICTIONARIES = {"namespace": [NAMESPACE], "table": [TABLE], "view": [VIEW], "name": [TABLE, VIEW]}
BINDINGS = {
    "path.namespace": "namespace", "path.table": "table", "path.view": "view",
    "body.identifier.namespace[*]": "namespace", "body.identifier.name": "name",
    "body.source.namespace[*]": "namespace", "body.source.name": "name",
    "body.table-changes[*].identifier.namespace[*]": "namespace",
    "body.table-changes[*].identifier.name": "table",
}


def settings() -> str:
    """Schemathesis' configuration file (TOML)."""
    lines = [
        f"seed = {SEED}",
        "workers = 1",
        "continue-on-failure = true",
        "[generation]",
        f"max-examples = {MAX_EXAMPLES}",
        'mode = "all"',
        "deterministic = true",
        'database = "none"',
        "[output.sanitization]",  # it hides values it takes for secrets (`key-id`, say)
        "enabled = false",
        "[checks]",
        "enabled = false",
        *(f"{check}.enabled = true" for check in CHECKS),
    ]
    for name, values in DICTIONARIES.items():
        lines += [f"[dictionaries.{name}]", f"values = {json.dumps(values)}"]
    lines.append("[parameters]")
    lines += [f'"{key}" = {{ dictionary = "{name}", probability = 0.5 }}'
              for key, name in BINDINGS.items()]
    return "\n".join(lines) + "\n"


class Exceptions(logging.Handler):
    """The catalog's logged exceptions (its 500s), in order."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            frames = traceback.extract_tb(exc.__traceback__)
            where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
            ours = [f for f in frames if "/tsoracle/" in f.filename]
            via = f" via {Path(ours[-1].filename).name}:{ours[-1].lineno}" if ours else ""
            self.seen.append(f"{type(exc).__name__}: {str(exc)[:120]} at {where}{via}")


def request_text(entry: dict[str, Any]) -> str:
    request = entry["request"]
    body = (request.get("postData") or {}).get("text")
    return f"{request['method']} {request['url']}" + (f" {body}" if body else "")


def failures_from_junit(path: Path) -> list[str]:
    found = []
    for case in ET.parse(path).getroot().iter("testcase"):
        for failure in [*case.iter("failure"), *case.iter("error")]:
            found.append(f"--- {case.get('name')} ({failure.get('message')})\n"
                         f"{(failure.text or '').strip()}")
    return found


def test_the_catalog_answers_as_icebergs_openapi_document_says(document, sqlite_url, tmp_path):
    asyncio.run(tsoracle.init(sqlite_url))
    config = CatalogConfig(url=sqlite_url, warehouse=str(tmp_path / "warehouse"), port=0)
    reports = tmp_path / "reports"
    exceptions = Exceptions()
    catalog_log = logging.getLogger("tsoracle.catalog")
    with RunningCatalog(config) as running:
        base = running.url
        for path, body in [("/v1/namespaces", {"namespace": [NAMESPACE]}),
                           (f"/v1/namespaces/{NAMESPACE}/tables", {"name": TABLE,
                                                                   "schema": SCHEMA}),
                           (f"/v1/namespaces/{NAMESPACE}/views", VIEW_BODY)]:
            status, answer = call("POST", base + path, body)
            assert status == 200, (path, status, answer)
        status, answer = call("GET", base + "/v1/config")
        assert status == 200, answer
        spec = served_document(yaml.safe_load(document.read_text()), answer["endpoints"])
        (tmp_path / "document.json").write_text(json.dumps(spec))
        (tmp_path / "schemathesis.toml").write_text(settings())
        command = [sys.executable, "-m", "schemathesis.cli", "--config-file",
                   str(tmp_path / "schemathesis.toml"), "run", str(tmp_path / "document.json"),
                   "--url", base, "--report", "har,junit,json", "--report-dir", str(reports)]
        catalog_log.addHandler(exceptions)
        try:
            # In its own folder: Schemathesis and Hypothesis leave nothing in the checkout.
            proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True,
                                  timeout=RUN_TIMEOUT, env={**os.environ, "NO_COLOR": "1"})
        finally:
            catalog_log.removeHandler(exceptions)
    assert proc.returncode in (0, 1), (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])

    run = json.loads(next(reports.glob("json-*.json")).read_text())
    entries = json.loads(next(reports.glob("har-*.json")).read_text())["log"]["entries"]
    entries.sort(key=lambda e: e["startedDateTime"])
    statuses = Counter(e["response"]["status"] for e in entries)
    server_errors = [e for e in entries if e["response"]["status"] >= 500]
    failures = failures_from_junit(next(reports.glob("junit-*.xml")))

    # Each 500 with the exception the catalog logged for it, grouped by cause (the pairing is by
    # order, so only when the counts agree); other 5xx by status and body.
    fives = [e for e in server_errors if e["response"]["status"] == 500]
    causes: dict[str, list[dict[str, Any]]] = {}
    if len(fives) == len(exceptions.seen):
        for entry, cause in zip(fives, exceptions.seen, strict=True):
            causes.setdefault(f"500: {cause}", []).append(entry)
    elif fives:
        causes[f"500: {len(exceptions.seen)} exceptions logged for {len(fives)} 500s"] = fives
    for entry in server_errors:
        if entry["response"]["status"] != 500:
            text = entry["response"]["content"].get("text", "")[:300]
            causes.setdefault(f"{entry['response']['status']}: {text}", []).append(entry)

    operations = run["operations"]
    summary = (f"Iceberg {SPEC_VERSION} REST catalog document, {operations['tested']} of "
               f"{operations['selected']} operations tested; {len(entries)} requests, "
               f"{len(server_errors)} with a 5xx; statuses "
               f"{dict(sorted(statuses.items()))}; {len(failures)} failures (Schemathesis "
               f"{run['schemathesis_version']}, seed {SEED}, {MAX_EXAMPLES} examples an "
               f"operation, {run['running_time']:.0f} s)")
    lines = [summary]
    for cause, hits in sorted(causes.items(), key=lambda kv: -len(kv[1])):
        smallest = min(hits, key=lambda e: len(request_text(e)))
        lines.append(f"{len(hits)} x {cause}\n    e.g. {request_text(smallest)[:2000]}")
    lines += failures
    report = "\n".join(lines)
    print(proc.stdout)
    print(report)
    assert operations["tested"] == operations["selected"] > 0, summary
    assert not server_errors and not failures and proc.returncode == 0, report

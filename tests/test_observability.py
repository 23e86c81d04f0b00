"""Dashboards and alerts against a real Prometheus scraping real tsoracle processes."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

import tsoracle
from tsoracle_dev.dashboards import build, grafana_model
from tsoracle_dev.dashboards.panels import (
    ALERT_SIGNALS,
    ALERTS,
    CATALOG_PANELS,
    OPERATOR_PANELS,
    ORACLE_PANELS,
)
from tsoracle_dev.kube import is_ready
from tsoracle_dev.localpg import LocalPostgres, free_port

ROOT = Path(__file__).resolve().parents[1]

EXAMPLE = ROOT / "examples" / "timestamporacle.yaml"


def query(port: int, expr: str) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def test_generated_files_are_current_and_rules_load(tmp_path):
    assert build.main(["--check"]) == 0, "run tsoracle-dashboards"
    proc = subprocess.run(["promtool", "check", "rules",
                           str(ROOT / "charts/tsoracle/files/alerts.rules.yaml")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in proc.stdout
    for _, _, _, _, _, runbook, _ in ALERTS:
        assert (ROOT / "docs" / "runbooks" / f"{runbook}.md").exists()
    boards = [json.loads(p.read_text())
              for p in (ROOT / "charts/tsoracle/dashboards").glob("*.json")]
    exprs = {t["expr"] for b in boards for panel in b["panels"] for t in panel["targets"]}
    assert exprs == {p.expr for p in ORACLE_PANELS + OPERATOR_PANELS + CATALOG_PANELS}


BOARDS = sorted((ROOT / "charts/tsoracle/dashboards").glob("*.json"))


@pytest.mark.parametrize("path", BOARDS, ids=lambda p: p.name)
def test_dashboards_pass_grafanas_dashboard_model(path):
    board = json.loads(path.read_text())
    assert grafana_model.problems(board) == []
    assert board["schemaVersion"] == grafana_model.SCHEMA_VERSION
    assert {p["type"] for p in board["panels"]} == {"timeseries"}
    assert all(p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
               for p in board["panels"])


def _set(path: str, value: object):
    """A change at a dotted path into the dashboard ("panels.0.gridPos.h")."""
    def change(board: dict) -> None:
        *head, last = path.split(".")
        node = board
        for key in head:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is _DROP:
            del node[last]
        else:
            node[last] = value
    return change


_DROP = object()

BROKEN = {
    # a field the schema does not have, in the panel, its field config, its query
    "unknown panel field": (_set("panels.0.colour", "red"), "panels[0].colour: not a field"),
    "unknown custom field": (_set("panels.0.fieldConfig.defaults.custom.lineWidht", 2),
                             "custom.lineWidht: not a field"),
    "unknown query field": (_set("panels.0.targets.0.exprs", "up"),
                            "targets[0].exprs: not a field"),
    # a field of the wrong type
    "gridPos.h a string": (_set("panels.0.gridPos.h", "8"), "gridPos.h: expected an integer"),
    "title a number": (_set("panels.0.title", 5), "panels[0].title: expected a string"),
    "editable a number": (_set("editable", 1), "editable: expected a boolean"),
    "expr a number": (_set("panels.0.targets.0.expr", 3), "expr: expected a string"),
    "tags a string": (_set("tags", "tsoracle"), "tags: expected a list"),
    "datasource a string (grafanalib's)": (_set("panels.0.datasource", "${datasource}"),
                                           "panels[0] (str \""),
    # values outside the schema's enums, nulls, a missing required field, an unknown plugin
    "legend displayMode": (_set("panels.0.options.legend.displayMode", "lists"),
                           "displayMode: 'lists' is not one of"),
    "drawStyle": (_set("panels.0.fieldConfig.defaults.custom.drawStyle", "curve"),
                  "drawStyle: 'curve' is not one of"),
    "null description": (_set("panels.0.description", None), "description: null"),
    "no refId": (_set("panels.0.targets.0.refId", _DROP), "refId: missing"),
    "unknown panel type": (_set("panels.0.type", "timeseriez"), "'timeseriez' is not a panel"),
    "old schemaVersion": (_set("schemaVersion", 12), "schemaVersion: 12"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_grafanas_dashboard_model_rejects_a_broken_dashboard(case):
    change, expected = BROKEN[case]
    board = json.loads(BOARDS[0].read_text())
    change(board)
    found = grafana_model.problems(board)
    assert found and any(expected in f for f in found), found


def test_the_build_refuses_a_dashboard_the_model_rejects(monkeypatch):
    # grafanalib's own JSON (nulls, pre-7 fields, datasource as a string) is what Grafana's
    # model rejects; without the conversion the build must fail rather than write it.
    monkeypatch.setattr(build, "grafana_v1", lambda data: data)
    with pytest.raises(ValueError, match="Grafana's dashboard model rejects it"):
        build.dashboard("t", "t", ORACLE_PANELS)
    monkeypatch.undo()
    assert grafana_model.problems(json.loads(build.dashboard("t", "t", ORACLE_PANELS))) == []


@pytest.fixture
def prometheus(tmp_path):
    def start(targets: list[int]) -> int:
        port = free_port()
        rules = tmp_path / "rules.yaml"
        rules.write_text(build.rules(for_override="5s"))  # production waits minutes
        config = tmp_path / "prometheus.yml"
        config.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "tsoracle", "static_configs": [
                {"targets": [f"127.0.0.1:{p}" for p in targets]}]}],
        }))
        proc = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"))
        procs.append(proc)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2)
                return port
            except OSError:
                time.sleep(0.3)
        raise AssertionError("prometheus did not start: "
                             + (tmp_path / "prometheus.log").read_text()[-2000:])

    procs: list[subprocess.Popen] = []
    yield start
    for p in procs:
        p.terminate()
        p.wait(10)


def wait_scraped(port: int, targets: int) -> None:
    """Until Prometheus has scraped every target once: counters then have a sample before the
    scenario moves them, so rates and increases over them are defined."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if len([r for r in query(port, "up == 1")["data"]["result"]]) >= targets:
            return
        time.sleep(0.5)
    raise AssertionError(f"Prometheus did not scrape {targets} targets: {query(port, 'up')}")


def finite(answer: dict) -> bool:
    return any(math.isfinite(float(r["value"][1])) for r in answer["data"]["result"])


@pytest.fixture
def observed(kube, oracle_ns, prometheus, tmp_path):
    """A workload process on its own PostgreSQL (which the tests take down), a catalog with
    writers that conflict (its own schema there), and the operator with a resource `orders`
    and one whose Secret is missing, all scraped by a real Prometheus (already once when this
    yields)."""
    own = LocalPostgres(tmp_path / "pg")
    url = own.start() + "?schema=obs"
    asyncio.run(tsoracle.init(url, timelines=["EpochMilliseconds", "counter:obs"]))
    wport = free_port()
    workload = subprocess.Popen([sys.executable, "-m", "tsoracle_dev.metrics_workload",
                                 url, str(wport), "3600"], stdout=subprocess.DEVNULL,
                                stderr=open(tmp_path / "workload.log", "w"))
    # The catalog on a schema of its own: the flips of `obs` below are the workload's.
    catalog_url = url.replace("schema=obs", "schema=obs_catalog")
    asyncio.run(tsoracle.init(catalog_url))
    cport = free_port()
    catalog = subprocess.Popen([sys.executable, "-m", "tsoracle_dev.catalog_workload",
                                catalog_url, str(tmp_path / "warehouse"), str(cport), "3600"],
                               stdout=subprocess.DEVNULL,
                               stderr=open(tmp_path / "catalog.log", "w"))
    try:
        ns = oracle_ns.name
        kube.kubectl("-n", ns, "apply", "-f", str(EXAMPLE))
        kube.wait_tso(ns, "orders", is_ready)
        kube.kubectl("-n", ns, "apply", "-f", "-", stdin=json.dumps({
            "apiVersion": "tsoracle.io/v1alpha1", "kind": "TimestampOracle",
            "metadata": {"name": "orphan"},
            "spec": {"backend": {"urlSecretRef": {"name": "missing"}, "schema": "orphan"}}}))
        pport = prometheus([wport, oracle_ns.operator.metrics_port, cport])
        wait_scraped(pport, 3)

        def operator_flip(to: str) -> None:
            kube.kubectl("-n", ns, "patch", "tso", "orders", "--type", "merge", "-p",
                         json.dumps({"spec": {"implementation": to}}))

        yield SimpleNamespace(own=own, url=url, pport=pport, operator_flip=operator_flip)
    finally:
        for proc in (workload, catalog):
            proc.terminate()
            proc.wait(10)
        own.destroy()


def kill_connections(own: LocalPostgres) -> None:
    own.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'tsoracle'")


def test_every_panel_and_alert_returns_data_and_an_alert_fires(observed):
    o = observed
    o.operator_flip("legacy")  # a flip the operator makes: flips, flip duration
    asyncio.run(tsoracle.flip(o.url, to="legacy"))  # fences the workload: failed operations
    exprs = [p.expr for p in ORACLE_PANELS + OPERATOR_PANELS + CATALOG_PANELS]
    exprs += [e for signals in ALERT_SIGNALS.values() for e in signals]
    assert set(ALERT_SIGNALS) == {a[0] for a in ALERTS}
    missing: list[str] = exprs
    deadline = time.monotonic() + 180  # a [30m:1m] subquery waits for a minute boundary
    while missing and time.monotonic() < deadline:
        kill_connections(o.own)  # lost connections: retries
        time.sleep(2)
        missing = []
        for expr in exprs:
            answer = query(o.pport, expr)
            assert answer["status"] == "success", (expr, answer)
            if not finite(answer):  # a quantile of no observations is NaN: no data either
                missing.append(expr)
    assert not missing, f"expressions without data: {missing}"
    # The fault: the backend goes away; TsoracleOperationsFailing must fire.
    o.own.stop()
    deadline = time.monotonic() + 180
    firing = []
    while not firing and time.monotonic() < deadline:
        time.sleep(2)
        with urllib.request.urlopen(f"http://127.0.0.1:{o.pport}/api/v1/alerts",
                                    timeout=10) as resp:
            alerts = json.loads(resp.read())["data"]["alerts"]
        firing = [a for a in alerts if a["labels"]["alertname"] ==
                  "TsoracleOperationsFailing" and a["state"] == "firing"]
    assert firing, "TsoracleOperationsFailing did not fire while the backend was down"
    reconcile = [a for a in alerts if a["labels"]["alertname"] == "TsoracleReconcileFailing"]
    assert reconcile and reconcile[0]["labels"]["reason"] == "SecretNotFound"


RENDER = os.environ.get("TSORACLE_RENDER_DOCS")


@pytest.mark.skipif(not RENDER, reason="renders the docs' dashboard pictures: set "
                    "TSORACLE_RENDER_DOCS=docs/img")
def test_render_dashboards_over_load_flip_fault_and_recovery(observed):
    """The pictures in docs/observability.md, about 7.5 minutes: two of load that the pictures
    leave out (so that every rate window is full), 15 s of killed connections (retries), a flip
    to legacy by the operator and of the workload's deployment, the workload's backend down for
    75 s (longer than the panels' 1m rate windows, so rates reach 0) and back for 90 s, a flip
    back to distributed, and another minute of load. Every panel must show data."""
    from tsoracle_dev.dashboards.render import render_all

    o = observed
    start = time.time()
    events: list[tuple[float, str]] = []

    def at(offset: float, label: str) -> None:
        while time.time() < start + offset:
            time.sleep(0.5)
        events.append((time.time(), label))

    at(125, "connections killed")
    while time.time() < start + 140:
        kill_connections(o.own)  # calls in flight are retried
        time.sleep(2)
    at(150, "flip to legacy")
    o.operator_flip("legacy")
    asyncio.run(tsoracle.flip(o.url, to="legacy"))
    at(200, "backend down")
    o.own.stop()
    at(275, "backend up")
    o.own.start()
    at(365, "flip to distributed")
    o.operator_flip("distributed")
    asyncio.run(tsoracle.flip(o.url, to="distributed"))
    at(425, "end")
    events.pop()
    empty = render_all(o.pport, Path(RENDER), start + 120, time.time(), events)
    assert not empty, f"panels without data in the pictures: {empty}"

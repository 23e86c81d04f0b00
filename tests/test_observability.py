"""Dashboards and alerts against a real Prometheus scraping real tsoracle processes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from localpg import LocalPostgres
from support.kube import free_port, is_ready

import tsoracle

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "dashboards"))

import build  # noqa: E402
from panels import ALERT_SIGNALS, ALERTS, OPERATOR_PANELS, ORACLE_PANELS  # noqa: E402

EXAMPLE = ROOT / "examples" / "timestamporacle.yaml"


def query(port: int, expr: str) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def test_generated_files_are_current_and_rules_load(tmp_path):
    assert build.main(["--check"]) == 0, "run tools/dashboards/build.py"
    proc = subprocess.run(["promtool", "check", "rules",
                           str(ROOT / "charts/tsoracle/files/alerts.rules.yaml")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in proc.stdout
    for _, _, _, _, _, runbook in ALERTS:
        assert (ROOT / "docs" / "runbooks" / f"{runbook}.md").exists()
    boards = [json.loads(p.read_text())
              for p in (ROOT / "charts/tsoracle/dashboards").glob("*.json")]
    exprs = {t["expr"] for b in boards for panel in b["panels"] for t in panel["targets"]}
    assert exprs == {e for _, e, _ in ORACLE_PANELS + OPERATOR_PANELS}


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


def test_every_panel_and_alert_returns_data_and_an_alert_fires(kube, oracle_ns, prometheus,
                                                               tmp_path):
    # The oracle side: a workload process on its own PostgreSQL (we take that server down).
    own = LocalPostgres(tmp_path / "pg")
    url = own.start() + "?schema=obs"
    asyncio.run(tsoracle.init(url, timelines=["EpochMilliseconds", "counter:obs"]))
    wport = free_port()
    workload = subprocess.Popen([sys.executable, str(ROOT / "tests/support/metrics_workload.py"),
                                 url, str(wport), "3600"], stdout=subprocess.DEVNULL,
                                stderr=open(tmp_path / "workload.log", "w"))
    try:
        # The operator side: a flip and a resource whose Secret is missing.
        ns = oracle_ns.name
        kube.kubectl("-n", ns, "apply", "-f", str(EXAMPLE))
        kube.wait_tso(ns, "orders", is_ready)
        kube.kubectl("-n", ns, "patch", "tso", "orders", "--type", "merge", "-p",
                     '{"spec":{"implementation":"legacy"}}')
        kube.kubectl("-n", ns, "apply", "-f", "-", stdin=json.dumps({
            "apiVersion": "tsoracle.io/v1alpha1", "kind": "TimestampOracle",
            "metadata": {"name": "orphan"},
            "spec": {"backend": {"urlSecretRef": {"name": "missing"}, "schema": "orphan"}}}))
        pport = prometheus([wport, oracle_ns.operator.metrics_port])
        time.sleep(4)
        asyncio.run(tsoracle.flip(url, to="legacy"))  # fences the workload: failed operations
        exprs = [e for _, e, _ in ORACLE_PANELS + OPERATOR_PANELS]
        exprs += [e for signals in ALERT_SIGNALS.values() for e in signals]
        assert set(ALERT_SIGNALS) == {a[0] for a in ALERTS}
        missing: list[str] = exprs
        deadline = time.monotonic() + 180  # a [30m:1m] subquery waits for a minute boundary
        while missing and time.monotonic() < deadline:
            own.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE usename = 'tsoracle'")  # lost connections: retries
            time.sleep(2)
            missing = []
            for expr in exprs:
                answer = query(pport, expr)
                assert answer["status"] == "success", (expr, answer)
                if not answer["data"]["result"]:
                    missing.append(expr)
        assert not missing, f"expressions without data: {missing}"
        if os.environ.get("TSORACLE_RENDER_DOCS"):
            from render import render_all

            render_all(pport, Path(os.environ["TSORACLE_RENDER_DOCS"]))
        # The fault: the backend goes away; TsoracleOperationsFailing must fire.
        own.stop()
        deadline = time.monotonic() + 180
        firing = []
        while not firing and time.monotonic() < deadline:
            time.sleep(2)
            with urllib.request.urlopen(f"http://127.0.0.1:{pport}/api/v1/alerts",
                                        timeout=10) as resp:
                alerts = json.loads(resp.read())["data"]["alerts"]
            firing = [a for a in alerts if a["labels"]["alertname"] ==
                      "TsoracleOperationsFailing" and a["state"] == "firing"]
        assert firing, "TsoracleOperationsFailing did not fire while the backend was down"
        reconcile = [a for a in alerts if a["labels"]["alertname"] == "TsoracleReconcileFailing"]
        assert reconcile and reconcile[0]["labels"]["reason"] == "SecretNotFound"
    finally:
        workload.terminate()
        workload.wait(10)
        own.destroy()

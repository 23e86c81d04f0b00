"""`kubectl tsoracle`, found by the real kubectl binary as a plugin, on the real API server."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from tsoracle.kubectl.api import PluginError
from tsoracle.kubectl.fencing import fencing_args
from tsoracle.kubectl.status import age
from tsoracle.redact import redact_texts, redacted_secret, secret_texts
from tsoracle_dev.kube import is_ready

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "timestamporacle.yaml"


@pytest.fixture
def plugin(kube, tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    # The console scripts pip installs: the same entry points, under this test's interpreter.
    for script, entry in (("kubectl-tsoracle", "kubectl_main"),
                          ("kubectl_complete-tsoracle", "kubectl_complete_main")):
        code = f"import sys; from tsoracle.cli import {entry}; sys.exit({entry}())"
        wrapper = bindir / script
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -c "{code}" "$@"\n')
        wrapper.chmod(0o755)
    env = {**kube.env(), "PATH": f"{bindir}:{os.environ['PATH']}"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        # `__complete` first: kubectl's own completion, which runs kubectl_complete-tsoracle.
        argv = ["__complete", "tsoracle", *args[1:]] if args[:1] == ("__complete",) \
            else ["tsoracle", *args]
        return subprocess.run([str(kube.tools / "kubectl"), *argv],
                              capture_output=True, text=True, env=env, timeout=180)

    return run


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


def test_status_flip_fencing_report(kube, oracle_ns, plugin, tmp_path):
    ns = oracle_ns.name
    kube.kubectl("-n", ns, "apply", "-f", str(EXAMPLE))
    kube.wait_tso(ns, "orders", is_ready)
    # A second resource in a namespace no operator watches: no status, a desired flip.
    other = kube.new_namespace("tso-other")
    kube.kubectl("-n", other, "apply", "-f", str(EXAMPLE))
    kube.kubectl("-n", other, "patch", "tso", "orders", "--type", "merge", "-p",
                 json.dumps({"spec": {"implementation": "legacy"}}))

    listed = plugin("status", "-n", ns)
    assert listed.returncode == 0, listed.stderr
    table = rows(listed.stdout)
    assert table[0] == ["NAME", "IMPLEMENTATION", "DESIRED", "EPOCH", "FENCING", "READY",
                        "REASON", "TIMELINES", "AGE"]
    assert table[1][:8] == ["orders", "distributed", "distributed", "1", "Always", "True",
                            "Reconciled", "2"]
    assert len(table) == 2
    every = plugin("status", "-A")
    assert every.returncode == 0, every.stderr
    by_ns = {r[0]: r for r in rows(every.stdout)[1:]}
    assert rows(every.stdout)[0][:2] == ["NAMESPACE", "NAME"]
    assert by_ns[ns][1:4] == ["orders", "distributed", "distributed"]
    # As `kubectl get tso` shows it: nothing in force yet, only the desired implementation.
    assert by_ns[other][1:9] == ["orders", "-", "legacy", "-", "-", "-", "-", "0"]
    listed_json = json.loads(plugin("status", "-A", "-o", "json").stdout)
    assert {(i["namespace"], i["name"]) for i in listed_json["items"]} >= {(ns, "orders"),
                                                                           (other, "orders")}
    empty = plugin("status", "-n", kube.new_namespace("tso-empty"))
    assert empty.returncode == 0 and "No TimestampOracle in namespace" in empty.stdout

    human = plugin("status", "orders", "-n", ns)
    assert human.returncode == 0, human.stderr
    assert "implementation  distributed" in human.stdout and "epoch           1" in human.stdout
    assert "ready           True (Reconciled)" in human.stdout
    assert "counter:orders" in human.stdout and "Conditions" in human.stdout
    machine = json.loads(plugin("status", "orders", "-n", ns, "-o", "json").stdout)
    assert machine["status"]["epoch"] == 1 and machine["epoch"] == 1
    assert machine["ready"] == "True" and machine["reason"] == "Reconciled"
    assert {t["name"] for t in machine["timelines"]} == {"EpochMilliseconds", "counter:orders"}
    as_yaml = yaml.safe_load(plugin("status", "orders", "-n", ns, "-o", "yaml").stdout)
    # The same view in YAML (lagMs moves with each status refresh between the two calls).
    def stable(view: dict) -> list[tuple[str, str, str]]:
        return [(t["name"], t["readTs"], t["writeTs"]) for t in view["timelines"]]

    assert stable(as_yaml) == stable(machine) and as_yaml["epoch"] == 1

    flipped = plugin("flip", "orders", "--to", "legacy", "-n", ns, "-o", "json")
    assert flipped.returncode == 0, flipped.stderr
    assert "waiting for the operator" in flipped.stderr  # progress off stdout for json
    result = json.loads(flipped.stdout)
    assert result["implementation"] == "legacy" and result["epoch"] == 2 and result["changed"]
    assert int(result["bootstrapTimestamp"]["counter:orders"]) >= 0
    again = plugin("flip", "orders", "--to", "legacy", "-n", ns)
    assert "nothing to do" in again.stdout

    # The printer columns of the CRD, as kubectl itself prints them.
    got = rows(kube.kubectl("-n", ns, "get", "tso").stdout)
    assert got[0] == ["NAME", "IMPLEMENTATION", "DESIRED", "EPOCH", "FENCING", "READY",
                      "REASON", "AGE"]
    assert got[1][:7] == ["orders", "legacy", "legacy", "2", "Always", "True", "Reconciled"]
    header, line = kube.kubectl("-n", other, "get", "tso").stdout.splitlines()[:2]
    # No operator there: empty cells, and the desired flip under DESIRED.
    assert line.split()[:2] == ["orders", "legacy"] and len(line.split()) == 3
    assert line.index("legacy") == header.index("DESIRED")

    rollout = plugin("fencing", "orders", "Rollout", "-n", ns, "-o", "yaml")
    assert rollout.returncode == 0, rollout.stderr
    assert yaml.safe_load(rollout.stdout) == {"name": "orders", "namespace": ns,
                                              "fencing": "Rollout"}
    assert kube.tso(ns, "orders")["spec"]["fencing"] == "Rollout"
    kube.wait_tso(ns, "orders", lambda o: o.get("status", {}).get("fencing") == "Rollout")
    assert rows(kube.kubectl("-n", ns, "get", "tso").stdout)[1][4] == "Rollout"
    off = plugin("fencing", "off", "orders", "-n", ns)  # the older order still works
    assert off.returncode == 0 and "warning" in off.stderr
    assert kube.tso(ns, "orders")["spec"]["fencing"] == "Disabled"
    assert plugin("fencing", "orders", "on", "-n", ns).returncode == 0
    assert kube.tso(ns, "orders")["spec"]["fencing"] == "Always"
    bad = plugin("fencing", "orders", "sometimes", "-n", ns)
    assert bad.returncode == 1 and "Always|Rollout|Disabled" in bad.stderr

    # An Event about the resource that quotes the URL: the report keeps it, redacted.
    kube.kubectl("-n", ns, "create", "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "orders.notice"},
        "involvedObject": {"apiVersion": "tsoracle.io/v1alpha1", "kind": "TimestampOracle",
                           "name": "orders", "namespace": ns},
        "reason": "BackendNotice", "type": "Warning",
        "message": f"backend {oracle_ns.url} refused the login"}))
    out = tmp_path / "report.zip"
    server = kube.kubectl("config", "view", "--minify", "-o",
                          "jsonpath={.clusters[0].cluster.server}").stdout
    assert server.startswith("https://")
    leaky = tmp_path / "leaky.log"  # a log that quotes the backend URL and its password
    leaky.write_text(f"connecting to {oracle_ns.url} failed\n"
                     f"password tsoracle-test-pw rejected\n"
                     f"watching {server}/apis/tsoracle.io/v1alpha1\n")
    rep = plugin("report", "orders", "-n", ns, "-f", str(out),
                 "--operator-log", str(oracle_ns.log), "--operator-log", str(leaky))
    assert rep.returncode == 0, rep.stderr
    assert "Secret values redacted" in rep.stdout
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        assert {"timestamporacle.yaml", "events.yaml", "secret.yaml", "operator-local-0.log",
                "operator-local-1.log"} <= names
        log = z.read("operator-local-1.log").decode()
        secret = yaml.safe_load(z.read("secret.yaml"))
        resource = yaml.safe_load(z.read("timestamporacle.yaml"))
        events = yaml.safe_load(z.read("events.yaml"))
        everything = "".join(z.read(n).decode() for n in names)
    assert "connecting to <redacted> failed" in log
    assert "password <redacted> rejected" in log
    assert f"watching {server}/apis" in log  # the API server's address is no secret
    assert secret["data"] == {"url": "<redacted>"}
    assert secret["metadata"]["labels"] == {"tsoracle.io/backend": "true"}
    assert resource["status"]["activeImplementation"] == "legacy"
    assert "managedFields" not in resource["metadata"]
    notice = next(e for e in events if e.get("reason") == "BackendNotice")
    assert notice["message"] == "backend <redacted> refused the login"
    # kopf's Events read cleanly: no API bookkeeping, no placeholder `action: Action?`.
    flipped = next(e for e in events if e.get("reason") == "Flipped")
    assert set(flipped) <= {"time", "type", "reason", "message", "count", "from"}
    assert all("action" not in e and "involvedObject" not in e for e in events)
    assert "tsoracle-test-pw" not in everything and oracle_ns.url not in everything
    as_json = plugin("report", "orders", "-n", ns, "-f", str(tmp_path / "r.zip"), "-o", "json")
    assert json.loads(as_json.stdout)["secretKeysRedacted"] == ["url"]
    with zipfile.ZipFile(tmp_path / "r.zip") as z:
        assert json.loads(z.read("timestamporacle.json"))["metadata"]["name"] == "orders"
    old_flag = plugin("report", "orders", "-n", ns, "--output", str(tmp_path / "x.zip"))
    assert old_flag.returncode == 2 and "-f/--file" in old_flag.stderr

    missing = plugin("status", "nope", "-n", ns)
    assert missing.returncode == 1 and "not found" in missing.stderr
    assert "Traceback" not in missing.stderr
    both = plugin("status", "orders", "-A")
    assert both.returncode == 1 and "-n" in both.stderr

    # kubectl's connection flags, before or after the command; a wrong one is one line.
    context = kube.kubectl("config", "current-context").stdout.strip()
    chosen = plugin("--context", context, "status", "orders", "-n", ns, "-o", "json")
    assert json.loads(chosen.stdout)["name"] == "orders", chosen.stderr
    wrong = plugin("status", "-n", ns, "--context", "nope")
    assert wrong.returncode == 1 and "no context 'nope' in the kubeconfig" in wrong.stderr
    assert wrong.stderr.count("\n") == 1

    # Shell completion through kubectl itself: resource names from the API server.
    names = plugin("__complete", "flip", "-n", ns, "or")
    assert names.stdout.splitlines() == ["orders", ":4"], names.stdout + names.stderr
    assert plugin("__complete", "fencing", "orders", "-n", ns, "R").stdout.splitlines() == \
        ["Rollout", ":4"]


# --- the pure parts ------------------------------------------------------------------------

def test_age_reads_like_kubectl():
    now = dt.datetime(2026, 1, 10, tzinfo=dt.UTC)

    def ago(**delta: float) -> str:
        return age((now - dt.timedelta(**delta)).isoformat().replace("+00:00", "Z"), now)

    assert [ago(seconds=59), ago(seconds=150), ago(minutes=45), ago(hours=5, minutes=7),
            ago(hours=30), ago(days=3, hours=4), ago(days=40)] == \
        ["59s", "2m30s", "45m", "5h7m", "30h", "3d4h", "40d"]
    assert age(None) == "-"


@pytest.mark.parametrize(("args", "expected"), [
    (("orders", "Rollout"), ("orders", "Rollout")),
    (("orders", "off"), ("orders", "Disabled")),
    (("on", "orders"), ("orders", "Always")),  # the first spelling: fencing on|off NAME
    (("off", "on"), ("off", "Always")),  # a resource named "off": NAME MODE wins
])
def test_fencing_arguments(args, expected):
    assert fencing_args(*args) == expected


def test_fencing_arguments_refuse_no_mode():
    # A mode in any case is a mode now (issue 28); two words that name none are refused.
    with pytest.raises(PluginError, match="Always|Rollout|Disabled"):
        fencing_args("orders", "nightly")


def test_only_secret_values_are_redacted():
    url = "postgresql://app:s3cret%2Fpw@db.internal:5432/app?sslmode=require"
    secrets = secret_texts([url, "token-abc123"])
    text = (f"url={url} decoded=s3cret/pw encoded=s3cret%2Fpw token-abc123 "
            "server https://10.0.0.1:6443 host db.internal")
    out = redact_texts(text, secrets)
    assert "s3cret" not in out and "token-abc123" not in out and url not in out
    # Addresses are not secrets: the API server's and the database host stay readable.
    assert "https://10.0.0.1:6443" in out and "host db.internal" in out
    kept = redacted_secret({"metadata": {"name": "db", "namespace": "n",
                                         "labels": {"a": "b"},
                                         "annotations": {"last-applied": url}},
                            "type": "Opaque", "data": {"url": "eA==", "ca": "eQ=="}})
    assert kept["data"] == {"ca": "<redacted>", "url": "<redacted>"}
    assert kept["metadata"]["annotations"] == {"last-applied": "<redacted>"}
    assert kept["metadata"]["labels"] == {"a": "b"}

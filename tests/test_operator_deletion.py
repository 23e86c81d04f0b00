"""Deletion always finishes (issue 28, item 3), on the real API server with the operator as a
process and a real PostgreSQL.

Before: a resource whose database could not be reached (a wrong password in its Secret) could
never be deleted, even one that never provisioned anything; it posted a Warning Event every
5 s; `DeletionBlocked` did not count in tsoracle_operator_failures_total, so the alert whose
runbook lists it could not fire; and the runbook gave no way out.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.request

from tests.test_operator_ownership import at_epoch, degraded, oracle
from tsoracle_dev.kube import condition, is_ready


def _point_secret_at(kube, ns: str, url: str) -> None:
    patch = {"data": {"url": base64.b64encode(url.encode()).decode()}}
    kube.kubectl("-n", ns, "patch", "secret", "oracle-db", "-p", json.dumps(patch))


def _failures(port: int, reason: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    key = f'tsoracle_operator_failures_total{{reason="{reason}"}}'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(key))


def _schemas(pg, url: str) -> set[str]:
    rows = pg.sql("SELECT schema_name FROM information_schema.schemata", url.rsplit("/", 1)[1])
    return {str(r[0]) for r in rows}


def _gone(kube, ns: str, name: str, seconds: int) -> None:
    kube.kubectl("-n", ns, "wait", "--for=delete", f"tso/{name}", f"--timeout={seconds}s")


def test_a_resource_that_never_provisioned_deletes_at_once(kube, oracle_ns):
    ns = oracle_ns.name
    _point_secret_at(kube, ns, oracle_ns.url.replace("tsoracle-test-pw", "wrong-pw"))
    kube.kubectl("-n", ns, "apply", "-f", "-", stdin=oracle("badone", "s_badone",
                                                            policy="Delete"))
    kube.wait_tso(ns, "badone", degraded("BackendUnavailable"))
    kube.kubectl("-n", ns, "delete", "tso", "badone", "--wait=false")
    _gone(kube, ns, "badone", 30)
    assert kube.events(ns, "DeletionBlocked") == []


def test_a_blocked_deletion_backs_off_counts_and_the_annotation_ends_it(kube, oracle_ns, pg):
    ns, port = oracle_ns.name, oracle_ns.operator.metrics_port
    kube.kubectl("-n", ns, "apply", "-f", "-", stdin=oracle("stuck", "s_stuck", policy="Delete"))
    kube.wait_tso(ns, "stuck", at_epoch(1))
    _point_secret_at(kube, ns, oracle_ns.url.replace("tsoracle-test-pw", "wrong-pw"))
    before = _failures(port, "DeletionBlocked")
    kube.kubectl("-n", ns, "delete", "tso", "stuck", "--wait=false")
    obj = kube.wait_tso(ns, "stuck", degraded("DeletionBlocked"), timeout=60)
    message = condition(obj, "Degraded")["message"]
    assert "spec.deletionPolicy: Retain" in message and "tsoracle.io/skip-cleanup" in message
    deadline = time.monotonic() + 90
    while _failures(port, "DeletionBlocked") - before < 6:  # six attempts, 5 s apart
        assert time.monotonic() < deadline, "the deletion stopped retrying"
        time.sleep(1)
    attempts = _failures(port, "DeletionBlocked") - before
    warned = sum(int(e.get("count") or 1) for e in kube.events(ns, "DeletionBlocked"))
    assert 1 <= warned < attempts, (warned, attempts)  # at a backoff, not every attempt
    kube.kubectl("-n", ns, "annotate", "tso", "stuck", "tsoracle.io/skip-cleanup=true")
    _gone(kube, ns, "stuck", 30)
    assert "s_stuck" in _schemas(pg, oracle_ns.url)  # left as it was
    assert [e for e in kube.events(ns, "DeletionSkipped") if "skip-cleanup" in e["message"]]


def test_retain_ends_a_blocked_deletion_and_a_new_resource_adopts_the_schema(kube, oracle_ns):
    ns = oracle_ns.name
    kube.kubectl("-n", ns, "apply", "-f", "-", stdin=oracle("keep", "s_keep", policy="Delete"))
    first = kube.wait_tso(ns, "keep", at_epoch(1))["status"]
    _point_secret_at(kube, ns, oracle_ns.url.replace("tsoracle-test-pw", "wrong-pw"))
    kube.kubectl("-n", ns, "delete", "tso", "keep", "--wait=false")
    kube.wait_tso(ns, "keep", degraded("DeletionBlocked"), timeout=60)
    kube.kubectl("-n", ns, "patch", "tso", "keep", "--type", "merge", "-p",
                 json.dumps({"spec": {"deletionPolicy": "Retain"}}))
    _gone(kube, ns, "keep", 30)
    # The database comes back; the schema still names the deleted resource as its owner.
    _point_secret_at(kube, ns, oracle_ns.url)
    kube.kubectl("-n", ns, "apply", "-f", "-", stdin=oracle("keep", "s_keep"))
    adopted = kube.wait_tso(ns, "keep", lambda o: is_ready(o), timeout=60,
                            what="the orphaned schema adopted")["status"]
    assert adopted["incarnation"] == first["incarnation"]
    assert "adopted schema 's_keep' from TimestampOracle" in oracle_ns.log.read_text()

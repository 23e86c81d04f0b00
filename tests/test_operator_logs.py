"""The operator's log tells what happened, once per event, naming `namespace/name`; a start
next to an API server that is itself starting logs no error. Real API server, real PostgreSQL,
the operator as a process (its stdout and stderr go to a file).

Before: the log said `Handler 'spec_changed/spec' succeeded.` and never named the resource or
the flip; a degraded resource was logged every 5 s; a start with the API server logged
`[ERROR] Request attempt #1/9 failed; will retry: … 429 storage is (re)initializing` and the
like.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tsoracle.operator import logs
from tsoracle.operator.logs import KopfLogs, Story, describe_kopf_retry
from tsoracle_dev.kube import Operator, condition, is_ready

REFRESH = {"statusRefreshSeconds": 1}  # many passes: chances for a repeated line


def oracle(name: str, schema: str, secret: str, **spec: object) -> str:
    return json.dumps({
        "apiVersion": "tsoracle.io/v1alpha1", "kind": "TimestampOracle",
        "metadata": {"name": name},
        "spec": {"backend": {"urlSecretRef": {"name": secret}, "schema": schema},
                 "timelines": ["EpochMilliseconds", "counter:orders"], **REFRESH, **spec}})


def matching(log: Path, pattern: str) -> list[str]:
    """The log's lines that match `pattern` (a regular expression searched in each line)."""
    return [line for line in log.read_text().splitlines() if re.search(pattern, line)]


def passes(op: Operator, result: str) -> float:
    """Reconcile passes with this result so far, from the operator's /metrics."""
    url = f"http://127.0.0.1:{op.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    prefix = f'tsoracle_operator_reconciles_total{{result="{result}"}}'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(prefix))


def wait_passes(op: Operator, result: str, at_least: float, cap: float = 120) -> None:
    deadline = time.monotonic() + cap
    while passes(op, result) < at_least:
        assert time.monotonic() < deadline, f"fewer than {at_least} {result} passes"
        time.sleep(0.2)


def test_the_log_tells_create_fencing_flip_degraded_recovered_deletion(kube, chart, database,
                                                                      tmp_path):
    ns = kube.new_namespace("logs")
    kube.backend_secret(ns, "oracle-db", database)
    log = tmp_path / "operator.log"
    op = Operator(chart.kubeconfig, ns, log).start()
    try:
        kube.kubectl("-n", ns, "apply", "-f", "-",
                     stdin=oracle("orders", "s_orders", "oracle-db"))
        kube.wait_tso(ns, "orders", is_ready, what="Ready")
        kube.kubectl("-n", ns, "patch", "tso", "orders", "--type", "merge", "-p",
                     '{"spec":{"fencing":"Rollout"}}')
        kube.wait_tso(ns, "orders", lambda o: o["status"].get("fencing") == "Rollout",
                      what="fencing Rollout")
        kube.kubectl("-n", ns, "patch", "tso", "orders", "--type", "merge", "-p",
                     '{"spec":{"implementation":"legacy"}}')
        kube.wait_tso(ns, "orders", lambda o: is_ready(o) and o["status"]["epoch"] == 2,
                      what="flip to legacy")
        # A resource whose Secret does not exist yet: degraded, retried every 5 s.
        kube.kubectl("-n", ns, "apply", "-f", "-",
                     stdin=oracle("late", "s_late", "later", deletionPolicy="Delete"))
        kube.wait_tso(ns, "late", lambda o: condition(o, "Degraded").get("reason")
                      == "SecretNotFound", what="Degraded/SecretNotFound")
        wait_passes(op, "degraded", passes(op, "degraded") + 3)  # three retries, one line
        kube.backend_secret(ns, "later", database)
        kube.wait_tso(ns, "late", is_ready, what="recovered")
        op.wait_reconciles(op.reconciles() + 4)  # more passes: nothing repeats
        kube.kubectl("-n", ns, "delete", "tso", "orders", "late", "--timeout=60s")
    finally:
        op.stop()

    text = log.read_text()
    ref = re.escape(ns)
    once = {
        "provisioned": rf"\[INFO +\] {ref}/orders: provisioned schema 's_orders': "
                       r"implementation distributed, epoch 1, timelines created "
                       r"EpochMilliseconds, counter:orders$",
        "fencing": rf"\[INFO +\] {ref}/orders: fencing Always -> Rollout \(epoch 1\)$",
        "flip started": rf"\[INFO +\] {ref}/orders: flip started: distributed -> legacy, "
                        r"epoch 1 \(generation \d+\)$",
        "flip finished": rf"\[INFO +\] {ref}/orders: flip finished: distributed -> legacy, "
                         r"epoch 1 -> 2 in \d+ ms; bootstrap EpochMilliseconds=\d+, "
                         r"counter:orders=\d+$",
        "degraded": rf"\[WARNING +\] {ref}/late: degraded \(SecretNotFound\): "
                    rf"Secret {ref}/later does not exist",
        "recovered": rf"\[INFO +\] {ref}/late: recovered \(was SecretNotFound\)$",
        "late provisioned": rf"\[INFO +\] {ref}/late: provisioned schema 's_late'",
        "retained": rf"\[INFO +\] {ref}/orders: deleted; retained schema 's_orders' at epoch "
                    r"2, ownership released \(deletionPolicy Retain\)$",
        "dropped": rf"\[INFO +\] {ref}/late: deleted; dropped tsoracle's tables in schema "
                   r"'s_late' and the schema \(deletionPolicy Delete, epoch 1\)$",
    }
    for what, pattern in once.items():
        found = matching(log, pattern)
        assert len(found) == 1, (what, found, text[-4000:])
    # Every line about a resource names it; degraded is told once, not on each 5 s retry.
    assert len(matching(log, rf"{ref}/late: (still )?degraded")) == 1
    assert len(matching(log, rf"{ref}/orders: flip")) == 2
    assert "[ERROR" not in text, text
    assert "succeeded." not in text  # kopf's per-handler chatter is gone (DEBUG only)
    host_port = database.split("@", 1)[1].split("/", 1)[0]
    for secret in ("tsoracle-test-pw", host_port, database):
        assert secret not in text, secret


def test_a_start_next_to_a_starting_api_server_logs_no_error(kube, chart, database, tmp_path):
    # The operator starts while kube-apiserver is down and then starting: kopf's requests met
    # `connection refused`, 503 "before all known HTTP paths have been installed" and 429
    # "storage is (re)initializing", each logged at ERROR; and kopf, which resolves the CRD
    # only once at start, could miss it and serve nothing. Now the operator waits for the API
    # server (at INFO, saying why) and the resource is served.
    if kube.plane is None:
        pytest.skip("needs the tests' own control plane (an existing cluster cannot be "
                    "restarted from here)")
    ns = kube.new_namespace("boot")
    kube.backend_secret(ns, "oracle-db", database)
    kube.kubectl("-n", ns, "apply", "-f", "-", stdin=oracle("orders", "s_orders", "oracle-db"))
    log = tmp_path / "operator.log"
    restart = threading.Thread(target=kube.plane.restart_apiserver,
                               kwargs={"down_seconds": 3.0})
    restart.start()  # kills kube-apiserver at once, starts it again 3 s later
    time.sleep(0.5)
    op = Operator(chart.kubeconfig, ns, log).start()
    try:
        restart.join()
        kube.wait_tso(ns, "orders", is_ready, timeout=90, what="Ready after the start")
        op.wait_reconciles(op.reconciles() + 3)
    finally:
        op.stop()
    text = log.read_text()
    assert "[ERROR" not in text, text
    assert "Traceback" not in text, text
    waited = matching(log, r"tsoracle\.operator +\[INFO +\] API server not ready yet \(")
    assert waited, text  # the operator did start before the API server was ready
    assert len(matching(log, r"API server ready after [\d.]+ s$")) == 1, text
    assert len(matching(log, rf"{re.escape(ns)}/orders: provisioned schema 's_orders'")) == 1


# --- The pieces, without a cluster ------------------------------------------------------------

KOPF_429 = ("Request attempt #1/9 failed; will retry: GET https://127.0.0.1:6443/apis/tsoracle.io"
            "/v1alpha1/namespaces/etl/timestamporacles -> APITooManyRequestsError('storage is "
            "(re)initializing', {'kind': 'Status', 'code': 429}, status=429)")


def kopf_record(message: str, name: str = "kopf._cogs.clients.watching",
                level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, None, None)


def test_kopf_retries_of_a_starting_api_server_are_told_as_such(monkeypatch):
    assert describe_kopf_retry(KOPF_429) == (
        "429 storage is (re)initializing",
        "GET /apis/tsoracle.io/v1alpha1/namespaces/etl/timestamporacles")
    refused = ("Request attempt #2/9 failed; will retry: GET https://127.0.0.1:6443/api -> "
               "ClientConnectorError(ConnectionKey(host='127.0.0.1', port=6443), "
               "ConnectionRefusedError(111, \"Connect call failed ('127.0.0.1', 6443)\"))")
    assert describe_kopf_retry(refused) == ("connection refused", "GET /api")
    forbidden = ("Request attempt #1/9 failed; will retry: GET https://h/api -> "
                 "APIForbiddenError('forbidden: User \"u\" cannot get path \"/api\"', {}, "
                 "status=403)")
    assert describe_kopf_retry(forbidden) is None  # after start-up: a real error
    assert describe_kopf_retry(forbidden, forbidden_too=True)[0].startswith("403 forbidden")
    for real in ("Request attempt #9/9 failed; escalating: GET https://h/api -> "
                 "ClientConnectorError(x)",
                 "Request attempt #1/9 failed; will retry: GET https://h/api -> "
                 "APIServerError('boom', {}, status=500)",
                 "Handler 'deleted' failed with an exception. Will retry."):
        assert describe_kopf_retry(real) is None

    path = "GET /apis/tsoracle.io/v1alpha1/namespaces/etl/timestamporacles"
    monkeypatch.setattr(logs, "starting_up", lambda: True)
    record = kopf_record(KOPF_429)
    assert KopfLogs(verbose=False).filter(record) and record.levelno == logging.INFO
    assert record.getMessage() == ("API server not ready yet (429 storage is (re)initializing); "
                                   f"retrying {path}")
    monkeypatch.setattr(logs, "starting_up", lambda: False)  # later: an outage
    record = kopf_record(KOPF_429)
    assert KopfLogs(verbose=False).filter(record) and record.levelno == logging.WARNING
    assert record.getMessage() == ("API server unavailable (429 storage is (re)initializing); "
                                   f"retrying {path}")
    real = kopf_record("Request attempt #1/9 failed; will retry: GET https://h/api -> "
                       "APIServerError('boom', {}, status=500)")
    assert KopfLogs(verbose=False).filter(real) and real.levelno == logging.ERROR
    temporary = kopf_record("Handler 'deleted' failed temporarily: release failed; retrying",
                            name="kopf.objects")
    assert not KopfLogs(verbose=False).filter(temporary)  # our handler logged its own line


def test_degraded_is_told_once_per_reason_and_recovery_once(caplog):
    log = logging.getLogger("tsoracle.test.story")
    story = Story("etl/orders")
    with caplog.at_level(logging.DEBUG, logger=log.name):
        for reason in ("SecretNotFound", "SecretNotFound", "BadURL", "BadURL", "", ""):
            story.degraded_now(log, reason, f"because {reason}", published="")
    told = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert told == ["etl/orders: degraded (SecretNotFound): because SecretNotFound",
                    "etl/orders: degraded (BadURL): because BadURL",
                    "etl/orders: recovered (was BadURL)"]
    caplog.clear()
    # A restarted operator: tells the state it finds, and a recovery from a published one.
    with caplog.at_level(logging.INFO, logger=log.name):
        Story("etl/a").degraded_now(log, "SecretNotFound", "m", published="SecretNotFound")
        Story("etl/b").degraded_now(log, "", "", published="BackendUnavailable")
        Story("etl/c").degraded_now(log, "", "", published="")
    assert [r.getMessage() for r in caplog.records] == [
        "etl/a: degraded (SecretNotFound): m", "etl/b: recovered (was BackendUnavailable)"]

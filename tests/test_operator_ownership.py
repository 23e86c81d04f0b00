"""Operator ownership and coordination on the real API server, under the chart's RBAC.

Before the fixes (issue 11): an edited Secret re-seeded the oracle at epoch 1 in another
database; two resources on one schema flipped it back and forth and a Delete of one dropped the
other's state; a second or paused operator reverted flips and posted duplicate Events.
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import time
import uuid

import pytest

import tsoracle
from tsoracle.fencing import PlannedBy, StalePlan, read_deployment
from tsoracle.oracle.connect import admin_backend
from tsoracle.oracle.flip import flip_backend
from tsoracle_dev.kube import Operator, condition, is_ready

COUNTER = "counter:orders"


def oracle(name: str, schema: str, *, implementation: str = "distributed",
           policy: str = "Retain", secret: str = "oracle-db") -> str:
    return json.dumps({
        "apiVersion": "tsoracle.io/v1alpha1", "kind": "TimestampOracle",
        "metadata": {"name": name},
        "spec": {"backend": {"urlSecretRef": {"name": secret}, "schema": schema},
                 "implementation": implementation, "timelines": ["EpochMilliseconds", COUNTER],
                 "deletionPolicy": policy, "statusRefreshSeconds": 1}})


def degraded(reason: str):
    return lambda o: condition(o, "Degraded").get("reason") == reason


def flip(kube, ns: str, name: str, to: str) -> None:
    kube.kubectl("-n", ns, "patch", "tso", name, "--type", "merge", "-p",
                 json.dumps({"spec": {"implementation": to}}))


def at_epoch(epoch: int):
    return lambda o: is_ready(o) and (o.get("status") or {}).get("epoch") == epoch


def wait_events(kube, ns: str, reason: str, count: int, settle: float = 3.0) -> list[dict]:
    """Events are posted in the background: wait for `count`, then a little for extras."""
    deadline = time.monotonic() + 60
    while len(kube.events(ns, reason)) < count and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(settle)
    return kube.events(ns, reason)


@pytest.fixture
def new_database(pg):
    def make() -> str:
        name = "db_" + uuid.uuid4().hex[:10]
        pg.sql(f"CREATE DATABASE {name} OWNER tsoracle", "postgres")
        return pg.url(database=name)
    return make


def test_an_edited_secret_never_reseeds_elsewhere(kube, oracle_ns, new_database):
    ns = oracle_ns.name
    kube.kubectl("-n", ns, "apply", "-f", "-", stdin=oracle("orders", "s_orders"))
    kube.wait_tso(ns, "orders", at_epoch(1))
    flip(kube, ns, "orders", "legacy")
    before = kube.wait_tso(ns, "orders", at_epoch(2))["status"]
    empty = new_database()
    patch = {"data": {"url": base64.b64encode(empty.encode()).decode()}}
    kube.kubectl("-n", ns, "patch", "secret", "oracle-db", "-p", json.dumps(patch))
    obj = kube.wait_tso(ns, "orders", degraded("BackendChanged"), what="BackendChanged")
    assert obj["status"]["epoch"] == 2 and obj["status"]["incarnation"] == before["incarnation"]
    assert condition(obj, "Ready")["status"] == "False"
    assert "delete this TimestampOracle and create it again" in condition(obj, "Degraded")[
        "message"]
    assert wait_events(kube, ns, "BackendChanged", 1)[0]["type"] == "Warning"
    with pytest.raises(tsoracle.NotInitialized):  # nothing was provisioned in the new database
        asyncio.run(tsoracle.status(empty + "?schema=s_orders"))
    # Pointing the Secret back recovers, at the same epoch.
    patch = {"data": {"url": base64.b64encode(oracle_ns.url.encode()).decode()}}
    kube.kubectl("-n", ns, "patch", "secret", "oracle-db", "-p", json.dumps(patch))
    kube.wait_tso(ns, "orders", at_epoch(2), what="recovery")


def test_a_schema_in_the_secret_url_must_match_the_spec(kube, oracle_ns):
    ns = oracle_ns.name
    kube.backend_secret(ns, "elsewhere", oracle_ns.url + "?schema=elsewhere")
    kube.kubectl("-n", ns, "apply", "-f", "-",
                 stdin=oracle("pinned", "s_pinned", secret="elsewhere"))
    obj = kube.wait_tso(ns, "pinned", degraded("BadURL"))
    message = condition(obj, "Degraded")["message"]
    assert "spec.backend.schema" in message and "s_pinned" in message


def test_two_resources_never_share_a_schema(kube, oracle_ns):
    ns = oracle_ns.name
    kube.kubectl("-n", ns, "apply", "-f", "-", stdin=oracle("alpha", "s_shared"))
    kube.wait_tso(ns, "alpha", at_epoch(1))
    url = oracle_ns.url + "?schema=s_shared"

    async def handed_out() -> list[int]:
        async with tsoracle.connect(url, timeline=COUNTER) as o:
            return [(await o.write_ts()).timestamp for _ in range(3)]

    first = asyncio.run(handed_out())
    kube.kubectl("-n", ns, "apply", "-f", "-",
                 stdin=oracle("beta", "s_shared", implementation="legacy", policy="Delete"))
    obj = kube.wait_tso(ns, "beta", degraded("SchemaInUse"))
    assert f"{ns}/alpha" in condition(obj, "Degraded")["message"]
    assert wait_events(kube, ns, "SchemaInUse", 1)[0]["type"] == "Warning"
    time.sleep(3)  # several passes of both (statusRefreshSeconds: 1)
    status = asyncio.run(tsoracle.status(url))
    assert (status.deployment.epoch, status.deployment.implementation) == (1, "distributed")
    assert kube.events(ns, "Flipped") == []
    kube.kubectl("-n", ns, "delete", "tso", "beta", "--timeout=60s")
    skipped = wait_events(kube, ns, "DeletionSkipped", 1, settle=0)
    assert skipped and skipped[0]["type"] == "Warning"
    second = asyncio.run(handed_out())  # alpha's state survived beta's Delete
    assert min(second) > max(first)
    assert is_ready(kube.tso(ns, "alpha"))


def test_a_recreated_resource_adopts_retained_state(kube, oracle_ns):
    ns = oracle_ns.name
    kube.kubectl("-n", ns, "apply", "-f", "-", stdin=oracle("keep", "s_keep"))
    kube.wait_tso(ns, "keep", at_epoch(1))
    flip(kube, ns, "keep", "legacy")
    before = kube.wait_tso(ns, "keep", at_epoch(2))["status"]
    kube.kubectl("-n", ns, "delete", "tso", "keep", "--timeout=60s")
    kube.kubectl("-n", ns, "apply", "-f", "-",
                 stdin=oracle("keep", "s_keep", implementation="legacy"))
    after = kube.wait_tso(ns, "keep", at_epoch(2), what="adopted at epoch 2")["status"]
    assert after["incarnation"] == before["incarnation"]


def test_a_stale_generation_never_undoes_a_flip(pg):
    url = f"{pg.url()}?schema=gen_{uuid.uuid4().hex[:8]}"

    async def run() -> None:
        await tsoracle.init(url, timelines=[COUNTER])
        async with admin_backend(url) as backend:
            forward = await flip_backend(backend, "legacy", by=PlannedBy("", 5))
            assert forward.changed and forward.epoch == 2
            with pytest.raises(StalePlan, match="already applied generation 5"):
                # a paused operator
                await flip_backend(backend, "distributed", by=PlannedBy("", 4))
            assert (await read_deployment(backend)).epoch == 2
            again = await flip_backend(backend, "distributed", by=PlannedBy("", 6))
            assert again.changed and again.epoch == 3
            with pytest.raises(StalePlan, match="belongs to nobody"):  # a deleted resource's
                await flip_backend(backend, "legacy", by=PlannedBy("ns/gone/uid-9", 7))

    asyncio.run(run())


def _flipped_messages(kube, ns: str) -> list[str]:
    return [e["message"] for e in kube.events(ns, "Flipped")]


def test_replicas_coordinate_through_the_lease(kube, chart, database, tmp_path):
    # Two operators (a scale-up, or an old pod during an upgrade): one acts, one stands by; a
    # flip costs one epoch and posts one Event; the standby takes over when the holder dies.
    ns = kube.new_namespace("lease")
    kube.backend_secret(ns, "oracle-db", database)
    lease = (chart.namespace, "tsoracle")  # the chart's Lease: its RBAC allows only that name
    ops = [Operator(chart.kubeconfig, ns, tmp_path / f"op{i}.log", lease=lease).start()
           for i in range(2)]
    try:
        kube.kubectl("-n", ns, "apply", "-f", "-", stdin=oracle("orders", "s_orders"))
        kube.wait_tso(ns, "orders", at_epoch(1))
        flip(kube, ns, "orders", "legacy")
        kube.wait_tso(ns, "orders", at_epoch(2))
        messages = [m for m in wait_events(kube, ns, "Flipped", 1)]
        assert len(messages) == 1 and "distributed -> legacy, epoch 2" in messages[0]["message"]
        counts = [op.reconciles() for op in ops]
        assert sorted(c > 0 for c in counts) == [False, True], counts
        holder = ops[counts.index(max(counts))]
        standby = ops[1 - ops.index(holder)]
        holder.proc.send_signal(signal.SIGKILL)  # no release: the lease must expire
        holder.proc.wait()
        standby.wait_reconciles(1, cap=90)
        flip(kube, ns, "orders", "distributed")
        kube.wait_tso(ns, "orders", at_epoch(3), timeout=90)
        messages = _flipped_messages(kube, ns)
        assert len(messages) == 2 and any("legacy -> distributed, epoch 3" in m
                                          for m in messages), messages
    finally:
        for op in ops:
            op.stop()


def test_a_paused_operator_does_not_revert_a_flip(kube, chart, database, tmp_path):
    ns = kube.new_namespace("pause")
    kube.backend_secret(ns, "oracle-db", database)
    lease = (chart.namespace, "tsoracle")
    first = Operator(chart.kubeconfig, ns, tmp_path / "op1.log", lease=lease).start()
    second = None
    try:
        kube.kubectl("-n", ns, "apply", "-f", "-", stdin=oracle("orders", "s_orders"))
        kube.wait_tso(ns, "orders", at_epoch(1))
        first.proc.send_signal(signal.SIGSTOP)
        second = Operator(chart.kubeconfig, ns, tmp_path / "op2.log", lease=lease).start()
        flip(kube, ns, "orders", "legacy")
        kube.wait_tso(ns, "orders", at_epoch(2), timeout=120, what="flip by the second")
        first.proc.send_signal(signal.SIGCONT)  # it wakes holding an old spec and lease
        first_before = first.reconciles()
        time.sleep(8)  # several refreshes of both
        url = database + "?schema=s_orders"
        dep = asyncio.run(tsoracle.status(url)).deployment
        assert (dep.epoch, dep.implementation) == (2, "legacy")
        assert len(_flipped_messages(kube, ns)) == 1
        # A pass in flight at SIGSTOP may finish; after that it waits for the lease.
        assert first.reconciles() <= first_before + 1
    finally:
        first.proc.send_signal(signal.SIGCONT)
        first.stop()
        if second is not None:
            second.stop()


def test_a_forged_status_posts_no_flip_event(kube, oracle_ns):
    ns = oracle_ns.name
    kube.kubectl("-n", ns, "apply", "-f", "-", stdin=oracle("orders", "s_orders"))
    kube.wait_tso(ns, "orders", at_epoch(1))
    kube.kubectl("-n", ns, "patch", "tso", "orders", "--subresource=status", "--type", "merge",
                 "-p", '{"status":{"activeImplementation":"legacy"}}')
    kube.wait_tso(ns, "orders", lambda o: o["status"]["activeImplementation"] == "distributed",
                  what="status corrected")
    oracle_ns.operator.wait_reconciles(oracle_ns.operator.reconciles() + 2)
    assert kube.events(ns, "Flipped") == []


def test_reconciles_resume_promptly_after_an_api_server_restart(kube, oracle_ns):
    # Before the fix a failed API call escaped the reconcile loop, and kopf restarted the
    # object's daemon only after its backoff (60 s): flips requested right after a control-plane
    # restart waited a minute. Now the loop retries after RETRY_SECONDS.
    if kube.plane is None:
        pytest.skip("needs the tests' own control plane (an existing cluster cannot be "
                    "restarted from here)")
    ns = oracle_ns.name
    kube.kubectl("-n", ns, "apply", "-f", "-", stdin=oracle("orders", "s_orders"))
    kube.wait_tso(ns, "orders", at_epoch(1))
    kube.plane.restart_apiserver(down_seconds=4.0)  # passes fail meanwhile (refresh: 1 s)
    back = time.monotonic()
    flip(kube, ns, "orders", "legacy")
    kube.wait_tso(ns, "orders", at_epoch(2), timeout=120, what="flip after the restart")
    delay = time.monotonic() - back
    print(f"flip published {delay:.1f} s after the API server came back")
    log = oracle_ns.log.read_text()
    assert "Kubernetes API call failed" in log  # the loop saw the outage and retried
    assert "daemon" not in log.lower() or "failed with an exception" not in log, log[-3000:]


def test_no_server_address_reaches_status_events_or_logs(kube, oracle_ns):
    # Before the fix a `localhost` URL's resolved address and port reached the Degraded
    # message (libpq names the address it tried, which the URL never spelled out).
    ns = oracle_ns.name
    kube.backend_secret(ns, "local", "postgresql://tsoracle:pw-Zq81x@localhost:1/x")
    kube.kubectl("-n", ns, "apply", "-f", "-", stdin=oracle("local", "s_local", secret="local"))
    obj = kube.wait_tso(ns, "local", degraded("BackendUnavailable"), timeout=90)
    oracle_ns.operator.wait_reconciles(0)  # metrics up; the log has the pass's warning by now
    text = json.dumps(obj["status"]) + json.dumps(kube.events(ns)) + oracle_ns.log.read_text()
    for leak in ("127.0.0.1", "::1", "localhost", "port 1 ", "port: '1'", "pw-Zq81x"):
        assert leak not in text, leak


def test_a_blocked_deletion_is_visible(kube, oracle_ns, pg):
    ns = oracle_ns.name
    kube.kubectl("-n", ns, "apply", "-f", "-",
                 stdin=oracle("doomed", "s_doomed", policy="Delete"))
    kube.wait_tso(ns, "doomed", at_epoch(1))
    unreachable = oracle_ns.url.rsplit(":", 1)[0] + ":1/x"
    patch = {"data": {"url": base64.b64encode(unreachable.encode()).decode()}}
    kube.kubectl("-n", ns, "patch", "secret", "oracle-db", "-p", json.dumps(patch))
    kube.kubectl("-n", ns, "delete", "tso", "doomed", "--wait=false")
    obj = kube.wait_tso(ns, "doomed", degraded("DeletionBlocked"), timeout=120)
    assert condition(obj, "Ready")["status"] == "False"
    blocked = wait_events(kube, ns, "DeletionBlocked", 1, settle=0)
    assert blocked[0]["type"] == "Warning" and "127.0.0.1" not in blocked[0]["message"]
    patch = {"data": {"url": base64.b64encode(oracle_ns.url.encode()).decode()}}
    kube.kubectl("-n", ns, "patch", "secret", "oracle-db", "-p", json.dumps(patch))
    kube.kubectl("-n", ns, "wait", "--for=delete", "tso/doomed", "--timeout=120s")
    dbname = oracle_ns.url.rsplit("/", 1)[1]
    schemas = {r[0] for r in pg.sql("SELECT schema_name FROM information_schema.schemata",
                                    dbname)}
    assert "s_doomed" not in schemas

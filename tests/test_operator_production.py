"""The operator as production meets it, on the real API server: connections that go silent
without closing (the Lease's calls, kopf's watch streams) and restarts in the middle of a
deletion. Each bound below is computed from the configuration under test plus SLACK_S for
scheduling on a busy machine; none is a speed goal.

Before the fixes: a Lease renewal on a silenced connection never returned (no request timeout),
so a one-replica operator stood by until TCP gave up (about 15 minutes, forever behind a proxy
that keeps the connection); a spec change made while the watch was silent waited for kopf's
hard-wired timeouts (90 s measured), and the pass it woke then waited for good on the
operator's own silenced connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tsoracle.errors import ConfigError
from tsoracle.operator.kube import REQUEST_TIMEOUT_S, single_try_client
from tsoracle.operator.lease import LeaderLease
from tsoracle.operator.settings import (
    WATCH_CLIENT_TIMEOUT_ENV,
    WATCH_SERVER_TIMEOUT_ENV,
    WatchTimeouts,
    from_environment,
)
from tsoracle_dev.kube import Operator, is_ready
from tsoracle_dev.kubetools import tools_dir
from tsoracle_dev.silentproxy import SilentProxy, kubeconfig_via, target_of

SLACK_S = 5.0  # API calls, a pass, polling and thread hand-offs on a loaded 2-core machine
LEASE_DURATION_S, LEASE_RENEW_S = 6.0, 2.0  # a short Lease: the test's bounds follow from it


async def _until(predicate, cap: float) -> float:
    """Seconds until `predicate()` holds; fails after `cap` (only a hang reaches it)."""
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < cap, "not within the cap"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


def _timed_out(caplog: pytest.LogCaptureFixture, name: str) -> list[float]:
    """When the Lease told that a call of `name` timed out (wall clock, as log records)."""
    return [r.created for r in caplog.records if r.name == "tsoracle.operator.lease"
            and f"/{name}" in r.getMessage() and "(timed out)" in r.getMessage()]


def test_a_lease_on_a_silent_connection_steps_down_and_recovers_within_its_window(
        kube, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tsoracle.operator.lease")
    ns = kube.new_namespace("lease")
    with SilentProxy(*target_of(kube.kubeconfig)) as proxy:
        cfg = kubeconfig_via(kube.kubeconfig, tmp_path / "kubeconfig", proxy.port)
        lease = LeaderLease(ns, "silent", duration_s=LEASE_DURATION_S,
                            renew_every_s=LEASE_RENEW_S, api=single_try_client(str(cfg)))
        window = lease.window_s  # a renewal holds it this long; an attempt ends within it

        async def scenario() -> None:
            lease.start()
            try:
                await asyncio.wait_for(lease.wait_held(), 30)
                await asyncio.sleep(LEASE_RENEW_S * 2)  # renewals over a pooled connection
                assert await asyncio.to_thread(proxy.silence) >= 1
                silenced, silenced_at = time.time(), time.monotonic()
                # The attempt under way or the next (within renew_every) gets no answer: the
                # holder stops acting by the end of its last renewal's window, which began
                # before the silence. held() is judged by the clock against that deadline, so
                # the deadline is what is checked (how soon this poll sees it is the machine's).
                deadlines: list[float] = []
                stepped_down = await _until(
                    lambda: deadlines.append(lease._held_until) or not lease.held(),
                    window + SLACK_S)
                assert max(deadlines) <= silenced_at + window, (deadlines, silenced_at)
                # ...and that attempt ends by its own window, then the next one, on a new
                # connection (forwarded again), takes the Lease back.
                back = await _until(lease.held, 2 * LEASE_RENEW_S + window + SLACK_S)
                told = _timed_out(caplog, "silent")
                assert told, [r.getMessage() for r in caplog.records]
                assert told[0] - silenced <= LEASE_RENEW_S + window + SLACK_S
                print(f"stepped down {stepped_down:.1f} s after the silence, held again "
                      f"{stepped_down + back:.1f} s after it (window {window:g} s)")
            finally:
                await lease.stop()
                # Closing the proxy ends a call still waiting on it (as before the fix),
                # so a failure here is reported rather than left hanging.
                await asyncio.to_thread(proxy.stop)

        asyncio.run(scenario())


def test_a_lease_against_an_endpoint_that_never_answers_gives_up_each_attempt_in_time(
        kube, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tsoracle.operator.lease")
    ns = kube.new_namespace("lease")
    with SilentProxy(*target_of(kube.kubeconfig)) as proxy:
        cfg = kubeconfig_via(kube.kubeconfig, tmp_path / "kubeconfig", proxy.port)
        proxy.silence(new_connections=True)  # TCP accepted, the TLS handshake never answered
        lease = LeaderLease(ns, "mute", duration_s=LEASE_DURATION_S,
                            renew_every_s=LEASE_RENEW_S, api=single_try_client(str(cfg)))
        window = lease.window_s

        async def scenario() -> None:
            lease.start()
            try:
                # The first attempt ends within its window rather than hanging for good.
                took = await _until(lambda: bool(_timed_out(caplog, "mute")),
                                    2 * (window + LEASE_RENEW_S) + SLACK_S)
                assert took <= window + SLACK_S, took
                assert not lease.held()
                await asyncio.to_thread(proxy.resume)
                back = await _until(lease.held, LEASE_RENEW_S + window + SLACK_S)
                print(f"first attempt gave up after {took:.1f} s (window {window:g} s); held "
                      f"{back:.1f} s after the endpoint answered again")
            finally:
                await lease.stop()
                # Closing the proxy ends a call still waiting on it (as before the fix),
                # so a failure here is reported rather than left hanging.
                await asyncio.to_thread(proxy.stop)

        asyncio.run(scenario())


def oracle(name: str, *, implementation: str = "distributed", policy: str = "Retain",
           refresh_s: int = 3600) -> str:
    """A TimestampOracle in schema s_<name>. A long refresh by default: a periodic pass
    reads the body kopf last saw, so it cannot stand in for a watch that went silent."""
    return json.dumps({
        "apiVersion": "tsoracle.io/v1alpha1", "kind": "TimestampOracle",
        "metadata": {"name": name},
        "spec": {"backend": {"urlSecretRef": {"name": "oracle-db"}, "schema": f"s_{name}"},
                 "implementation": implementation, "deletionPolicy": policy,
                 "timelines": ["EpochMilliseconds", "counter:orders"],
                 "statusRefreshSeconds": refresh_s}})


def at_epoch(epoch: int):
    return lambda o: is_ready(o) and (o.get("status") or {}).get("epoch") == epoch


def test_watch_timeouts_come_from_the_environment_and_are_checked() -> None:
    assert from_environment({}).watch == WatchTimeouts(server_s=60, client_s=90, connect_s=30)
    got = from_environment({WATCH_SERVER_TIMEOUT_ENV: "10", WATCH_CLIENT_TIMEOUT_ENV: "15.5"})
    assert (got.watch.server_s, got.watch.client_s) == (10, 15.5)
    # The API server refuses timeoutSeconds=10.0 (400 Bad Request): whole seconds only.
    for bad in ({WATCH_SERVER_TIMEOUT_ENV: "10.5"}, {WATCH_CLIENT_TIMEOUT_ENV: "soon"},
                {WATCH_CLIENT_TIMEOUT_ENV: "0"}, {WATCH_CLIENT_TIMEOUT_ENV: "inf"},
                {WATCH_SERVER_TIMEOUT_ENV: "100"}):  # not below the client's 90
        with pytest.raises(ConfigError) as err:
            from_environment(bad)
        assert next(iter(bad)) in str(err.value)


@pytest.mark.kube  # helm, from the Kubernetes tools
def test_the_chart_hands_its_watch_timeouts_to_the_operator(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    values = tmp_path / "values.yaml"
    values.write_text("watch: {serverTimeoutSeconds: 120, clientTimeoutSeconds: 150.5}\n")
    rendered = subprocess.run(
        [str(tools_dir() / "helm"), "template", "t", str(root / "charts" / "tsoracle"), "-f",
         str(values)], capture_output=True, text=True, check=True, timeout=120).stdout
    deployment = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment")
    env = {e["name"]: e["value"] for e in
           deployment["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}
    assert from_environment(env).watch == WatchTimeouts(server_s=120, client_s=150.5,
                                                        connect_s=30)


WATCH_SERVER_S, WATCH_CLIENT_S = 10, 15  # the operator under test's watch timeouts


def test_a_silent_watch_stream_is_replaced_and_the_change_reconciled(kube, chart, database,
                                                                     tmp_path: Path) -> None:
    """The API server's connections go silent (no close); new ones are answered. A spec change
    made meanwhile is reconciled within the stated bound:
    - the silent stream ends at most one client timeout after the change (it began before);
    - kopf's next watch request may reuse an idle pooled connection, silenced too: one more
      client timeout (aiohttp reuses a connection idle for up to 15 s, no longer than the
      client timeout here, so the request after that one gets a new connection);
    - the pass's first call may go out on the operator's own pooled connection, silenced too:
      one read timeout (REQUEST_TIMEOUT_S) before urllib3 retries it on a new one;
    - plus SLACK_S.

    Before: kopf's hard-wired timeouts (90 s client; kopf's own 70 s inactivity limit ends a
    stream earlier), and before that the pass's first call waited for good."""
    ns = kube.new_namespace("silent")
    kube.backend_secret(ns, "oracle-db", database)
    with SilentProxy(*target_of(chart.kubeconfig)) as proxy:
        cfg = kubeconfig_via(chart.kubeconfig, tmp_path / "kubeconfig", proxy.port)
        op = Operator(cfg, ns, tmp_path / "operator.log", env={
            WATCH_SERVER_TIMEOUT_ENV: str(WATCH_SERVER_S),
            WATCH_CLIENT_TIMEOUT_ENV: str(WATCH_CLIENT_S)}).start()
        try:
            kube.kubectl("-n", ns, "apply", "-f", "-", stdin=oracle("orders"))
            kube.wait_tso(ns, "orders", at_epoch(1), timeout=120)
            op.wait_reconciles(1)
            assert proxy.silence() >= 1  # kopf's watch stream among them
            changed = time.monotonic()
            kube.kubectl("-n", ns, "patch", "tso", "orders", "--type", "merge", "-p",
                         json.dumps({"spec": {"implementation": "legacy"}}))
            bound = 2 * WATCH_CLIENT_S + REQUEST_TIMEOUT_S[1] + SLACK_S
            obj = kube.wait_tso(ns, "orders", at_epoch(2), timeout=bound + 60,
                                what="the flip after the watch went silent")
            took = time.monotonic() - changed
            print(f"reconciled {took:.1f} s after the change (bound {bound:g} s)")
            assert took <= bound, (took, op.log.read_text()[-3000:])
            assert obj["status"]["activeImplementation"] == "legacy"
        finally:
            op.stop()


@pytest.mark.parametrize(("policy", "point"), [
    ("Delete", "before"),
    # Found by this test (it failed before the fix): each DROP is a statement of its own and
    # `deployment` went second, so the successor found no deployment row, logged "holds no
    # tsoracle deployment, nothing to drop" and left the schema. Now `deployment` goes last
    # and a deletion that finds none still finishes the drop.
    ("Delete", "mid"),
    ("Delete", "after"),
    ("Retain", "after"),
])
def test_an_operator_killed_mid_deletion_is_finished_by_its_successor(
        kube, chart, database, pg, tmp_path: Path, policy: str, point: str) -> None:
    """SIGKILL while the finalizer's clean-up is under way (tools/tsoracle_dev/
    stalled_deletion.py: before the drop or release, right after `DROP TABLE deployment`, or
    after it committed); the next operator finishes it: the resource is gone, no finalizer
    left, and the schema dropped (Delete) or kept and released for adoption (Retain)."""
    ns = kube.new_namespace("del")
    kube.backend_secret(ns, "oracle-db", database)
    name, schema = "doomed", "s_doomed"
    dbname = database.rsplit("/", 1)[1]
    marker = tmp_path / "stalled"
    doomed = Operator(chart.kubeconfig, ns, tmp_path / "op1.log",
                      module="tsoracle_dev.stalled_deletion",
                      env={"TSORACLE_DEV_STALL_AT": point,
                           "TSORACLE_DEV_STALL_FILE": str(marker)}).start()
    try:
        kube.kubectl("-n", ns, "apply", "-f", "-", stdin=oracle(name, policy=policy))
        kube.wait_tso(ns, name, at_epoch(1), timeout=120)
        kube.kubectl("-n", ns, "delete", "tso", name, "--wait=false")
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert time.monotonic() < deadline, doomed.log.read_text()[-3000:]
            assert doomed.proc is not None and doomed.proc.poll() is None
            time.sleep(0.1)
        assert marker.read_text() == point
        assert doomed.proc is not None
        doomed.proc.kill()  # SIGKILL: no clean-up, no lease release, nothing flushed
        doomed.proc.wait()
    finally:
        doomed.stop()
    obj = kube.tso(ns, name)  # still there, held by the finalizer
    assert obj["metadata"].get("deletionTimestamp")
    assert "tsoracle.io/finalizer" in obj["metadata"]["finalizers"]
    healthy = Operator(chart.kubeconfig, ns, tmp_path / "op2.log").start()
    try:
        kube.kubectl("-n", ns, "wait", "--for=delete", f"tso/{name}", "--timeout=120s")
    finally:
        healthy.stop()
    schemas = {r[0] for r in pg.sql("SELECT schema_name FROM information_schema.schemata",
                                    dbname)}
    if policy == "Delete":
        assert schema not in schemas, pg.sql(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = "
            f"'{schema}'", dbname)
    else:
        assert pg.sql(f"SELECT epoch, owner FROM {schema}.deployment", dbname) == [(1, "")]
    assert kube.events(ns, "DeletionBlocked") == [] and kube.events(ns, "DeletionSkipped") == []

"""The operator as production meets it, on the real API server: connections that go silent
without closing (the Lease's calls, kopf's watch streams) and restarts in the middle of a
deletion. Each bound below is computed from the configuration under test plus SLACK_S for
scheduling on a busy machine; none is a speed goal.

Before the fixes: a Lease renewal on a silenced connection never returned (no request timeout),
so a one-replica operator stood by until TCP gave up (about 15 minutes, forever behind a proxy
that keeps the connection).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from tsoracle.operator.kube import single_try_client
from tsoracle.operator.lease import LeaderLease
from tsoracle_dev.silentproxy import SilentProxy, kubeconfig_via, target_of

SLACK_S = 3.0  # API calls and thread hand-offs on a loaded 2-core machine
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
                silenced = time.time()
                # The attempt under way or the next (within renew_every) gets no answer: the
                # holder stops acting by the end of its last renewal's window...
                stepped_down = await _until(lambda: not lease.held(), window + SLACK_S)
                assert stepped_down <= window + 0.5  # held() is judged by the clock alone
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

"""Issue 34's operator corners: owners on every guard, the restore margin measured from 0, the
rollout window timed by the database's own flip record. Real SQLite and PostgreSQL backends;
the decisions themselves are pure (tests/test_operator_model.py)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import signal
import time

import pytest

import tsoracle
from tsoracle.fencing import (
    FlipClock,
    PlannedBy,
    read_deployment,
    read_flip_clock,
    start_flip_clock,
)
from tsoracle.operator import execute
from tsoracle.operator.model import HighWater, Observation, plan, rewind_targets
from tsoracle.operator.ownership import Owner
from tsoracle.oracle.connect import admin_backend
from tsoracle.oracle.provision import release
from tsoracle.resource import parse_spec
from tsoracle_dev.kube import Operator, is_ready

OLD = Owner("ns", "orders", "uid-old")
NEW = Owner("ns", "orders", "uid-new")
REF = "ns/orders"
NOW = dt.datetime(2026, 11, 27, 12, 0, 0, tzinfo=dt.UTC)


def spec(implementation: str, fencing: str = "Always", window: int = 30) -> object:
    return parse_spec({"backend": {"urlSecretRef": {"name": "db"}},
                       "implementation": implementation, "fencing": fencing,
                       "rolloutWindowSeconds": window})



async def _pass(backend, owner: Owner, implementation: str, generation: int,
                status: dict, fencing: str = "Always") -> object:
    dep = await read_deployment(backend)
    return plan(Observation(spec(implementation, fencing), dep, status, generation, NOW))


async def _run(backend, todo) -> execute.Pass:  # type: ignore[no-untyped-def]
    dep = await read_deployment(backend)
    return await execute.run(todo, execute.Pass(backend, {}, REF, dep))


@pytest.mark.parametrize("backend_kind", ["sqlite", pytest.param("pg", marks=pytest.mark.pg)])
def test_a_paused_pass_of_a_deleted_resource_changes_nothing_after_adoption(
        backend_kind, request, operator_events):
    """Defect 1: the old resource's generation-7 pass plans a flip to legacy and pauses; the
    resource is deleted (Retain) and re-created; the new one adopts at generation 1. The old
    pass resumes: it must change nothing, and the new owner is not stuck."""
    url = request.getfixturevalue("sqlite_url" if backend_kind == "sqlite" else "pg_url")

    async def go() -> None:
        async with admin_backend(url, create=True) as backend:
            await execute.hold(backend, spec("distributed"), OLD, {}, REF)
            await _run(backend, await _pass(backend, OLD, "distributed", 6, {}))
            status = {"epoch": 1, "activeImplementation": "distributed"}
            paused = await _pass(backend, OLD, "legacy", 7, status)
            await release(backend, OLD.tag)  # deleted, deletionPolicy Retain
            await execute.hold(backend, spec("distributed"), NEW, {}, REF)  # adopted
            await _run(backend, await _pass(backend, NEW, "distributed", 1, {}))
            resumed = await _run(backend, paused)
            dep = await read_deployment(backend)
            assert (dep.implementation, dep.epoch, dep.owner) == ("distributed", 1, NEW.tag)
            assert resumed.stale and not resumed.flipped
            # The new owner's next generation acts at once.
            done = await _run(backend, await _pass(backend, NEW, "legacy", 2, status))
            assert done.flipped and not done.stale

    asyncio.run(go())
    assert [r for r, _ in operator_events] == ["Flipped"]


def test_a_counters_pace_is_measured_from_zero():
    """Defect 4: 0 -> 1,000,000 in 10 s is a pace of 100,000/s, and a restore caught at the
    next pass is moved above what writers could have reached since."""
    mark = HighWater().after({"counter:c": 0}, NOW)
    mark = mark.after({"counter:c": 1_000_000}, NOW + dt.timedelta(seconds=10))
    assert mark.peaks == {"counter:c": 100_000.0}
    later = NOW + dt.timedelta(seconds=19)
    target = rewind_targets(mark, {"counter:c": 0}, 1, 1, 0, later)["counter:c"]
    assert target >= 1_900_000


def test_a_resource_adopting_mid_rollout_keeps_the_window_open(sqlite_url, operator_events):
    """Defect 5: a flip opened a rollout window a moment ago; a resource that adopts the
    schema (empty status) must not end the window at once."""

    async def go() -> None:
        async with admin_backend(sqlite_url, create=True) as backend:
            await execute.hold(backend, spec("distributed", "Rollout"), OLD, {}, REF)
            await _run(backend, await _pass(backend, OLD, "legacy", 2, {}, "Rollout"))
            assert (await read_deployment(backend)).rollout
            await release(backend, OLD.tag)
            await execute.hold(backend, spec("legacy", "Rollout"), NEW, {}, REF)
            await _run(backend, await _pass(backend, NEW, "legacy", 1, {}, "Rollout"))
            assert (await read_deployment(backend)).rollout, "the window ended at once"

    asyncio.run(go())


def _resource(name: str, implementation: str) -> str:
    return json.dumps({
        "apiVersion": "tsoracle.io/v1alpha1", "kind": "TimestampOracle",
        "metadata": {"name": name},
        "spec": {"backend": {"urlSecretRef": {"name": "oracle-db"}, "schema": "s_adopt"},
                 "timelines": ["EpochMilliseconds"], "deletionPolicy": "Retain",
                 "implementation": implementation, "statusRefreshSeconds": 1}})


def _until(predicate, what: str, cap: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + cap  # only a hang reaches the cap
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)


def test_an_operator_stopped_mid_pass_changes_nothing_after_its_resource_was_replaced(
        kube, chart, database, tmp_path):
    """Issue 34 end to end, on the real API server and PostgreSQL: operator A plans a flip to
    legacy for `orders` and is stopped (SIGSTOP) before the flip's transaction. `orders` is
    deleted (Retain: operator B releases the schema) and created again on distributed; B
    adopts it. A resumes: its flip must change nothing, and the new resource is not stuck."""
    ns = kube.new_namespace("paused")
    kube.backend_secret(ns, "oracle-db", database)
    marker = tmp_path / "paused"
    a = Operator(chart.kubeconfig, ns, tmp_path / "a.log", module="tsoracle_dev.pausing_operator",
                 env={"TSORACLE_PAUSE_MARKER": str(marker)}).start()
    b = Operator(chart.kubeconfig, ns, tmp_path / "b.log")
    url = f"{database}?schema=s_adopt"
    try:
        kube.kubectl("-n", ns, "apply", "-f", "-", stdin=_resource("orders", "distributed"))
        kube.wait_tso(ns, "orders", is_ready, what="Ready on distributed")
        old_uid = json.loads(kube.kubectl("-n", ns, "get", "tso", "orders", "-o",
                                          "json").stdout)["metadata"]["uid"]
        kube.kubectl("-n", ns, "patch", "tso", "orders", "--type", "merge", "-p",
                     json.dumps({"spec": {"implementation": "legacy"}}))
        _until(marker.exists, "operator A to plan the flip and stop")
        assert old_uid in marker.read_text()  # the planner: the old resource
        kube.kubectl("-n", ns, "delete", "tso", "orders", "--wait=false")
        b.start()  # the successor finishes the deletion (Retain) and serves the new resource
        _until(lambda: "not found" in kube.kubectl(
            "-n", ns, "get", "tso", "orders", check=False).stderr, "the deletion")
        kube.kubectl("-n", ns, "apply", "-f", "-", stdin=_resource("orders", "distributed"))
        kube.wait_tso(ns, "orders", lambda o: is_ready(o) and o["metadata"]["uid"] != old_uid,
                      what="the new resource Ready")
        dep = asyncio.run(tsoracle.status(url)).deployment
        assert (dep.implementation, dep.epoch) == ("distributed", 1) and old_uid not in dep.owner
        assert a.proc is not None
        a.proc.send_signal(signal.SIGCONT)
        _until(lambda: "the schema now belongs to TimestampOracle" in
               (tmp_path / "a.log").read_text(), "operator A's refused flip")
        a.stop()
        dep = asyncio.run(tsoracle.status(url)).deployment
        assert (dep.implementation, dep.epoch) == ("distributed", 1)
        # The new owner is not stuck: its next generation flips at once.
        kube.kubectl("-n", ns, "patch", "tso", "orders", "--type", "merge", "-p",
                     json.dumps({"spec": {"implementation": "legacy"}}))
        done = kube.wait_tso(ns, "orders", lambda o: is_ready(o) and o.get("status", {}).get(
            "activeImplementation") == "legacy", what="the new owner's flip")
        assert done["status"]["epoch"] == 2
        assert len(kube.events(ns, "Flipped")) == 1
    finally:
        a.stop()
        b.stop()


@pytest.mark.parametrize("stored", [0, -5, 2**62])
def test_an_unusable_window_time_is_replaced_by_the_owners_clock(sqlite_url, stored):
    """A flip time that is missing, negative or ahead of the operator's clock (a hand-edited
    row, a flipping host's clock ahead) is replaced, so the window ends a whole window later."""
    at = int(NOW.timestamp() * 1000)

    async def go() -> None:
        async with admin_backend(sqlite_url, create=True) as backend:
            await execute.hold(backend, spec("distributed", "Rollout"), OLD, {}, REF)
            dep = await read_deployment(backend)
            await backend.fetch("UPDATE {deployment} SET flip_epoch = %(e)s, flipped_ms ="
                                " %(t)s WHERE id = 1", {"e": dep.epoch, "t": stored})
            by = PlannedBy(OLD.tag, 1)
            assert not await start_flip_clock(backend, dep.epoch, at, PlannedBy(NEW.tag, 1))
            assert await start_flip_clock(backend, dep.epoch, at, by)
            assert await read_flip_clock(backend) == FlipClock(dep.epoch, at)
            assert not await start_flip_clock(backend, dep.epoch, at + 1, by)  # timed now

    asyncio.run(go())

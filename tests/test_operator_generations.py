"""Generations that mean what they say (issue 26, findings 1 and 2), on real PostgreSQL and the
real API server.

Before the fixes: a resource re-created on a retained schema started at generation 1 while the
schema still recorded its predecessor's 4, so every flip and fencing change was refused as
stale, forever; a pass planned for generation 4 and resumed after generation 5 had reverted it
was accepted (a replica of generation 5 that found nothing to do recorded nothing); the end of a
rollout window had no check at all; and a late status patch could move status.epoch back.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import uuid

from kubernetes import config

import tsoracle
from tsoracle.fencing import FlipClock, read_deployment, read_flip_clock
from tsoracle.operator import execute
from tsoracle.operator import kube as operator_kube
from tsoracle.operator.model import FinishRollout, Observation, plan, status_expectations
from tsoracle.operator.ownership import Owner
from tsoracle.oracle.connect import admin_backend
from tsoracle.resource import parse_spec
from tsoracle_dev.kube import condition, is_ready

OWNER = Owner("ns", "orders", "uid-1")
REF = "ns/orders"
LONG_AGO = "2026-01-01T00:00:00Z"


def spec(implementation: str, fencing: str = "Rollout") -> object:
    return parse_spec({"backend": {"urlSecretRef": {"name": "db"}},
                       "implementation": implementation, "fencing": fencing,
                       "rolloutWindowSeconds": 30})



async def _planned(backend, implementation: str, generation: int, status: dict,
                   clock: FlipClock | None = None) -> object:
    """What a replica plans from generation `generation` of the resource (not run yet);
    `clock`: when it believes the rollout window opened (default: what the database says)."""
    dep = await read_deployment(backend)
    return plan(Observation(spec(implementation), dep, status, generation,
                            dt.datetime.now(dt.UTC),
                            flip_clock=clock or await read_flip_clock(backend)))


async def _run(backend, todo) -> execute.Pass:  # type: ignore[no-untyped-def]
    dep = await read_deployment(backend)
    return await execute.run(todo, execute.Pass(backend, {}, REF, dep))


def test_a_paused_pass_of_an_older_generation_changes_nothing(pg, operator_events):
    """Gen 4 asks for legacy; replica A plans it and pauses; gen 5 reverts it; replica B finds
    nothing to do. A resumes: its flip must be refused, or every client is fenced twice."""
    url = f"{pg.url()}?schema=g_{uuid.uuid4().hex[:8]}"

    async def go() -> None:
        async with admin_backend(url, create=True) as backend:
            await execute.hold(backend, spec("distributed"), OWNER, {}, REF)
            await _run(backend, await _planned(backend, "distributed", 3, {}))
            status = {"epoch": 1, "activeImplementation": "distributed"}
            paused = await _planned(backend, "legacy", 4, status)  # replica A
            await _run(backend, await _planned(backend, "distributed", 5, status))  # B
            resumed = await _run(backend, paused)
            dep = await read_deployment(backend)
            assert (dep.epoch, dep.implementation) == (1, "distributed")
            assert not resumed.flipped and resumed.stale
            # A pass of the newest generation still acts.
            done = await _run(backend, await _planned(backend, "legacy", 6, status))
            assert done.flipped and (await read_deployment(backend)).epoch == 2

    asyncio.run(go())
    assert [r for r, _ in operator_events] == ["Flipped"]


def test_a_stale_pass_never_ends_a_newer_flips_rollout_window(pg, operator_events):
    url = f"{pg.url()}?schema=g_{uuid.uuid4().hex[:8]}"

    async def go() -> None:
        async with admin_backend(url, create=True) as backend:
            await execute.hold(backend, spec("distributed"), OWNER, {}, REF)
            await _run(backend, await _planned(backend, "legacy", 2, {}))  # epoch 2, rollout
            window_over = {"epoch": 2, "activeImplementation": "legacy",
                           "lastFlipTime": LONG_AGO}
            paused = await _planned(backend, "legacy", 2, window_over,
                                    FlipClock(2, 1))  # epoch 2's window long over: the end
            assert any(isinstance(step, FinishRollout) for step in paused.steps)
            await _run(backend, await _planned(backend, "distributed", 3, window_over))
            assert (await read_deployment(backend)).rollout  # epoch 3's window has begun
            await _run(backend, paused)
            dep = await read_deployment(backend)
            assert (dep.epoch, dep.rollout) == (3, True)

    asyncio.run(go())


def _resource(name: str, schema: str, **spec_fields: object) -> str:
    return json.dumps({
        "apiVersion": "tsoracle.io/v1alpha1", "kind": "TimestampOracle",
        "metadata": {"name": name},
        "spec": {"backend": {"urlSecretRef": {"name": "oracle-db"}, "schema": schema},
                 "timelines": ["EpochMilliseconds"], "deletionPolicy": "Retain",
                 "fencing": "Rollout", "statusRefreshSeconds": 1, **spec_fields}})


def _patch(kube, ns: str, name: str, **spec_fields: object) -> None:
    kube.kubectl("-n", ns, "patch", "tso", name, "--type", "merge", "-p",
                 json.dumps({"spec": spec_fields}))


def _settled(epoch: int, fencing: str, generation: int | None = None):
    def ok(o: dict) -> bool:
        st = o.get("status") or {}
        return (is_ready(o) and st.get("epoch") == epoch and st.get("fencing") == fencing
                and (generation is None or st.get("observedGeneration") == generation))
    return ok


def test_a_recreated_resource_flips_and_sets_fencing_on_the_schema_it_adopted(kube, oracle_ns):
    ns, name = oracle_ns.name, "adopt"
    kube.kubectl("-n", ns, "apply", "-f", "-", stdin=_resource(name, "s_adopt"))
    kube.wait_tso(ns, name, _settled(1, "Rollout"))
    for generation, mode in ((2, "Always"), (3, "Disabled"), (4, "Always")):
        _patch(kube, ns, name, fencing=mode)
        kube.wait_tso(ns, name, _settled(1, mode, generation))
    kube.kubectl("-n", ns, "delete", "tso", name, "--timeout=60s")
    # Generation 1 of the new resource: fencing Rollout (the schema has Always) and legacy.
    kube.kubectl("-n", ns, "apply", "-f", "-",
                 stdin=_resource(name, "s_adopt", implementation="legacy"))
    adopted = kube.wait_tso(ns, name, _settled(2, "Rollout"), timeout=60,
                            what="flipped and fencing set on the adopted schema")
    assert adopted["metadata"]["generation"] == 1
    dep = asyncio.run(tsoracle.status(f"{oracle_ns.url}?schema=s_adopt")).deployment
    assert (dep.implementation, dep.fence, dep.epoch) == ("legacy", "Rollout", 2)
    assert "not applied" not in oracle_ns.log.read_text()


def test_ready_waits_for_the_fencing_the_spec_asks_for(kube, oracle_ns):
    ns, name = oracle_ns.name, "fence"
    kube.kubectl("-n", ns, "apply", "-f", "-", stdin=_resource(name, "s_fence"))
    kube.wait_tso(ns, name, _settled(1, "Rollout"))
    url = f"{oracle_ns.url}?schema=s_fence"
    oracle_ns.operator.proc.send_signal(19)  # SIGSTOP: the spec moves, nobody acts on it
    try:
        _patch(kube, ns, name, fencing="Always")
        asyncio.run(tsoracle.set_fencing(url, "Disabled"))  # someone else changes the mode
    finally:
        oracle_ns.operator.proc.send_signal(18)  # SIGCONT
    done = kube.wait_tso(ns, name, _settled(1, "Always", 2), what="fencing set again")
    assert condition(done, "Ready")["status"] == "True"
    dep = asyncio.run(tsoracle.status(url)).deployment
    assert dep.fence == "Always"


def test_a_late_status_patch_never_moves_the_status_back(kube, chart, monkeypatch):
    """Two passes read status at epoch 3; one publishes epoch 4; the other, late, must not
    publish its older view over it (the API server tests the fields in the same request)."""
    ns = kube.new_namespace("late")
    name = "late"
    kube.kubectl("-n", ns, "apply", "-f", "-", stdin=_resource(name, "s_late"))  # no operator
    api = config.new_client_from_config(str(chart.kubeconfig))  # the operator's own account
    monkeypatch.setattr(operator_kube, "api_client", lambda: api)

    def resource() -> dict:
        return json.loads(kube.kubectl("-n", ns, "get", "tso", name, "-o", "json").stdout)

    async def go() -> None:
        # Issue 34: two passes read a resource with no status at all (new, or written by an
        # earlier release); the first publishes, the late one must not overwrite it.
        empty = resource()["metadata"]["resourceVersion"]
        first = {"observedGeneration": 1, "epoch": 3, "fencing": "Always"}
        assert await operator_kube.patch_status(
            ns, name, first, expect=status_expectations({}, empty))
        assert not await operator_kube.patch_status(
            ns, name, {"observedGeneration": 1, "epoch": 2, "fencing": "Rollout"},
            expect=status_expectations({}, empty))
        read = {"observedGeneration": 1, "epoch": 3}
        newer = {"observedGeneration": 1, "epoch": 4, "fencing": "Always"}
        expect = {f"/status/{k}": v for k, v in read.items()}
        assert await operator_kube.patch_status(ns, name, newer, expect=expect,
                                                present=tuple(read))
        late = {"observedGeneration": 1, "epoch": 3, "fencing": "Rollout", "catalog": None}
        assert not await operator_kube.patch_status(ns, name, late, expect=expect,
                                                    present=tuple(read))

    asyncio.run(go())
    got = resource()["status"]
    assert (got["epoch"], got["fencing"]) == (4, "Always")

"""The operator's executor (operator/execute.py) on a real SQLite backend, without an API
server: each planned step does what it says, and a step that the steps before it made moot is
skipped. tests/test_operator.py runs it under kopf."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tsoracle.fencing import PlannedBy, read_deployment
from tsoracle.operator import execute
from tsoracle.operator.model import FinishRollout, Flip, Plan, PublishFlip, SetFencing
from tsoracle.operator.ownership import Owner, OwnershipProblem
from tsoracle.oracle.connect import admin_backend
from tsoracle.resource import parse_spec

SPEC = parse_spec({"backend": {"urlSecretRef": {"name": "db"}}})
OWNER = Owner("ns", "orders", "uid-1")
REF = "ns/orders"


def by(generation: int) -> PlannedBy:
    return PlannedBy(OWNER.tag, generation)



def test_hold_provisions_claims_and_refuses_another_owner(sqlite_url):
    async def go() -> None:
        async with admin_backend(sqlite_url, create=True) as backend:
            dep = await execute.hold(backend, SPEC, OWNER, {}, REF)
            assert (dep.owner, dep.epoch, dep.implementation) == (OWNER.tag, 1, "distributed")
            with pytest.raises(OwnershipProblem, match="belongs to TimestampOracle ns/orders"):
                await execute.hold(backend, SPEC, Owner("ns", "other", "uid-2"), {}, "ns/other")

    asyncio.run(go())


def test_steps_run_in_order_and_skip_what_earlier_ones_made_moot(sqlite_url, operator_events,
                                                                  caplog):
    caplog.set_level(logging.INFO, "tsoracle.operator")

    async def run(backend, *steps) -> execute.Pass:  # type: ignore[no-untyped-def]
        dep = await read_deployment(backend)
        return await execute.run(Plan(steps), execute.Pass(backend, {}, REF, dep))

    async def go() -> None:
        async with admin_backend(sqlite_url, create=True) as backend:
            await execute.hold(backend, SPEC, OWNER, {}, REF)
            # A published flip is the pass's news: the end of the rollout waits.
            done = await run(backend, SetFencing("Rollout", by(2)), Flip("legacy", by(2)),
                             FinishRollout(by(2), 1))
            assert done.flipped and done.flip_time and done.bootstrap
            dep = await read_deployment(backend)
            assert (dep.implementation, dep.epoch, dep.fence, dep.rollout) == \
                ("legacy", 2, "Rollout", True)
            # A change asked for by an older generation is refused, and the stale pass does
            # nothing more: the rollout goes on.
            done = await run(backend, SetFencing("Always", by(1)), FinishRollout(by(1), 2))
            assert done.stale and not done.flipped and done.dep.fence == "Rollout"
            assert (await read_deployment(backend)).rollout
            # A pass that timed the window of an earlier epoch's flip does not end this one's.
            done = await run(backend, FinishRollout(by(2), 1))
            assert not done.stale and (await read_deployment(backend)).rollout
            done = await run(backend, FinishRollout(by(2), 2))
            assert not (await read_deployment(backend)).rollout
            # A flip committed by a pass that never published it.
            done = await run(backend, PublishFlip(1))
            assert done.flipped and (await read_deployment(backend)).epoch == 2
            # Leaving the Rollout mode ends a rollout by itself: nothing left to finish.
            await run(backend, SetFencing("Rollout", by(3)), Flip("distributed", by(3)))
            done = await run(backend, SetFencing("Always", by(3)), FinishRollout(by(3), 3))
            assert (done.dep.fence, done.dep.rollout) == ("Always", False)

    asyncio.run(go())
    assert [m for r, m in operator_events if r == "Flipped"] == [
        "implementation distributed -> legacy, epoch 2; bootstrap EpochMilliseconds=0",
        "implementation distributed -> legacy, epoch 2; bootstrap EpochMilliseconds=0",
        "implementation legacy -> distributed, epoch 3; bootstrap EpochMilliseconds=0",
    ]
    said = [r.getMessage() for r in caplog.records]
    assert sum("rollout window over" in line for line in said) == 1
    assert any("fencing Always not applied, and the pass stops: this pass read generation 1, "
               "and the backend already applied generation 2" in line for line in said), said
    assert any("rollout window of epoch 1 not ended" in line for line in said), said

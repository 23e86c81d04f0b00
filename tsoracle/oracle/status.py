"""A read-only snapshot of the deployment and every timeline."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from tsoracle.fencing import Deployment, read_deployment
from tsoracle.oracle.timeline import EPOCH_MILLISECONDS
from tsoracle.store import Backend


@dataclass(frozen=True)
class TimelineStatus:
    timeline: str
    read_ts: int  # of the active implementation; for legacy a durable lower bound
    write_ts: int  # of the active implementation; for legacy the reserved upper bound
    lag_ms: int | None  # wall clock minus read_ts, on EpochMilliseconds once reads moved
    leader_epoch: int  # legacy leader epoch


@dataclass(frozen=True)
class Status:
    deployment: Deployment
    timelines: list[TimelineStatus]

    def as_dict(self) -> dict[str, object]:
        return {"deployment": asdict(self.deployment),
                "timelines": [asdict(t) for t in self.timelines]}


async def read_status(backend: Backend, now: Callable[[], int]) -> Status:
    dep = await read_deployment(backend)
    rows = await backend.fetch(
        "SELECT t.timeline, t.read_ts, t.write_ts, l.leader_epoch FROM {timestamps} t"
        " JOIN {timestamps} l ON l.timeline = t.timeline AND l.implementation = 'legacy'"
        " WHERE t.implementation = %(impl)s ORDER BY t.timeline",
        {"impl": dep.implementation},
    )
    wall = now()
    timelines = []
    for name, read_ts, write_ts, leader_epoch in rows:
        read = backend.dec(read_ts)
        # Only a wall-clock timeline whose reads have moved has a lag worth showing: before the
        # first apply_write read_ts is 0, and "56 years behind" says nothing.
        lag = wall - read if name == EPOCH_MILLISECONDS and read > 0 else None
        timelines.append(TimelineStatus(name, read, backend.dec(write_ts), lag, int(leader_epoch)))
    return Status(dep, timelines)

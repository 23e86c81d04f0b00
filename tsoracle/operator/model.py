"""What a reconcile pass decides and publishes, as pure functions of what it observed: the
plan (`plan`), the conditions and the status patch. The handler only performs them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tsoracle.fencing import Deployment
from tsoracle.oracle.status import Status
from tsoracle.resource import OracleSpec

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"

CONDITION_TYPES = ("Ready", "Provisioned", "RolloutInProgress", "Degraded")


def needs_provisioning(found: Deployment | None, has_timelines: bool) -> bool:
    return found is None or not has_timelines


@dataclass(frozen=True)
class Plan:
    """What one pass does to a provisioned deployment, in this order. The handler sets the
    fencing mode first and plans again from the deployment that returns (a mode change may end
    a rollout, or be refused as stale); `resume_flip` and `finish_rollout` apply only when the
    flip (if any) changed nothing."""

    set_fencing: bool = False
    flip_to: str | None = None
    # A flip committed but never published (the operator died in between): report it.
    resume_flip: bool = False
    finish_rollout: bool = False


def plan(spec: OracleSpec, dep: Deployment, old_status: Mapping[str, Any],
         now: dt.datetime) -> Plan:
    """Decide a pass from the spec, the deployment as found, the status last published and the
    time."""
    set_fencing = dep.fence != spec.fencing
    published = int(old_status.get("epoch") or 0)
    # Flips only ever change the implementation: a newer epoch than the one published, with
    # another implementation than the one published, is a flip nobody reported.
    unreported = bool(published) and dep.epoch > published \
        and old_status.get("activeImplementation") not in (None, dep.implementation)
    return Plan(
        set_fencing=set_fencing,
        flip_to=spec.implementation if dep.implementation != spec.implementation else None,
        resume_flip=unreported,
        finish_rollout=not unreported and dep.rollout and rollout_over(old_status, spec, now),
    )


def rollout_over(old_status: Mapping[str, Any], spec: OracleSpec, now: dt.datetime) -> bool:
    since = old_status.get("lastFlipTime")
    if not since:
        return True
    flipped = dt.datetime.strptime(since, TIME_FORMAT).replace(tzinfo=dt.UTC)
    return (now - flipped).total_seconds() >= spec.rollout_window_s


@dataclass(frozen=True)
class Condition:
    type: str
    status: str  # "True" / "False" / "Unknown"
    reason: str
    message: str = ""


def merge_conditions(old: list[Mapping[str, Any]] | None, new: list[Condition],
                     generation: int, now: str) -> list[dict[str, Any]]:
    """KEP-1623 conditions; lastTransitionTime moves only when the status flips."""
    previous = {c.get("type"): c for c in (old or [])}
    out = []
    for c in new:
        before = previous.get(c.type)
        changed = before is None or before.get("status") != c.status
        out.append({
            "type": c.type, "status": c.status, "reason": c.reason, "message": c.message,
            "observedGeneration": generation,
            "lastTransitionTime": now if changed else before.get("lastTransitionTime", now),
        })
    return out


@dataclass
class Observation:
    """What one reconcile learned; `status_patch` turns it into the resource's status."""

    provisioned: bool = False
    status: Status | None = None
    degraded_reason: str = ""
    degraded_message: str = ""
    rollout: bool = False
    bootstrap: dict[str, int] = field(default_factory=dict)


def status_patch(obs: Observation, spec: OracleSpec | None, old_status: Mapping[str, Any],
                 generation: int, now: str) -> dict[str, Any]:
    st = obs.status
    ready = (obs.provisioned and not obs.degraded_reason and st is not None and spec is not None
             and st.deployment.implementation == spec.implementation)
    conditions = [
        Condition("Ready", "True" if ready else "False",
                  "Reconciled" if ready else (obs.degraded_reason or "Progressing"),
                  "" if ready else (obs.degraded_message or "reconciling")),
        Condition("Provisioned", "True" if obs.provisioned else "False",
                  "SchemaReady" if obs.provisioned else (obs.degraded_reason or "Pending"),
                  "" if obs.provisioned else obs.degraded_message),
        Condition("RolloutInProgress", "True" if obs.rollout else "False",
                  "FencingRollout" if obs.rollout else "Idle",
                  "processes on the old epoch are fenced until the rollout window ends"
                  if obs.rollout else ""),
        Condition("Degraded", "True" if obs.degraded_reason else "False",
                  obs.degraded_reason or "Healthy", obs.degraded_message),
    ]
    patch: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": merge_conditions(old_status.get("conditions"), conditions, generation, now),
    }
    if st is not None:
        patch["activeImplementation"] = st.deployment.implementation
        patch["epoch"] = st.deployment.epoch
        patch["incarnation"] = st.deployment.incarnation
        patch["fencing"] = st.deployment.fence
        patch["timelines"] = [
            {"name": t.timeline, "readTs": str(t.read_ts), "writeTs": str(t.write_ts),
             "lagMs": t.lag_ms}
            for t in st.timelines
        ]
    if obs.bootstrap:
        patch["bootstrapTimestamp"] = {k: str(v) for k, v in sorted(obs.bootstrap.items())}
    return patch

"""What a reconcile pass decides and publishes, as pure functions of what it observed: the
plan (`plan`, a list of steps), the Degraded reason of a failure, the conditions and the status
patch. The handler reads; execute.py carries the steps out."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tsoracle.errors import ConfigError, OracleError, OracleUnavailable
from tsoracle.fencing import Deployment
from tsoracle.operator.ownership import OwnershipProblem
from tsoracle.operator.redact import redact
from tsoracle.oracle.status import Status
from tsoracle.resource import OracleSpec, SecretProblem

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"

CONDITION_TYPES = ("Ready", "Provisioned", "RolloutInProgress", "Degraded")

# A new one of these reasons also posts a Warning Event: each needs a person to act.
WARNED_REASONS = ("BackendChanged", "SchemaInUse", "SecretNotLabelled")


def needs_provisioning(found: Deployment | None, has_timelines: bool) -> bool:
    return found is None or not has_timelines


@dataclass(frozen=True)
class Observation:
    """What a pass found, once the resource holds its deployment (provisioned and claimed)."""

    spec: OracleSpec
    deployment: Deployment
    status: Mapping[str, Any]  # as last published
    generation: int  # the resource's metadata.generation
    now: dt.datetime


@dataclass(frozen=True)
class SetFencing:
    """Set the fencing mode everywhere; the backend refuses it for an older `generation`."""

    mode: str
    generation: int


@dataclass(frozen=True)
class Flip:
    """Make `to` the active implementation; the backend refuses it for an older `generation`."""

    to: str
    generation: int


@dataclass(frozen=True)
class PublishFlip:
    """Publish a flip that an earlier pass committed but never published (the operator died
    in between), as if it had just happened."""

    published_epoch: int  # the epoch the status still shows


@dataclass(frozen=True)
class FinishRollout:
    """The rollout window has passed: only the inactive implementation stays fenced."""


Step = SetFencing | Flip | PublishFlip | FinishRollout


@dataclass(frozen=True)
class Plan:
    """What one pass does to a held deployment: `steps`, in order, each carried out only
    while `still_due` after the ones before it."""

    steps: tuple[Step, ...] = ()


def plan(obs: Observation) -> Plan:
    """Decide a pass from what it observed."""
    spec, dep, status = obs.spec, obs.deployment, obs.status
    steps: list[Step] = []
    if dep.fence != spec.fencing:
        steps.append(SetFencing(spec.fencing, obs.generation))
    if dep.implementation != spec.implementation:
        steps.append(Flip(spec.implementation, obs.generation))
    published = int(status.get("epoch") or 0)
    # Flips only ever change the implementation: a newer epoch than the one published, with
    # another implementation than the one published, is a flip nobody reported.
    if published and dep.epoch > published \
            and status.get("activeImplementation") not in (None, dep.implementation):
        steps.append(PublishFlip(published))
    elif dep.rollout and rollout_over(status, spec, obs.now):
        steps.append(FinishRollout())
    return Plan(tuple(steps))


def still_due(step: Step, dep: Deployment, flipped: bool) -> bool:
    """Whether a planned step still applies, given the deployment the steps before it left
    (`dep`) and whether one of them published a flip. A published flip is the pass's news:
    an unpublished one and the end of a rollout wait for the next pass. Leaving the Rollout
    mode (SetFencing) ends a rollout by itself. A flip whose target is already active (another
    operator or `tsoracle flip` got there while this pass ran) is not done again."""
    if isinstance(step, (PublishFlip, FinishRollout)) and flipped:
        return False
    if isinstance(step, Flip):
        return dep.implementation != step.to
    return dep.rollout if isinstance(step, FinishRollout) else True


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
        since = now
        if before is not None and before.get("status") == c.status:
            since = before.get("lastTransitionTime", now)
        out.append({
            "type": c.type, "status": c.status, "reason": c.reason, "message": c.message,
            "observedGeneration": generation, "lastTransitionTime": since,
        })
    return out


@dataclass
class Outcome:
    """What one reconcile pass learned; `status_patch` turns it into the resource's status."""

    provisioned: bool = False
    status: Status | None = None
    degraded_reason: str = ""
    degraded_message: str = ""
    rollout: bool = False
    bootstrap: dict[str, int] = field(default_factory=dict)
    flip_time: str = ""  # when this pass published a flip (TIME_FORMAT)


def degraded(exc: OracleError, url: str | None) -> tuple[str, str]:
    """The Degraded reason and message of a pass that failed with `exc`. `url`: the backend URL
    read from the Secret, if the pass got that far; the message never holds it."""
    if isinstance(exc, (SecretProblem, OwnershipProblem)):
        degraded_reason = exc.reason
    elif isinstance(exc, ConfigError):
        degraded_reason = "BadURL" if url is not None else "InvalidSpec"
    elif isinstance(exc, OracleUnavailable):
        degraded_reason = "BackendUnavailable"
    else:
        degraded_reason = type(exc).__name__
    return degraded_reason, redact(str(exc), url)


def published_degraded_reason(status: Mapping[str, Any]) -> str:
    """The Degraded reason `status` carries; "" when it is not degraded."""
    for c in status.get("conditions") or []:
        if c.get("type") == "Degraded" and c.get("status") == "True":
            return str(c.get("reason") or "")
    return ""


def status_patch(outcome: Outcome, spec: OracleSpec | None, old_status: Mapping[str, Any],
                 generation: int, now: str) -> dict[str, Any]:
    st = outcome.status
    patch: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": merge_conditions(old_status.get("conditions"),
                                       conditions(outcome, spec), generation, now),
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
    if outcome.bootstrap:
        patch["bootstrapTimestamp"] = {k: str(v) for k, v in sorted(outcome.bootstrap.items())}
    if outcome.flip_time:
        patch["lastFlipTime"] = outcome.flip_time
    return patch


def conditions(o: Outcome, spec: OracleSpec | None) -> list[Condition]:
    """The CONDITION_TYPES an outcome publishes, in that order."""
    st = o.status
    ready = (o.provisioned and not o.degraded_reason and st is not None and spec is not None
             and st.deployment.implementation == spec.implementation)
    return [
        Condition("Ready", "True" if ready else "False",
                  "Reconciled" if ready else (o.degraded_reason or "Progressing"),
                  "" if ready else (o.degraded_message or "reconciling")),
        Condition("Provisioned", "True" if o.provisioned else "False",
                  "SchemaReady" if o.provisioned else (o.degraded_reason or "Pending"),
                  "" if o.provisioned else o.degraded_message),
        Condition("RolloutInProgress", "True" if o.rollout else "False",
                  "FencingRollout" if o.rollout else "Idle",
                  "processes on the old epoch are fenced until the rollout window ends"
                  if o.rollout else ""),
        Condition("Degraded", "True" if o.degraded_reason else "False",
                  o.degraded_reason or "Healthy", o.degraded_message),
    ]

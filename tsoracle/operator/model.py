"""The TimestampOracle resource as data: spec parsing, conditions and status, all pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tsoracle.errors import ConfigError, InvalidTimeline
from tsoracle.fencing import IMPLEMENTATIONS, MODES
from tsoracle.oracle.status import Status
from tsoracle.oracle.timeline import EPOCH_MILLISECONDS, parse_timeline
from tsoracle.store import has_schema, parse_url, url_with_schema

GROUP = "tsoracle.io"
VERSION = "v1alpha1"
PLURAL = "timestamporacles"
KIND = "TimestampOracle"
CONDITION_TYPES = ("Ready", "Provisioned", "RolloutInProgress", "Degraded")


@dataclass(frozen=True)
class OracleSpec:
    secret_name: str
    secret_key: str
    schema: str
    implementation: str
    fencing: str
    timelines: tuple[str, ...]
    deletion_policy: str
    rollout_window_s: int
    refresh_s: int


def parse_spec(spec: Mapping[str, Any]) -> OracleSpec:
    """Validate what the CRD schema cannot (it already checks shapes and enums)."""
    backend = spec.get("backend") or {}
    ref = backend.get("urlSecretRef") or {}
    if not ref.get("name"):
        raise ConfigError("spec.backend.urlSecretRef.name is required")
    implementation = spec.get("implementation", "distributed")
    if implementation not in IMPLEMENTATIONS:
        raise ConfigError(f"spec.implementation {implementation!r} is not one of {IMPLEMENTATIONS}")
    fencing = spec.get("fencing", "Always")
    if fencing not in MODES:
        raise ConfigError(f"spec.fencing {fencing!r} is not one of {MODES}")
    timelines = tuple(spec.get("timelines") or [EPOCH_MILLISECONDS])
    for t in timelines:
        try:
            parse_timeline(t)
        except InvalidTimeline as exc:
            raise ConfigError(f"spec.timelines: {exc}") from None
    return OracleSpec(
        secret_name=str(ref["name"]),
        secret_key=str(ref.get("key") or "url"),
        schema=str(backend.get("schema") or "tsoracle"),
        implementation=implementation,
        fencing=fencing,
        timelines=timelines,
        deletion_policy=spec.get("deletionPolicy", "Retain"),
        rollout_window_s=int(spec.get("rolloutWindowSeconds", 30)),
        refresh_s=int(spec.get("statusRefreshSeconds", 10)),
    )


def with_schema(url: str, schema: str) -> str:
    """The backend URL with the resource's schema. A URL that names another schema is refused:
    spec.backend.schema is immutable, and a Secret edit must not move the oracle elsewhere."""
    if has_schema(url) and parse_url(url).schema != schema:
        raise ConfigError(
            f"the backend URL in the Secret names a schema other than spec.backend.schema "
            f"({schema!r}); remove the schema parameter from the Secret's URL")
    return url_with_schema(url, schema)


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

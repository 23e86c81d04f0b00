"""What a reconcile pass decides and publishes, as pure functions of what it observed: the
plan (`plan`, a list of steps), the Degraded reason of a failure, the conditions and the status
patch. The handler reads; execute.py carries the steps out."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tsoracle.errors import ConfigError, OracleError, OracleUnavailable
from tsoracle.fencing import Deployment, FlipClock, PlannedBy
from tsoracle.operator import catalog
from tsoracle.operator.ownership import Owner, OwnershipProblem
from tsoracle.operator.redact import redact
from tsoracle.oracle.status import Status
from tsoracle.oracle.timeline import parse_timeline
from tsoracle.resource import OracleSpec, SecretProblem, parse_spec

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"

CONDITION_TYPES = ("Ready", "Provisioned", "RolloutInProgress", "Degraded")
# Published after those while spec.catalog is enabled.
CATALOG_CONDITION = "CatalogReady"

# A new one of these reasons also posts a Warning Event: each needs a person to act.
WARNED_REASONS = ("BackendChanged", "SchemaInUse", "SecretNotLabelled")
# The same for CatalogReady's reasons.
WARNED_CATALOG_REASONS = ("LegacyServesOneReplica", "CatalogNameInUse", "BackendURLNotUsable",
                          "NoCatalogImage", "InvalidName", "CatalogRejected")


def needs_provisioning(found: Deployment | None, has_timelines: bool) -> bool:
    return found is None or not has_timelines


@dataclass(frozen=True)
class CatalogObservation:
    """What a pass found for the catalog (spec.catalog), and what it needs to build it."""

    owner: Owner
    seen: catalog.Seen
    image: str  # what the catalog's pods run; "" when the operator was given none
    url_suffix: str | None  # catalog.url_suffix of the backend Secret's value
    token_problem: tuple[str, str] | None = None  # (reason, message) of spec.catalog's token


@dataclass(frozen=True)
class Observation:
    """What a pass found, once the resource holds its deployment (provisioned and claimed)."""

    spec: OracleSpec
    deployment: Deployment
    status: Mapping[str, Any]  # as last published
    generation: int  # the resource's metadata.generation
    now: dt.datetime
    # None: not looked at (spec.catalog disabled, and no catalog published in status).
    catalog: CatalogObservation | None = None
    # When the database says the current rollout window opened (None: not read).
    flip_clock: FlipClock | None = None

    @property
    def by(self) -> PlannedBy:
        """This pass as the planner of its steps: the deployment it holds is its owner's."""
        return PlannedBy(self.deployment.owner, self.generation)


# Each durable step names its planner (`by`): the backend refuses it for an earlier
# generation, or for a resource that no longer owns the schema (fencing/planned.py).


@dataclass(frozen=True)
class RecordGeneration:
    """Record the generation this pass acts on, before anything else, even where it changes
    nothing: a pass of an older generation that resumes late is then refused."""

    by: PlannedBy


@dataclass(frozen=True)
class SetFencing:
    """Set the fencing mode everywhere."""

    mode: str
    by: PlannedBy


@dataclass(frozen=True)
class Flip:
    """Make `to` the active implementation."""

    to: str
    by: PlannedBy


@dataclass(frozen=True)
class PublishFlip:
    """Publish a flip that an earlier pass committed but never published (the operator died
    in between), as if it had just happened."""

    published_epoch: int  # the epoch the status still shows


@dataclass(frozen=True)
class FinishRollout:
    """The rollout window of the flip to `epoch` has passed: only the inactive implementation
    stays fenced. Changes nothing once another flip moved the epoch."""

    by: PlannedBy
    epoch: int


@dataclass(frozen=True)
class StartRolloutClock:
    """Nothing in the database times the rollout window of `epoch` usably (a schema from an
    earlier release, an epoch a restore repair moved, a time ahead of this operator's clock):
    time it from `at` (a whole window from now)."""

    by: PlannedBy
    epoch: int
    at: dt.datetime


@dataclass(frozen=True)
class ApplyCatalog:
    """Create or update the catalog's Deployment and Service (spec.catalog, enabled)."""

    desired: catalog.Desired


@dataclass(frozen=True)
class RemoveCatalog:
    """Delete the catalog's Deployment and Service of this resource (spec.catalog disabled)."""

    namespace: str
    name: str
    deployment: bool
    service: bool


Step = (RecordGeneration | SetFencing | Flip | PublishFlip | FinishRollout | StartRolloutClock
        | ApplyCatalog | RemoveCatalog)


@dataclass(frozen=True)
class Plan:
    """What one pass does to a held deployment: `steps`, in order, each carried out only
    while `still_due` after the ones before it."""

    steps: tuple[Step, ...] = ()
    # The backend already applied a newer generation than the resource this pass read: it
    # does nothing (the next pass reads the newer one).
    stale: bool = False


def plan(obs: Observation) -> Plan:
    """Decide a pass from what it observed."""
    spec, dep, status = obs.spec, obs.deployment, obs.status
    if obs.generation < dep.generation:
        return Plan(stale=True)
    by = obs.by
    steps: list[Step] = []
    if obs.generation > dep.generation:
        steps.append(RecordGeneration(by))
    if dep.fence != spec.fencing:
        steps.append(SetFencing(spec.fencing, by))
    if dep.implementation != spec.implementation:
        steps.append(Flip(spec.implementation, by))
    published = int(status.get("epoch") or 0)
    # Flips only ever change the implementation: a newer epoch than the one published, with
    # another implementation than the one published, is a flip nobody reported.
    if published and dep.epoch > published \
            and status.get("activeImplementation") not in (None, dep.implementation):
        steps.append(PublishFlip(published))
    elif dep.rollout:
        steps += rollout_steps(obs)
    steps += catalog_steps(spec, obs.catalog)
    return Plan(tuple(steps))


def catalog_steps(spec: OracleSpec, seen: CatalogObservation | None) -> list[Step]:
    """Apply the catalog where it differs from the spec; remove it once disabled. Objects of
    its name that this resource does not control are never touched."""
    if seen is None:
        return []
    found = seen.seen
    if spec.catalog is None:
        mine = [o is not None and o.controller_uid == seen.owner.uid
                for o in (found.deployment, found.service)]
        return [RemoveCatalog(seen.owner.namespace, catalog.name_of(seen.owner), *mine)] \
            if any(mine) else []
    if catalog_blocker(spec, seen) is not None:
        return []
    want = catalog.desired(spec, seen.owner, seen.image, seen.url_suffix or "")
    current = (found.deployment is not None and found.service is not None
               and found.deployment.digest == found.service.digest == want.digest
               and found.deployment.replicas == spec.catalog.replicas)
    return [] if current else [ApplyCatalog(want)]


def catalog_blocker(spec: OracleSpec, seen: CatalogObservation) -> tuple[str, str] | None:
    """Why the catalog cannot be applied at all (reason, message), or None."""
    owner, name = seen.owner, catalog.name_of(seen.owner)
    if not catalog.valid_name(owner):
        return ("InvalidName", f"the catalog's Service would be named {name!r}, which is not a "
                "Service name (at most 63 characters: lower-case letters, digits and '-', "
                "starting with a letter); give the TimestampOracle a shorter name")
    foreign = seen.seen.foreign(owner)
    if foreign:
        return ("CatalogNameInUse", f"{foreign} {owner.namespace}/{name} exists and does not "
                "belong to this TimestampOracle; nothing was changed: delete or rename it")
    if not seen.image:
        return ("NoCatalogImage", "the operator does not know the image to run the catalog "
                "from: set TSORACLE_CATALOG_IMAGE in its environment (the chart sets it to the "
                "operator's own image)")
    if seen.url_suffix is None:
        return ("BackendURLNotUsable", f"the backend Secret's value (spec.backend.urlSecretRef, "
                f"key {spec.secret_key!r}) ends with a line break or blank, or has a #fragment: "
                "the catalog's pods read it as stored and cannot add the schema to it; store "
                "the URL alone (kubectl create secret generic … --from-literal)")
    return None


def still_due(step: Step, dep: Deployment, flipped: bool) -> bool:
    """Whether a planned step still applies, given the deployment the steps before it left
    (`dep`) and whether one of them published a flip. A published flip is the pass's news:
    an unpublished one and the end of a rollout wait for the next pass. Leaving the Rollout
    mode (SetFencing) ends a rollout by itself. A flip whose target is already active (another
    operator or `tsoracle flip` got there while this pass ran) is not done again."""
    if isinstance(step, (PublishFlip, FinishRollout, StartRolloutClock)) and flipped:
        return False
    if isinstance(step, Flip):
        return dep.implementation != step.to
    return dep.rollout if isinstance(step, (FinishRollout, StartRolloutClock)) else True


def rollout_steps(obs: Observation) -> list[Step]:
    """A rollout in progress ends once its window, timed by the flip the database records
    (whoever made it: this resource, its predecessor, `tsoracle flip`), has passed. Where
    nothing records it, the window starts now: fencing longer is safe, ending early is not."""
    clock, dep = obs.flip_clock, obs.deployment
    now_ms = int(obs.now.timestamp() * 1000)
    # A time ahead of this clock (a flipping host's clock ahead, a row edited by hand) would
    # hold the window open until then: it starts from now instead, like an unrecorded one.
    if clock is None or not clock.times(dep) or clock.at_ms > now_ms:
        return [StartRolloutClock(obs.by, dep.epoch, obs.now)]
    if now_ms - clock.at_ms >= obs.spec.rollout_window_s * 1000:
        return [FinishRollout(obs.by, dep.epoch)]
    return []


# --- Restore safety: the high-water mark kept outside the database ---------------------------

# A rewound backend is moved above the mark by what its timelines could have handed out since
# the mark was taken: the fastest advance seen between two passes, over the time since, times
# REWIND_SAFETY, plus REWIND_FLOOR timestamps (EpochMilliseconds: milliseconds).
REWIND_SAFETY = 2.0
REWIND_FLOOR = 1000


@dataclass(frozen=True)
class HighWater:
    """status.highWater: per timeline the highest position (read_ts or write_ts of any
    implementation) a pass saw and the fastest advance seen between passes, per second; and
    how many passes the database has counted (`fencing.count_pass`)."""

    time: dt.datetime | None = None
    positions: Mapping[str, int] = field(default_factory=dict)
    peaks: Mapping[str, float] = field(default_factory=dict)
    passes: int = 0

    @classmethod
    def of(cls, status: Mapping[str, Any]) -> HighWater:
        hw = status.get("highWater") or {}
        if not hw.get("time"):
            return cls()
        when = dt.datetime.strptime(hw["time"], TIME_FORMAT).replace(tzinfo=dt.UTC)
        marks = hw.get("timelines") or {}
        return cls(when, {k: int(v.get("position") or 0) for k, v in marks.items()},
                   {k: float(v.get("peakPerSecond") or 0) for k, v in marks.items()},
                   int(hw.get("passes") or 0))

    def after(self, positions: Mapping[str, int], now: dt.datetime) -> HighWater:
        """The mark after a pass that found `positions` (it never goes down)."""
        since = (now - self.time).total_seconds() if self.time else 0.0
        marks, peaks = dict(self.positions), dict(self.peaks)
        for name, at in positions.items():
            before = marks.get(name)
            # A counter's pace sizes its margin (rewind_targets), from 0 included; a wall-clock
            # timeline needs none, and its first move, from 0 to the clock, is no pace at all.
            if before is not None and since > 0 and not parse_timeline(name).wall_clock:
                peaks[name] = max(peaks.get(name, 0.0), (at - before) / since)
            marks[name] = max(at, before or 0)
        return HighWater(now, marks, peaks, self.passes)

    def restarted(self, positions: Mapping[str, int], now: dt.datetime) -> HighWater:
        """The mark after a repair moved the backend: no advance is measured across it."""
        marks = {k: max(v, self.positions.get(k, 0)) for k, v in positions.items()}
        return HighWater(now, marks, dict(self.peaks), self.passes)

    def next(self, positions: Mapping[str, int], now: dt.datetime, *, repaired: bool,
             passes: int) -> HighWater:
        """The mark to publish after a pass that found `positions` and counted `passes`."""
        after = self.restarted(positions, now) if repaired else self.after(positions, now)
        return after.counted(passes)

    def counted(self, passes: int) -> HighWater:
        return replace(self, passes=passes)

    def published(self) -> dict[str, Any]:
        marks = {k: {"position": str(v), "peakPerSecond": f"{self.peaks.get(k, 0.0):.3f}"}
                 for k, v in sorted(self.positions.items())}
        return {"time": self.time.strftime(TIME_FORMAT) if self.time else None,
                "passes": self.passes, "timelines": marks}


def rewind_targets(mark: HighWater, positions: Mapping[str, int], epoch: int,
                   published_epoch: int, counted_passes: int,
                   now: dt.datetime) -> dict[str, int]:
    """Where to move each timeline when the backend went back in time (restored from a backup
    or to an earlier point): it counted fewer operator passes than the mark, a timeline is
    below the mark, or the epoch is below the one published. Empty when it did not. Every
    timeline of the mark moves: one restored row means the whole database was.

    The pass count tells a restore even after writers pushed a counter back above the mark
    (each write they refuse still moves the row). A counter may have handed out, since the
    mark, as much as it ever did in that time; EpochMilliseconds only up to the wall clock,
    and its writers never go below the wall clock, so the mark alone covers it."""
    behind = any(at < mark.positions.get(name, 0) for name, at in positions.items())
    if mark.time is None or not (behind or epoch < published_epoch
                                 or counted_passes < mark.passes):
        return {}
    since = max(0.0, (now - mark.time).total_seconds())
    targets = {}
    for name, top in mark.positions.items():
        if name not in positions:
            continue
        ahead = 0 if parse_timeline(name).wall_clock else \
            math.ceil(mark.peaks.get(name, 0.0) * since * REWIND_SAFETY)
        targets[name] = top + ahead + REWIND_FLOOR
    return targets


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


@dataclass(frozen=True)
class CatalogOutcome:
    """What a pass publishes of the catalog: status.catalog (None: remove it) and the
    CatalogReady condition (None: none, the catalog is disabled)."""

    status: dict[str, Any] | None
    condition: Condition | None


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
    catalog: CatalogOutcome | None = None  # None: the pass did not get to the catalog
    stale: bool = False  # the backend applied a newer generation: nothing to publish
    high_water: HighWater | None = None  # status.highWater after this pass


def catalog_outcome(spec: OracleSpec, seen: CatalogObservation | None,
                    applied: catalog.SeenObject | None, rejected: str,
                    implementation: str) -> CatalogOutcome | None:
    """status.catalog and CatalogReady after a pass's steps: `applied` is the Deployment as
    this pass applied it (None: not applied), `rejected` what the API server said when it
    refused to, `implementation` the one active now."""
    if seen is None:
        return None
    c = spec.catalog
    if c is None:
        return CatalogOutcome(None, None)
    blocker = catalog_blocker(spec, seen)
    found = applied or (seen.seen.deployment if blocker is None else None)
    ready = found.ready_replicas if found is not None else 0
    status = {"url": catalog.service_url(seen.owner), "replicas": c.replicas,
              "readyReplicas": ready}
    # On legacy one process leads the timeline at a time: one serving replica is all there is.
    expected = 1 if implementation == "legacy" else c.replicas
    legacy_note = (f"spec.catalog.replicas is {c.replicas}, but the legacy implementation "
                   "serves a timeline to one process at a time: more replicas add no "
                   "throughput, and one that lost the timeline answers 503 (docs/iceberg.md, "
                   "Replicas); set spec.catalog.replicas: 1, or spec.implementation: "
                   "distributed"
                   if implementation == "legacy" and c.replicas > 1 else "")
    if blocker is not None:
        reason, message = blocker
    elif rejected:
        reason, message = "CatalogRejected", f"the API server refused the catalog: {rejected}"
    elif seen.token_problem is not None:
        reason, message = seen.token_problem
    elif ready >= expected:
        return CatalogOutcome(status, Condition(
            CATALOG_CONDITION, "True", "LegacyServesOneReplica" if legacy_note else "Serving",
            legacy_note or f"{ready} of {c.replicas} replicas ready"))
    else:
        reason = "ReplicasNotReady"
        message = "; ".join(filter(None, [f"{ready} of {expected} replicas ready", legacy_note]))
    return CatalogOutcome(status, Condition(CATALOG_CONDITION, "False", reason, message))


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
        # No lagMs where there is none (a counter, nothing applied yet): a null in a status
        # is kept by one kind of patch and dropped by another, so readers saw it come and go.
        patch["timelines"] = [
            {"name": t.timeline, "readTs": str(t.read_ts), "writeTs": str(t.write_ts),
             **({"lagMs": t.lag_ms} if t.lag_ms is not None else {})}
            for t in st.timelines
        ]
    if outcome.bootstrap:
        patch["bootstrapTimestamp"] = {k: str(v) for k, v in sorted(outcome.bootstrap.items())}
    if outcome.flip_time:
        patch["lastFlipTime"] = outcome.flip_time
    if outcome.catalog is not None:
        patch["catalog"] = outcome.catalog.status  # None removes it (a merge patch)
    if outcome.high_water is not None:
        patch["highWater"] = outcome.high_water.published()
    return patch


# The status fields a pass's patch must find as the pass read them: a pass that published in
# between (a newer generation, a flip) must not be overwritten by an older view.
GUARDED_STATUS = ("observedGeneration", "epoch", "highWater")


def status_expectations(old_status: Mapping[str, Any], resource_version: str) -> dict[str, Any]:
    """What `kube.patch_status` tests (JSON pointer -> value) before it applies a pass's patch.

    A JSON Patch cannot test that a field is absent, so where the pass found one missing (a
    new resource, a status written by an earlier release) it tests the resource's
    resourceVersion instead: any change since the pass read it refuses the patch, and the
    next pass publishes from a fresh read."""
    tests: dict[str, Any] = {f"/status/{k}": old_status[k] for k in GUARDED_STATUS
                             if k in old_status}
    if len(tests) < len(GUARDED_STATUS):
        tests["/metadata/resourceVersion"] = resource_version
    return tests


def conditions(o: Outcome, spec: OracleSpec | None) -> list[Condition]:
    """The CONDITION_TYPES an outcome publishes, in that order, then CatalogReady while
    spec.catalog is enabled."""
    st = o.status
    ready = (o.provisioned and not o.degraded_reason and st is not None and spec is not None
             and st.deployment.implementation == spec.implementation
             and st.deployment.fence == spec.fencing)
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
    ] + _catalog_condition(o, spec)


def _catalog_condition(o: Outcome, spec: OracleSpec | None) -> list[Condition]:
    if o.catalog is not None:
        return [o.catalog.condition] if o.catalog.condition is not None else []
    if spec is None or spec.catalog is None:
        return []
    # The pass stopped before the catalog (the oracle is degraded): it was left as it was.
    return [Condition(CATALOG_CONDITION, "Unknown", o.degraded_reason or "Progressing",
                      "the catalog is reconciled once the oracle is (see Degraded)"
                      if o.degraded_reason else "reconciling")]


def published_catalog_reason(status: Mapping[str, Any]) -> str:
    """The CatalogReady reason `status` carries; "" when it has none."""
    for c in status.get("conditions") or []:
        if c.get("type") == CATALOG_CONDITION:
            return str(c.get("reason") or "")
    return ""


# --- A pass's other decisions: what to look at, what to warn about, when to come back --------


def published_epoch(status: Mapping[str, Any]) -> int:
    return int(status.get("epoch") or 0)


def catalog_watched(spec: OracleSpec, status: Mapping[str, Any]) -> bool:
    """Whether a pass looks at the catalog's objects: enabled, or published (to remove it).
    Resources without a catalog cost no extra request."""
    return spec.catalog is not None or "catalog" in status


def token_to_check(spec: OracleSpec) -> tuple[str, str] | None:
    """The Secret and key of spec.catalog's bearer token, to check it is there; None: none."""
    c = spec.catalog
    return (c.token_secret, c.token_key) if c is not None and c.token_secret else None


def warnings(outcome: Outcome, status: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The Warning Events (reason, message) a pass posts: a reason a person must act on, when
    it is new (the status read did not carry it already)."""
    said = []
    reason = outcome.degraded_reason
    if reason in WARNED_REASONS and published_degraded_reason(status) != reason:
        said.append((reason, outcome.degraded_message))
    cat = outcome.catalog.condition if outcome.catalog is not None else None
    if cat is not None and cat.reason in WARNED_CATALOG_REASONS \
            and published_catalog_reason(status) != cat.reason:
        said.append((cat.reason, cat.message))
    return said


def pass_result(outcome: Outcome, published: bool) -> str:
    """The pass's label in tsoracle_operator_reconciles_total."""
    return "degraded" if outcome.degraded_reason else "ok" if published else "stale"


def next_pass_in(outcome: Outcome, published: bool, spec: OracleSpec | None,
                 retry_s: float, stale_retry_s: float) -> float:
    """Seconds until the next pass: soon after a stale one (kopf's copy of the resource
    catches up through its watch), the retry interval after a failure, else the refresh."""
    if not published:
        return stale_retry_s
    if outcome.degraded_reason or spec is None:
        return retry_s
    return float(spec.refresh_s)


def adoptable_from(found: Deployment | None, owner: Owner) -> str:
    """The owner of `found` to ask about before refusing it: another resource, which may no
    longer exist (deleted while its database could not be reached); "" when there is none."""
    if found is not None and found.owner and found.owner != owner.tag:
        return found.owner
    return ""


def adoption_note(found: Deployment | None, orphaned: str) -> str:
    """What the log says of a schema this pass adopted ("" when it adopted none)."""
    if orphaned:
        return (f"from TimestampOracle {'/'.join(orphaned.split('/')[:2])}, which no longer "
                "exists")
    if found is not None and not found.owner:
        return "(nobody owned it)"
    return ""


# --- Deletion: deletionPolicy, decided like a pass -------------------------------------------

# Set to "true" on a resource being deleted: its deletion finishes without touching the
# database (docs/operator.md, Deletion).
SKIP_CLEANUP = "tsoracle.io/skip-cleanup"


@dataclass(frozen=True)
class DeletionStart:
    """How a deletion begins, from the resource alone. `spec` None: it is over at once, with
    `said` logged (`warned`: and posted as a DeletionSkipped Warning)."""

    spec: OracleSpec | None
    said: str = ""
    warned: bool = False

    @property
    def needs_lease(self) -> bool:
        """Whether only the operator holding the Lease may carry it out: a spec that never
        parsed provisioned nothing, and any operator may let it go."""
        return self.spec is not None or self.warned

    @property
    def what(self) -> str:
        """What deletionPolicy asks: "drop" (Delete) or "release" (Retain)."""
        return "drop" if self.spec is not None and self.spec.deletion_policy == "Delete" \
            else "release"


def deletion_start(spec: Mapping[str, Any], annotations: Mapping[str, Any]) -> DeletionStart:
    try:
        parsed = parse_spec(spec)
    except ConfigError:
        return DeletionStart(None, "deleted; its spec never parsed, so nothing was provisioned")
    if str(annotations.get(SKIP_CLEANUP, "")).lower() == "true":
        return DeletionStart(None, f"clean-up skipped ({SKIP_CLEANUP}=true): schema "
                                   f"{parsed.schema!r} is left as it is; a resource created "
                                   "later with it adopts it", warned=True)
    return DeletionStart(parsed)


@dataclass(frozen=True)
class DeletionStep:
    """What a deletion does to the deployment it found: "drop" or "release" it, "finish" a
    drop cut off half-way (tsoracle's tables without the deployment row), "nothing" (no
    deployment, Retain), or "foreign" (another resource owns it: nothing is touched)."""

    action: str
    other: str = ""  # "foreign": the namespace/name of the owner
    epoch: int = 0  # "drop", "release": the deployment's epoch, for the log


def deletion_step(found: Deployment | None, owner: Owner, what: str) -> DeletionStep:
    if found is None:
        # A drop killed half-way (the deployment row goes last) leaves tsoracle's other
        # tables: finish it. Only tsoracle's tables go, and the schema only if empty.
        return DeletionStep("finish" if what == "drop" else "nothing")
    if found.owner and found.owner != owner.tag:
        # The uid too: the owner may be a resource of this very name, created again.
        ns, name, uid = (found.owner.split("/", 2) + ["", ""])[:3]
        return DeletionStep("foreign", f"{ns}/{name} (uid {uid or '-'})")
    return DeletionStep(what, epoch=found.epoch)


@dataclass(frozen=True)
class DeletionFailure:
    """What a deletion that could not reach or change its schema does: `blocked` waits and
    retries (Degraded, DeletionBlocked); otherwise it is over, with `prefix` + `message`
    logged (`warned`: and `message` posted as a DeletionSkipped Warning)."""

    message: str
    prefix: str = "deleted; "
    warned: bool = False
    blocked: bool = False


def deletion_failure(start: DeletionStart, exc: OracleError, url: str | None,
                     status: Mapping[str, Any], retry_s: float) -> DeletionFailure:
    """Only a Delete of a schema this resource provisioned waits for an unreachable database;
    a Secret gone, unlabelled or unusable never blocks a deletion."""
    schema, what = start.spec.schema if start.spec else "", start.what
    if isinstance(exc, ConfigError):
        return DeletionFailure(f"cannot {what} schema {schema!r}: {redact(str(exc), url)}; "
                               "the tables are kept as they are", "deletion skipped: ",
                               warned=True)
    why = f"{type(exc).__name__}: {redact(str(exc), url)}"
    if not status.get("incarnation"):
        return DeletionFailure(f"it never provisioned schema {schema!r} and its database "
                               f"cannot be reached ({why}): nothing to {what}")
    if what == "release":
        return DeletionFailure(f"schema {schema!r} is kept (deletionPolicy Retain), but its "
                               f"ownership could not be released ({why}); a resource created "
                               "later with it adopts it once this one is gone", warned=True)
    return DeletionFailure(f"cannot drop schema {schema!r} ({why}); deletion waits and retries "
                           f"every {retry_s:.0f} s. To finish it without dropping, set "
                           f"spec.deletionPolicy: Retain, or annotate the resource "
                           f"{SKIP_CLEANUP}=true", "deletion blocked: ", blocked=True)


def warns_at(retry: int) -> bool:
    """Whether a blocked deletion's `retry` (0, 1, 2...) posts its Warning: the 1st, 2nd, 4th,
    8th... attempt, so a long outage does not flood the Events."""
    return (retry + 1) & retry == 0

"""What a reconcile pass does to the backend: take hold of the deployment (`hold`), then carry
out the steps `model.plan` decided (`run`), one short function per step, each telling what it
did (log line, Event, metrics)."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, assert_never

import kopf
from kubernetes.client.exceptions import ApiException

from tsoracle.fencing import (
    IMPLEMENTATIONS,
    Deployment,
    PlannedBy,
    StalePlan,
    count_pass,
    fence_everyone,
    finish_rollout,
    record_generation,
    set_fencing,
    start_flip_clock,
)
from tsoracle.fencing.tables import ADDED_COLUMNS
from tsoracle.operator import catalog, kube, metrics
from tsoracle.operator.logs import describe_api_error
from tsoracle.operator.model import (
    TIME_FORMAT,
    ApplyCatalog,
    DeletionFailure,
    DeletionStart,
    FinishRollout,
    Flip,
    HighWater,
    Outcome,
    Plan,
    PublishFlip,
    RecordGeneration,
    RemoveCatalog,
    SetFencing,
    StartRolloutClock,
    Step,
    adoptable_from,
    adoption_note,
    deletion_step,
    needs_provisioning,
    rewind_targets,
    status_expectations,
    status_patch,
    still_due,
    warns_at,
)
from tsoracle.operator.ownership import Owner, check_ownership
from tsoracle.oracle.advance import advance_timelines, positions
from tsoracle.oracle.flip import flip_backend
from tsoracle.oracle.provision import (
    claim,
    drop_deployment,
    find_deployment,
    provision,
    release,
)
from tsoracle.resource import OracleSpec
from tsoracle.store import Backend, schema

log = logging.getLogger("tsoracle.operator")


def now_text() -> str:
    return dt.datetime.now(dt.UTC).strftime(TIME_FORMAT)


async def hold(backend: Backend, spec: OracleSpec, owner: Owner, old_status: dict[str, Any],
               ref: str, owner_exists: Callable[[str], Awaitable[bool]] | None = None
               ) -> Deployment:
    """The deployment `owner` acts on: provisioned where something is missing, and claimed.
    Raises OwnershipProblem where the schema is not, or no longer, this resource's.

    A schema still owned by a resource that no longer exists (`owner_exists` says so: it was
    deleted while its database could not be reached) is adopted like one nobody owns."""
    found = await find_deployment(backend)
    orphaned = adoptable_from(found, owner)
    if orphaned and owner_exists is not None and not await owner_exists(orphaned):
        found = replace(found, owner="") if found is not None else None
    else:
        orphaned = ""
    check_ownership(found, owner, spec.schema, old_status)
    has_timelines = found is not None and await _has_timelines(backend, spec.timelines)
    if needs_provisioning(found, has_timelines):
        made = await provision(backend, spec.timelines, implementation=spec.implementation,
                               owner=owner.tag)
        if found is None or made.created:
            log.info("%s: provisioned schema %r: implementation %s, epoch %d, timelines "
                     "created %s", ref, spec.schema, made.deployment.implementation,
                     made.deployment.epoch, ", ".join(made.created) or "none")
    dep = await claim(backend, owner.tag, previous=orphaned)
    check_ownership(dep, owner, spec.schema, {})  # another resource seeded it first
    note = adoption_note(found, orphaned)
    if note:
        log.info("%s: adopted schema %r %s: implementation %s, epoch %d", ref, spec.schema,
                 note, dep.implementation, dep.epoch)
    return dep


async def _has_timelines(backend: Backend, timelines: tuple[str, ...]) -> bool:
    rows = await backend.fetch("SELECT DISTINCT timeline FROM {timestamps}")
    return set(timelines) <= {r[0] for r in rows}


async def guard_rewind(backend: Backend, dep: Deployment, by: PlannedBy, mark: HighWater,
                       published_epoch: int, now: dt.datetime, ref: str,
                       body: kopf.Body) -> tuple[Deployment | None, int]:
    """Count this pass in the database, and move a backend that went back in time (restored
    from a backup or to an earlier point) above everything handed out before, fencing every
    process as a flip does. Returns the deployment after a repair (None: no repair) and the
    pass count to publish. Each write is for `by` alone (StalePlan otherwise)."""
    await schema.add_columns(backend, ADDED_COLUMNS)  # a schema from an earlier release
    found = await positions(backend)
    counted, passes = await count_pass(backend, mark.passes + 1, by)
    targets = rewind_targets(mark, found, dep.epoch, published_epoch, counted, now)
    if not targets:
        return None, passes
    moved = await advance_timelines(backend, targets, force=True, by=by)
    after = await fence_everyone(backend, above=published_epoch, by=by)
    metrics.REWINDS.inc()
    said = ", ".join(f"{k} {found.get(k, 0)} -> {r.after}" for k, r in sorted(moved.items()))
    message = (f"the database went back in time (restored?): it counted {counted} operator "
               f"passes of {mark.passes}, epoch {dep.epoch} (published {published_epoch}); "
               f"moved every timeline above what was handed out before ({said}) and fenced "
               f"every process at epoch {after.epoch}")
    log.warning("%s: %s", ref, message)
    kopf.warn(body, reason="BackendRewound", message=message)
    return after, passes


@dataclass
class Pass:
    """What the steps of one pass share: where they act, and what the steps before left."""

    backend: Backend
    body: kopf.Body  # the resource, for its Events
    ref: str  # namespace/name, for the log
    dep: Deployment  # as the backend last returned it
    flipped: bool = False  # a flip was published (Event posted)
    # The backend refused a step's planner (a newer generation applied, or another owner):
    # the pass stops, doing nothing more.
    stale: bool = False
    bootstrap: dict[str, int] = field(default_factory=dict)  # ... from that flip
    flip_time: str = ""
    catalog_applied: catalog.SeenObject | None = None  # the catalog's Deployment, as applied
    catalog_rejected: str = ""  # why the API server refused to apply it


async def run(todo: Plan, p: Pass) -> Pass:
    """Carry out the plan's steps in order, each only while it is still due, and none once
    the pass turned out stale."""
    for step in todo.steps:
        if p.stale:
            break
        if still_due(step, p.dep, p.flipped):
            try:
                await _perform(step, p)
            except StalePlan as exc:
                p.stale = True
                log.info("%s: %s not applied, and the pass stops: %s; the next pass plans "
                         "again", p.ref, _described(step), exc)
    return p


def _described(step: Step) -> str:
    match step:
        case SetFencing():
            return f"fencing {step.mode}"
        case Flip():
            return f"flip to {step.to}"
        case FinishRollout():
            return "end of the rollout window"
        case StartRolloutClock():
            return "start of the rollout window's clock"
        case _:
            return "pass"


async def _perform(step: Step, p: Pass) -> None:
    match step:
        case RecordGeneration():
            await _record_generation(step, p)
        case SetFencing():
            await _set_fencing(step, p)
        case Flip():
            await _flip(step, p)
        case PublishFlip():
            await _publish_flip(step, p)
        case FinishRollout():
            await _finish_rollout(step, p)
        case StartRolloutClock():
            await _start_rollout_clock(step, p)
        case ApplyCatalog():
            await _apply_catalog(step, p)
        case RemoveCatalog():
            await _remove_catalog(step, p)
        case _:
            assert_never(step)


async def _record_generation(step: RecordGeneration, p: Pass) -> None:
    p.dep = await record_generation(p.backend, step.by)


async def _set_fencing(step: SetFencing, p: Pass) -> None:
    before = p.dep.fence
    p.dep = await set_fencing(p.backend, step.mode, by=step.by)
    if p.dep.fence != before:
        log.info("%s: fencing %s -> %s (epoch %d)", p.ref, before, p.dep.fence, p.dep.epoch)


async def _flip(step: Flip, p: Pass) -> None:
    log.info("%s: flip started: %s -> %s, epoch %d (generation %d)", p.ref,
             p.dep.implementation, step.to, p.dep.epoch, step.by.generation)
    t0 = time.perf_counter()
    flipped = await flip_backend(p.backend, step.to, by=step.by)
    if flipped.changed:
        took = time.perf_counter() - t0
        metrics.FLIP_SECONDS.observe(took)
        metrics.FLIPS.labels(step.to).inc()
        log.info("%s: flip finished: %s -> %s, epoch %d -> %d in %.0f ms; bootstrap %s",
                 p.ref, flipped.previous, flipped.implementation, p.dep.epoch, flipped.epoch,
                 took * 1000, _bootstrap_text(flipped.bootstrap))
        _published(p, flipped.previous, flipped.implementation, flipped.epoch,
                   flipped.bootstrap)
    else:
        log.info("%s: flip to %s changed nothing: %s is active at epoch %d", p.ref,
                 step.to, flipped.implementation, flipped.epoch)


async def _publish_flip(step: PublishFlip, p: Pass) -> None:
    # A flip to the active implementation changes nothing and reports its position.
    position = await flip_backend(p.backend, p.dep.implementation)
    previous = next(i for i in IMPLEMENTATIONS if i != p.dep.implementation)
    log.info("%s: flip finished: %s -> %s, epoch %s -> %d (committed by an earlier "
             "pass, published now); bootstrap %s", p.ref, previous, p.dep.implementation,
             step.published_epoch, p.dep.epoch, _bootstrap_text(position.bootstrap))
    _published(p, previous, p.dep.implementation, p.dep.epoch, position.bootstrap)


async def _finish_rollout(step: FinishRollout, p: Pass) -> None:
    p.dep = await finish_rollout(p.backend, by=step.by, epoch=step.epoch)
    if p.dep.epoch != step.epoch:
        log.info("%s: rollout window of epoch %d not ended: a flip since moved the epoch to "
                 "%d, whose window runs on", p.ref, step.epoch, p.dep.epoch)
    else:
        log.info("%s: rollout window over: only the inactive implementation is fenced now",
                 p.ref)


async def _start_rollout_clock(step: StartRolloutClock, p: Pass) -> None:
    at_ms = int(step.at.timestamp() * 1000)
    if await start_flip_clock(p.backend, step.epoch, at_ms, step.by):
        log.info("%s: nothing usable recorded when the rollout window of epoch %d opened (a "
                 "schema from an earlier release, a repair moved the epoch, or a time ahead "
                 "of this operator's clock): it runs from now", p.ref, step.epoch)


# The API server's answers that a retry of the same objects will not change.
_REFUSALS = (400, 403, 404, 422)


async def _apply_catalog(step: ApplyCatalog, p: Pass) -> None:
    want = step.desired
    meta, spec = want.deployment["metadata"], want.deployment["spec"]
    try:
        p.catalog_applied = await kube.apply_catalog(want)
    except ApiException as exc:
        if exc.status not in _REFUSALS:
            raise  # the API server is unwell: the pass is retried
        p.catalog_rejected = describe_api_error(exc)
        log.warning("%s: catalog not applied: %s", p.ref, p.catalog_rejected)
        return
    log.info("%s: catalog applied: Deployment and Service %s, %d replicas (digest %s)",
             p.ref, meta["name"], spec["replicas"], want.digest)


async def _remove_catalog(step: RemoveCatalog, p: Pass) -> None:
    await kube.delete_catalog(step.namespace, step.name, deployment=step.deployment,
                              service=step.service)
    log.info("%s: catalog removed (spec.catalog disabled): Deployment and Service %s", p.ref,
             step.name)


def _published(p: Pass, previous: str, to: str, epoch: int, bootstrap: dict[str, int]) -> None:
    p.flipped, p.bootstrap, p.flip_time = True, bootstrap, now_text()
    kopf.info(p.body, reason="Flipped", message=f"implementation {previous} -> {to}, epoch "
                                                f"{epoch}; bootstrap {_bootstrap_text(bootstrap)}")


def _bootstrap_text(bootstrap: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(bootstrap.items()))


# --- Deletion (model.deletion_start, deletion_step, deletion_failure decide) -----------------


def deletion_over(body: kopf.Body, ref: str, start: DeletionStart) -> None:
    """A deletion over before it reached the database."""
    if start.warned:
        log.warning("%s: deleted; %s", ref, start.said)
        kopf.warn(body, reason="DeletionSkipped", message=start.said)
    else:
        log.info("%s: %s", ref, start.said)


async def drop_or_release(backend: Backend, start: DeletionStart, owner: Owner,
                          body: kopf.Body, ref: str) -> None:
    """What deletionPolicy asks, to the deployment in the schema, if this resource owns it."""
    assert start.spec is not None
    schema_name = start.spec.schema
    step = deletion_step(await find_deployment(backend), owner, start.what)
    match step.action:
        case "finish" | "drop":
            also = " and the schema" if await drop_deployment(backend) else ""
            if step.action == "finish":
                log.info("%s: deleted; schema %r holds no tsoracle deployment; dropped what "
                         "was left of tsoracle's tables%s", ref, schema_name, also)
                return
            log.info("%s: deleted; dropped tsoracle's tables in schema %r%s (deletionPolicy "
                     "Delete, epoch %d)", ref, schema_name, also, step.epoch)
            kopf.info(body, reason="Dropped",
                      message=f"dropped tsoracle's tables in schema {schema_name!r}")
        case "release":
            await release(backend, owner.tag)
            log.info("%s: deleted; retained schema %r at epoch %d, ownership released "
                     "(deletionPolicy Retain)", ref, schema_name, step.epoch)
        case "foreign":
            log.warning("%s: deletion skipped: schema %r belongs to TimestampOracle %s; "
                        "nothing was dropped or released", ref, schema_name, step.other)
            kopf.warn(body, reason="DeletionSkipped",
                      message=f"schema {schema_name!r} belongs to another TimestampOracle; "
                              "nothing was dropped or released")
        case _:
            log.info("%s: deleted; schema %r holds no tsoracle deployment, nothing to %s",
                     ref, schema_name, start.what)


async def deletion_failed(failure: DeletionFailure, namespace: str, name: str,
                          body: kopf.Body, memo: kopf.Memo, retry: int) -> None:
    """Tell a deletion that could not reach or change its schema. A blocked one: the log
    once, a Warning Event at a backoff (`warns_at`), the failure metric and status every
    attempt."""
    ref = f"{namespace}/{name}"
    if not failure.blocked:
        log.log(logging.WARNING if failure.warned else logging.INFO, "%s: %s%s", ref,
                failure.prefix, failure.message)
        if failure.warned:
            kopf.warn(body, reason="DeletionSkipped", message=failure.message)
        return
    if memo.get("deletion_blocked") != failure.message:  # once, not every retry
        log.warning("%s: %s%s", ref, failure.prefix, failure.message)
        memo["deletion_blocked"] = failure.message
    if warns_at(retry):
        kopf.warn(body, reason="DeletionBlocked", message=failure.message)
    metrics.FAILURES.labels("DeletionBlocked").inc()
    outcome = Outcome(degraded_reason="DeletionBlocked", degraded_message=failure.message)
    read = dict(body.get("status") or {})
    await kube.patch_status(namespace, name, status_patch(
        outcome, None, read, int(body.meta.get("generation") or 0), now_text()),
        expect=status_expectations(read, str(body.meta.get("resourceVersion") or "")),
        present=tuple(read))

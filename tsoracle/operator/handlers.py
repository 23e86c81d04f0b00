"""kopf handlers: thin. Each TimestampOracle gets one reconcile loop (a kopf daemon).

A loop per object, rather than create/update handlers that raise to retry, because every pass
must end by writing the truth into status, including when the backend is down; the loop also
refreshes per-timeline status on a timer and ends rollout windows.

A pass reads what is (`_act`, up to `execute.hold`), `model.plan` decides once, `execute.run`
carries the plan out, and `_publish` writes status, metrics and Events.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, cast

import kopf
import urllib3
from kubernetes.client.exceptions import ApiException

from tsoracle.errors import ConfigError, OracleError
from tsoracle.fencing import PlannedBy, StalePlan, read_flip_clock
from tsoracle.operator import catalog, execute, logs, metrics
from tsoracle.operator.backends import SharedBackends
from tsoracle.operator.kube import (
    owner_exists,
    patch_status,
    read_catalog,
    read_secret_text,
    read_secret_url,
    token_problem,
    wait_until_served,
)
from tsoracle.operator.lease import LeaderLease
from tsoracle.operator.model import (
    WARNED_CATALOG_REASONS,
    WARNED_REASONS,
    CatalogObservation,
    HighWater,
    Observation,
    Outcome,
    catalog_outcome,
    degraded,
    plan,
    published_catalog_reason,
    published_degraded_reason,
    status_expectations,
    status_patch,
)
from tsoracle.operator.ownership import Owner
from tsoracle.operator.redact import redact
from tsoracle.operator.settings import OperatorSettings, from_environment
from tsoracle.oracle.advance import positions
from tsoracle.oracle.api import wall_clock_ms
from tsoracle.oracle.provision import drop_deployment, find_deployment, release
from tsoracle.oracle.status import read_status
from tsoracle.resource import GROUP, PLURAL, VERSION, OracleSpec, parse_spec, resource_url
from tsoracle.store import Backend

log = logging.getLogger("tsoracle.operator")
# The next pass after a stale one: kopf's copy of the resource catches up through its watch.
STALE_RETRY_S = 1.0


@dataclass
class Runtime:
    """What lives as long as the operator: its settings, the shared backends, the Lease.
    Made at start-up, kept in kopf's memo (every object's memo is a copy of it)."""

    settings: OperatorSettings
    backends: SharedBackends
    lease: LeaderLease | None = None  # None: this operator runs alone

    def standing_by(self) -> bool:
        """Another operator holds the Lease (or may still): act on nothing."""
        return self.lease is not None and not self.lease.held()


def runtime(memo: kopf.Memo) -> Runtime:
    return cast(Runtime, memo["runtime"])


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # `tsoracle operator` hands its settings over; `kopf run -m tsoracle.operator` has none.
    ours: OperatorSettings = memo.get("settings") or from_environment()
    _configure_kopf(settings, ours)
    logs.install(verbose=logging.getLogger().getEffectiveLevel() <= logging.DEBUG)
    await wait_until_served([n for n in ours.namespaces if n])
    lease = None
    if ours.lease_namespace:
        lease = LeaderLease(ours.lease_namespace, ours.lease_name, owner=ours.lease_owner)
        lease.start()
    memo["runtime"] = Runtime(ours, SharedBackends(ours.pool_size), lease)


def _configure_kopf(settings: kopf.OperatorSettings, ours: OperatorSettings) -> None:
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    # Our resources are known in advance: skip kopf's cluster scan of CRDs and namespaces, which
    # would need cluster-wide list/watch rights the operator has no other use for.
    settings.scanning.disabled = True
    # Without these a silently stalled watch stream never delivers another event.
    settings.watching.server_timeout = ours.watch.server_s
    settings.watching.client_timeout = ours.watch.client_s
    settings.watching.connect_timeout = ours.watch.connect_s
    # kopf's own patches and Events: a call on a silenced connection must not hold up the
    # object's later events for kopf's default 5 minutes.
    settings.networking.request_timeout = 60
    settings.networking.connect_timeout = ours.watch.connect_s
    # INFO: kopf.info() (our Flipped and Dropped Events) posts nothing below this level. kopf's
    # own INFO chatter is not posted either: logs.install() stops it at its logger.
    settings.posting.level = logging.INFO
    settings.posting.reporting_component = "tsoracle-operator"


@kopf.on.cleanup()
async def shut_down(memo: kopf.Memo, **_: Any) -> None:
    rt = memo.get("runtime")
    if rt is None:  # start-up never finished
        return
    if rt.lease is not None:
        await rt.lease.stop()  # releases the lease, so a successor starts at once
    await rt.backends.close()


def _namespaced(namespace: str | None) -> str:
    # kopf types handlers for cluster-scoped resources too; ours is namespaced (crds/).
    if namespace is None:
        raise kopf.PermanentError("a TimestampOracle without a namespace: is the CRD installed "
                                  "from crds/ (scope: Namespaced)?")
    return namespace


def _jitter(delay: float) -> float:
    # Resources created together would otherwise refresh in lock-step forever.
    return delay * random.uniform(0.9, 1.1)


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10)
async def reconcile_loop(name: str, namespace: str | None, body: kopf.Body, memo: kopf.Memo,
                         stopped: kopf.DaemonStopped, **_: Any) -> None:
    namespace = _namespaced(namespace)
    rt = runtime(memo)
    wake = memo.setdefault("wake", asyncio.Event())
    story = logs.Story(f"{namespace}/{name}")
    metrics.MANAGED.inc()
    try:
        while not stopped:
            wake.clear()
            if rt.lease is not None and not rt.lease.held():
                await _until(rt.lease.wait_held(), stopped)
                continue
            delay = await _reconcile_or_retry(name, namespace, body, rt, story)
            # Sleep until the refresh is due, the spec changes, or kopf stops the daemon.
            await _until(wake.wait(), stopped, timeout=_jitter(delay))
    finally:
        metrics.MANAGED.dec()
        await rt.backends.forget(story.ref)


async def _reconcile_or_retry(name: str, namespace: str, body: kopf.Body, rt: Runtime,
                              story: logs.Story) -> float:
    try:
        delay = await reconcile_once(name, namespace, body, rt, story=story)
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
        # The API server restarting or overloaded: try again soon, inside this loop, rather
        # than let kopf restart the daemon after its own (long) backoff. Told once per
        # outage, not every retry.
        if not story.api_failing:
            log.warning("%s: Kubernetes API call failed (%s); retrying every %.0f s",
                        story.ref, logs.describe_api_error(exc), rt.settings.retry_s)
        story.api_failing = True
        metrics.RECONCILES.labels("api_error").inc()
        return rt.settings.retry_s
    if story.api_failing:
        log.info("%s: Kubernetes API calls succeed again", story.ref)
    story.api_failing = False
    return delay


async def _until(awaitable: Any, stopped: kopf.DaemonStopped,
                 timeout: float | None = None) -> None:
    waiters = [asyncio.ensure_future(awaitable), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def spec_changed(memo: kopf.Memo, **_: Any) -> None:
    """Wake the object's loop at once instead of at its next refresh."""
    wake = memo.get("wake")
    if wake is not None:
        wake.set()


@dataclass
class _Reading:
    """One pass's view of its resource, read once at its start (kopf updates `body` as events
    arrive); `spec` and `url` are filled as the pass gets to them: a failure is told by how
    far it got (InvalidSpec before the URL, BadURL after)."""

    namespace: str
    name: str
    body: kopf.Body
    generation: int
    old_status: dict[str, Any]
    resource_version: str
    spec: OracleSpec | None = None
    url: str | None = None

    @classmethod
    def of(cls, namespace: str, name: str, body: kopf.Body) -> _Reading:
        return cls(namespace, name, body, int(body.meta.get("generation") or 0),
                   dict(body.get("status") or {}), str(body.meta.get("resourceVersion") or ""))

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


async def reconcile_once(name: str, namespace: str, body: kopf.Body, rt: Runtime,
                         story: logs.Story | None = None) -> float:
    """One pass: take hold of the deployment, carry out the plan, publish status. `story`
    remembers what was logged across passes. Returns the seconds until the next pass."""
    story = story or logs.Story(f"{namespace}/{name}")
    started = time.perf_counter()
    seen = _Reading.of(namespace, name, body)
    outcome = Outcome()
    try:
        await _act(seen, rt, outcome)
    except OracleError as exc:
        outcome.degraded_reason, outcome.degraded_message = degraded(exc, seen.url)
    published = not outcome.stale and await _publish(seen, outcome, story)
    metrics.RECONCILES.labels("degraded" if outcome.degraded_reason
                              else "ok" if published else "stale").inc()
    metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)
    if not published:
        return STALE_RETRY_S
    if outcome.degraded_reason or seen.spec is None:
        return rt.settings.retry_s
    return float(seen.spec.refresh_s)


async def _act(seen: _Reading, rt: Runtime, outcome: Outcome) -> None:
    seen.spec = spec = parse_spec(seen.body.get("spec") or {})
    stored = await read_secret_text(seen.namespace, spec.secret_name, spec.secret_key)
    seen.url = stored.strip()
    seen.url = resource_url(seen.url, spec.schema)  # a mismatch is a BadURL, not an InvalidSpec
    backend = await rt.backends.get(seen.ref, seen.url)
    owner = Owner(seen.namespace, seen.name, str(seen.body.meta.get("uid") or ""))
    dep = await execute.hold(backend, spec, owner, seen.old_status, seen.ref, owner_exists)
    outcome.provisioned = True
    now = dt.datetime.now(dt.UTC)
    mark = HighWater.of(seen.old_status)
    try:
        repaired, passes = await execute.guard_rewind(
            backend, dep, PlannedBy(dep.owner, seen.generation), mark,
            int(seen.old_status.get("epoch") or 0), now, seen.ref, seen.body)
    except StalePlan as exc:
        log.info("%s: pass stopped before its restore check: %s; the next pass plans again",
                 seen.ref, exc)
        outcome.stale = True
        return
    dep = repaired or dep
    cat = await _observe_catalog(seen, spec, owner, stored, rt.settings.catalog_image)
    todo = plan(Observation(spec, dep, seen.old_status, seen.generation, now, cat,
                            await read_flip_clock(backend)))
    done = await execute.run(todo, execute.Pass(backend, seen.body, seen.ref, dep))
    if todo.stale or done.stale:
        if todo.stale:
            log.info("%s: pass skipped: it read generation %d, and the backend already applied "
                     "generation %d; the next pass acts on the newer one", seen.ref,
                     seen.generation, dep.generation)
        outcome.stale = True
        return
    outcome.bootstrap, outcome.flip_time = done.bootstrap, done.flip_time
    outcome.status = await read_status(backend, wall_clock_ms)
    found = await positions(backend)
    outcome.high_water = (mark.restarted(found, now) if repaired
                          else mark.after(found, now)).counted(passes)
    outcome.rollout = outcome.status.deployment.rollout
    outcome.catalog = catalog_outcome(spec, cat, done.catalog_applied, done.catalog_rejected,
                                      outcome.status.deployment.implementation)


async def _observe_catalog(seen: _Reading, spec: OracleSpec, owner: Owner, stored: str,
                           image: str) -> CatalogObservation | None:
    """What the plan needs of the catalog; None when there is none to look at (disabled, and
    none published: resources without a catalog cost no extra request)."""
    if spec.catalog is None and "catalog" not in seen.old_status:
        return None
    found = await read_catalog(seen.namespace, catalog.name_of(owner))
    problem = None
    if spec.catalog is not None and spec.catalog.token_secret:
        problem = await token_problem(seen.namespace, spec.catalog.token_secret,
                                      spec.catalog.token_key)
    return CatalogObservation(owner, found, image, catalog.url_suffix(stored, spec.schema),
                              problem)


async def _publish(seen: _Reading, outcome: Outcome, story: logs.Story) -> bool:
    """Tell the outcome: the log (once per change), metrics, a Warning Event for a reason a
    person must act on, and status. Returns False when the status moved since the pass read
    it (another pass published): this pass's view is older, and is not published."""
    before = published_degraded_reason(seen.old_status)
    reason = outcome.degraded_reason
    story.degraded_now(log, reason, outcome.degraded_message, before)
    if reason:
        metrics.FAILURES.labels(reason).inc()
        if reason in WARNED_REASONS and before != reason:
            kopf.warn(seen.body, reason=reason, message=outcome.degraded_message)
    if outcome.catalog is not None and outcome.catalog.condition is not None:
        said = outcome.catalog.condition
        if said.reason in WARNED_CATALOG_REASONS \
                and published_catalog_reason(seen.old_status) != said.reason:
            kopf.warn(seen.body, reason=said.reason, message=said.message)
    metrics.ROLLOUT.labels(seen.namespace, seen.name).set(1 if outcome.rollout else 0)
    applied = await patch_status(
        seen.namespace, seen.name,
        status_patch(outcome, seen.spec, seen.old_status, seen.generation, execute.now_text()),
        expect=status_expectations(seen.old_status, seen.resource_version),
        present=tuple(seen.old_status))
    if not applied:
        log.info("%s: status not published: another pass published since this one read "
                 "it; the next pass reads the newer one", seen.ref)
    return applied


# Set to "true" on a resource being deleted: its deletion finishes without touching the
# database (docs/operator.md, Deletion).
SKIP_CLEANUP = "tsoracle.io/skip-cleanup"


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def deleted(name: str, namespace: str | None, spec: kopf.Spec, meta: kopf.Meta,
                  body: kopf.Body, memo: kopf.Memo, retry: int = 0, **_: Any) -> None:
    """Honour deletionPolicy for what this resource owns: Delete drops tsoracle's tables,
    Retain gives up ownership so that a new resource may adopt them. Nothing else is touched.
    Only a Delete of a schema this resource provisioned waits for an unreachable database, and
    the SKIP_CLEANUP annotation ends even that wait."""
    namespace = _namespaced(namespace)
    rt, ref = runtime(memo), f"{namespace}/{name}"
    try:
        parsed = parse_spec(spec)
    except ConfigError:
        log.info("%s: deleted; its spec never parsed, so nothing was provisioned", ref)
        return
    if rt.standing_by():
        if not memo.get("deletion_waits_for_lease"):
            log.info("%s: deletion waits for the operator holding the lease", ref)
            memo["deletion_waits_for_lease"] = True
        raise kopf.TemporaryError("another operator holds the lease", delay=rt.settings.retry_s)
    if str((meta.get("annotations") or {}).get(SKIP_CLEANUP, "")).lower() == "true":
        message = (f"clean-up skipped ({SKIP_CLEANUP}=true): schema {parsed.schema!r} is left "
                   "as it is; a resource created later with it adopts it")
        log.warning("%s: deleted; %s", ref, message)
        kopf.warn(body, reason="DeletionSkipped", message=message)
        return
    owner = Owner(namespace, name, str(meta.get("uid") or ""))
    what = "drop" if parsed.deletion_policy == "Delete" else "release"
    url = None
    try:
        url = resource_url(await read_secret_url(namespace, parsed.secret_name,
                                                parsed.secret_key), parsed.schema)
        backend = await rt.backends.get(ref, url)
        await _drop_or_release(backend, parsed, owner, body, ref, what)
    except ConfigError as exc:  # Secret gone, unlabelled or unusable: never block deletion
        message = (f"cannot {what} schema {parsed.schema!r}: {redact(str(exc), url)}; "
                   "the tables are kept as they are")
        log.warning("%s: deletion skipped: %s", ref, message)
        kopf.warn(body, reason="DeletionSkipped", message=message)
    except OracleError as exc:
        why = f"{type(exc).__name__}: {redact(str(exc), url)}"
        if not (body.get("status") or {}).get("incarnation"):
            log.info("%s: deleted; it never provisioned schema %r and its database cannot be "
                     "reached (%s): nothing to %s", ref, parsed.schema, why, what)
            return
        if what == "release":
            message = (f"schema {parsed.schema!r} is kept (deletionPolicy Retain), but its "
                       f"ownership could not be released ({why}); a resource created later "
                       "with it adopts it once this one is gone")
            log.warning("%s: deleted; %s", ref, message)
            kopf.warn(body, reason="DeletionSkipped", message=message)
            return
        message = (f"cannot drop schema {parsed.schema!r} ({why}); deletion waits and retries "
                   f"every {rt.settings.retry_s:.0f} s. To finish it without dropping, set "
                   f"spec.deletionPolicy: Retain, or annotate the resource {SKIP_CLEANUP}=true")
        await _deletion_blocked(namespace, name, body, memo, message, retry)
        raise kopf.TemporaryError(f"{what} failed; retrying", delay=rt.settings.retry_s) \
            from None
    finally:
        await rt.backends.forget(ref)


async def _drop_or_release(backend: Backend, spec: OracleSpec, owner: Owner, body: kopf.Body,
                           ref: str, what: str) -> None:
    """`what` ("drop" or "release") to the deployment in the schema, if this resource owns it."""
    found = await find_deployment(backend)
    if found is None:
        if what == "drop":
            # A drop killed half-way (the deployment row goes last) leaves tsoracle's other
            # tables: finish it. Only tsoracle's tables go, and the schema only if empty.
            schema_gone = await drop_deployment(backend)
            log.info("%s: deleted; schema %r holds no tsoracle deployment; dropped what was "
                     "left of tsoracle's tables%s", ref, spec.schema,
                     " and the schema" if schema_gone else "")
            return
        log.info("%s: deleted; schema %r holds no tsoracle deployment, nothing to %s",
                 ref, spec.schema, what)
        return
    if found.owner and found.owner != owner.tag:
        other = "/".join(found.owner.split("/")[:2])
        log.warning("%s: deletion skipped: schema %r belongs to TimestampOracle %s; "
                    "nothing was dropped or released", ref, spec.schema, other)
        kopf.warn(body, reason="DeletionSkipped",
                  message=f"schema {spec.schema!r} belongs to another TimestampOracle; "
                          "nothing was dropped or released")
        return
    if what == "drop":
        schema_gone = await drop_deployment(backend)
        log.info("%s: deleted; dropped tsoracle's tables in schema %r%s (deletionPolicy "
                 "Delete, epoch %d)", ref, spec.schema,
                 " and the schema" if schema_gone else "", found.epoch)
        kopf.info(body, reason="Dropped", message=f"dropped tsoracle's tables in schema "
                                                  f"{spec.schema!r}")
    else:
        await release(backend, owner.tag)
        log.info("%s: deleted; retained schema %r at epoch %d, ownership released "
                 "(deletionPolicy Retain)", ref, spec.schema, found.epoch)


async def _deletion_blocked(namespace: str, name: str, body: kopf.Body, memo: kopf.Memo,
                            message: str, retry: int) -> None:
    """Tell a deletion the backend refused: the log once, a Warning Event at a backoff (the
    1st, 2nd, 4th, 8th… attempt), the failure metric and status every attempt."""
    if memo.get("deletion_blocked") != message:  # once, not every retry
        log.warning("%s/%s: deletion blocked: %s", namespace, name, message)
        memo["deletion_blocked"] = message
    if (retry + 1) & retry == 0:
        kopf.warn(body, reason="DeletionBlocked", message=message)
    metrics.FAILURES.labels("DeletionBlocked").inc()
    outcome = Outcome(degraded_reason="DeletionBlocked", degraded_message=message)
    read = dict(body.get("status") or {})
    await patch_status(namespace, name, status_patch(
        outcome, None, read, int(body.meta.get("generation") or 0), execute.now_text()),
        expect=status_expectations(read, str(body.meta.get("resourceVersion") or "")),
        present=tuple(read))

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

from tsoracle.errors import OracleError
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
    CatalogObservation,
    HighWater,
    Observation,
    Outcome,
    catalog_outcome,
    catalog_watched,
    degraded,
    deletion_failure,
    deletion_start,
    next_pass_in,
    pass_result,
    plan,
    published_degraded_reason,
    published_epoch,
    status_expectations,
    status_patch,
    token_to_check,
    warnings,
)
from tsoracle.operator.ownership import Owner
from tsoracle.operator.settings import OperatorSettings, from_environment
from tsoracle.oracle.advance import positions
from tsoracle.oracle.api import wall_clock_ms
from tsoracle.oracle.status import read_status
from tsoracle.resource import GROUP, PLURAL, VERSION, OracleSpec, parse_spec, resource_url

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


def _user(namespace: str, name: str, body: kopf.Body) -> str:
    """Who uses a shared backend: the resource with its uid, since one deleted and created
    again under its name while the old one's daemon winds down is another user."""
    return Owner(namespace, name, str(body.meta.get("uid") or "")).tag


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
        await rt.backends.forget(_user(namespace, name, body))


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
    except StalePlan as exc:
        log.info("%s: pass stopped: %s; the next pass plans again", seen.ref, exc)
        outcome.stale = True
    except OracleError as exc:
        outcome.degraded_reason, outcome.degraded_message = degraded(exc, seen.url)
    published = not outcome.stale and await _publish(seen, outcome, story)
    metrics.RECONCILES.labels(pass_result(outcome, published)).inc()
    metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)
    return next_pass_in(outcome, published, seen.spec, rt.settings.retry_s, STALE_RETRY_S)


async def _act(seen: _Reading, rt: Runtime, outcome: Outcome) -> None:
    """Read, plan, carry out; what the pass learned goes into `outcome`. StalePlan: a guard
    found this pass out of date."""
    seen.spec = spec = parse_spec(seen.body.get("spec") or {})
    stored = await read_secret_text(seen.namespace, spec.secret_name, spec.secret_key)
    seen.url = stored.strip()
    seen.url = resource_url(seen.url, spec.schema)  # a mismatch is a BadURL, not an InvalidSpec
    backend = await rt.backends.get(_user(seen.namespace, seen.name, seen.body), seen.url)
    owner = Owner(seen.namespace, seen.name, str(seen.body.meta.get("uid") or ""))
    dep = await execute.hold(backend, spec, owner, seen.old_status, seen.ref, owner_exists)
    outcome.provisioned = True
    now = dt.datetime.now(dt.UTC)
    mark = HighWater.of(seen.old_status)
    repaired, passes = await execute.guard_rewind(
        backend, dep, PlannedBy(dep.owner, seen.generation), mark,
        published_epoch(seen.old_status), now, seen.ref, seen.body)
    dep = repaired or dep
    cat = await _observe_catalog(seen, spec, owner, stored, rt.settings.catalog_image)
    todo = plan(Observation(spec, dep, seen.old_status, seen.generation, now, cat,
                            await read_flip_clock(backend)))
    done = await execute.run(todo, execute.Pass(backend, seen.body, seen.ref, dep))
    if todo.stale or done.stale:
        outcome.stale = True
        return
    outcome.bootstrap, outcome.flip_time = done.bootstrap, done.flip_time
    outcome.status = await read_status(backend, wall_clock_ms)
    outcome.high_water = mark.next(await positions(backend), now, repaired=repaired is not None,
                                   passes=passes)
    outcome.rollout = outcome.status.deployment.rollout
    outcome.catalog = catalog_outcome(spec, cat, done.catalog_applied, done.catalog_rejected,
                                      outcome.status.deployment.implementation)


async def _observe_catalog(seen: _Reading, spec: OracleSpec, owner: Owner, stored: str,
                           image: str) -> CatalogObservation | None:
    """What the plan needs of the catalog; None when there is none to look at
    (`model.catalog_watched`)."""
    if not catalog_watched(spec, seen.old_status):
        return None
    found = await read_catalog(seen.namespace, catalog.name_of(owner))
    token = token_to_check(spec)
    problem = await token_problem(seen.namespace, *token) if token is not None else None
    return CatalogObservation(owner, found, image, catalog.url_suffix(stored, spec.schema),
                              problem)


async def _publish(seen: _Reading, outcome: Outcome, story: logs.Story) -> bool:
    """Tell the outcome: the log (once per change), metrics, a Warning Event for a reason a
    person must act on, and status. Returns False when the status moved since the pass read
    it (another pass published): this pass's view is older, and is not published."""
    story.degraded_now(log, outcome.degraded_reason, outcome.degraded_message,
                       published_degraded_reason(seen.old_status))
    if outcome.degraded_reason:
        metrics.FAILURES.labels(outcome.degraded_reason).inc()
    for reason, message in warnings(outcome, seen.old_status):
        kopf.warn(seen.body, reason=reason, message=message)
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


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def deleted(name: str, namespace: str | None, spec: kopf.Spec, meta: kopf.Meta,
                  body: kopf.Body, memo: kopf.Memo, retry: int = 0, **_: Any) -> None:
    """Honour deletionPolicy for what this resource owns (model.deletion_start,
    deletion_step and deletion_failure decide; execute carries it out)."""
    namespace = _namespaced(namespace)
    rt, ref = runtime(memo), f"{namespace}/{name}"
    start = deletion_start(spec, meta.get("annotations") or {})
    if start.needs_lease and rt.standing_by():
        if not memo.get("deletion_waits_for_lease"):
            log.info("%s: deletion waits for the operator holding the lease", ref)
            memo["deletion_waits_for_lease"] = True
        raise kopf.TemporaryError("another operator holds the lease", delay=rt.settings.retry_s)
    if start.spec is None:
        execute.deletion_over(body, ref, start)
        return
    owner = Owner(namespace, name, str(meta.get("uid") or ""))
    url = None
    try:
        url = resource_url(await read_secret_url(namespace, start.spec.secret_name,
                                                start.spec.secret_key), start.spec.schema)
        backend = await rt.backends.get(owner.tag, url)
        await execute.drop_or_release(backend, start, owner, body, ref)
    except OracleError as exc:
        failure = deletion_failure(start, exc, url, body.get("status") or {},
                                   rt.settings.retry_s)
        await execute.deletion_failed(failure, namespace, name, body, memo, retry)
        if failure.blocked:
            raise kopf.TemporaryError(f"{start.what} failed; retrying",
                                      delay=rt.settings.retry_s) from None
    finally:
        await rt.backends.forget(_user(namespace, name, body))

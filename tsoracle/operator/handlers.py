"""kopf handlers: thin. Each TimestampOracle gets one reconcile loop (a kopf daemon).

A loop per object, rather than create/update handlers that raise to retry, because every pass
must end by writing the truth into status, including when the backend is down; the loop also
refreshes per-timeline status on a timer and ends rollout windows.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import random
import time
from typing import Any

import kopf
import urllib3
from kubernetes.client.exceptions import ApiException

from tsoracle.errors import ConfigError, OracleError, OracleUnavailable
from tsoracle.fencing import IMPLEMENTATIONS, finish_rollout, set_fencing
from tsoracle.operator import logs, metrics
from tsoracle.operator.kube import patch_status, read_secret_url, wait_until_served
from tsoracle.operator.lease import LeaderLease
from tsoracle.operator.model import (
    TIME_FORMAT,
    Observation,
    needs_provisioning,
    plan,
    status_patch,
)
from tsoracle.operator.ownership import Owner, OwnershipProblem, check_ownership
from tsoracle.operator.redact import redact, redact_addresses
from tsoracle.oracle.api import wall_clock_ms
from tsoracle.oracle.connect import open_instrumented_backend
from tsoracle.oracle.flip import flip_backend
from tsoracle.oracle.provision import (
    claim,
    drop_deployment,
    find_deployment,
    provision,
    release,
)
from tsoracle.oracle.status import read_status
from tsoracle.resource import (
    GROUP,
    PLURAL,
    VERSION,
    OracleSpec,
    SecretProblem,
    parse_spec,
    resource_url,
)
from tsoracle.store import Backend, parse_url

RETRY_SECONDS = 5.0
LEASE_NAMESPACE_ENV, LEASE_NAME_ENV = "TSORACLE_LEASE_NAMESPACE", "TSORACLE_LEASE_NAME"
LEASE_OWNER_ENV = "TSORACLE_LEASE_OWNER"  # the operator's Deployment (set by the chart)
# The namespaces `tsoracle operator` watches (comma-separated; empty: cluster-wide), for the
# start-up probe: kopf does not hand them to start-up handlers.
WATCH_NAMESPACES_ENV = "TSORACLE_WATCH_NAMESPACES"
OPERATOR_POOL_SIZE = 4  # per database, shared by every resource that uses it
log = logging.getLogger("tsoracle.operator")
LEASE: LeaderLease | None = None
_LEASE_TASK: asyncio.Task[None] | None = None


class SharedBackends:
    """One open backend per database, shared by the resources whose Secrets name it: a pass
    opens no session of its own, and a hundred resources in one database use a few
    connections, not a hundred."""

    def __init__(self) -> None:
        self._roots: dict[str, Backend] = {}
        self._users: dict[str, set[str]] = {}
        self._used_by: dict[str, str] = {}
        self._lock = asyncio.Lock()

    async def get(self, resource: str, url: str) -> Backend:
        parsed = parse_url(url)
        key = f"{parsed.kind}\0{parsed.dsn}"
        async with self._lock:
            if self._used_by.get(resource, key) != key:
                await self._forget(resource)  # its Secret now names another database
            root = self._roots.get(key)
            if root is None:
                root = await open_instrumented_backend(url, create=True,
                                                       pool_size=OPERATOR_POOL_SIZE)
                self._roots[key] = root
            self._users.setdefault(key, set()).add(resource)
            self._used_by[resource] = key
        return root.for_schema(parsed.schema)

    async def forget(self, resource: str) -> None:
        async with self._lock:
            await self._forget(resource)

    async def _forget(self, resource: str) -> None:
        key = self._used_by.pop(resource, None)
        if key is None:
            return
        users = self._users.get(key, set())
        users.discard(resource)
        if not users:
            self._users.pop(key, None)
            root = self._roots.pop(key, None)
            if root is not None:
                await root.close()

    async def close(self) -> None:
        async with self._lock:
            for root in self._roots.values():
                await root.close()
            self._roots.clear()
            self._users.clear()
            self._used_by.clear()


BACKENDS = SharedBackends()


class _RedactPoolLogs(logging.Filter):
    """psycopg's pool logs connection failures with the server's address: keep it out."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact_addresses(record.getMessage())
        record.args = None
        return True


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    global LEASE, _LEASE_TASK
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    # Our resources are known in advance: skip kopf's cluster scan of CRDs and namespaces, which
    # would need cluster-wide list/watch rights the operator has no other use for.
    settings.scanning.disabled = True
    # Without these a silently stalled watch stream never delivers another event.
    settings.watching.server_timeout = 60
    settings.watching.client_timeout = 90
    settings.watching.connect_timeout = 30
    # INFO: kopf.info() (our Flipped and Dropped Events) posts nothing below this level. kopf's
    # own INFO chatter is not posted either: logs.install() stops it at its logger.
    settings.posting.level = logging.INFO
    settings.posting.reporting_component = "tsoracle-operator"
    logging.getLogger("psycopg.pool").addFilter(_RedactPoolLogs())
    logs.install(verbose=logging.getLogger().getEffectiveLevel() <= logging.DEBUG)
    namespaces = [n for n in os.environ.get(WATCH_NAMESPACES_ENV, "").split(",") if n]
    await wait_until_served(namespaces)
    lease_ns = os.environ.get(LEASE_NAMESPACE_ENV)
    if lease_ns:
        LEASE = LeaderLease(lease_ns, os.environ.get(LEASE_NAME_ENV) or "tsoracle-operator",
                            owner=os.environ.get(LEASE_OWNER_ENV) or None)
        _LEASE_TASK = asyncio.get_running_loop().create_task(LEASE.run())


@kopf.on.cleanup()
async def shut_down(**_: Any) -> None:
    if _LEASE_TASK is not None:
        _LEASE_TASK.cancel()  # releases the lease, so a successor starts at once
        await asyncio.gather(_LEASE_TASK, return_exceptions=True)
    await BACKENDS.close()


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime(TIME_FORMAT)


def _jitter(delay: float) -> float:
    # Resources created together would otherwise refresh in lock-step forever.
    return delay * random.uniform(0.9, 1.1)


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10)
async def reconcile_loop(name: str, namespace: str, body: kopf.Body, memo: kopf.Memo,
                         stopped: kopf.DaemonStopped, **_: Any) -> None:
    wake = memo.setdefault("wake", asyncio.Event())
    story = logs.Story(f"{namespace}/{name}")
    metrics.MANAGED.inc()
    try:
        while not stopped:
            wake.clear()
            if LEASE is not None and not LEASE.held():
                await _until(LEASE.wait_held(), stopped)
                continue
            try:
                delay = await reconcile_once(name, namespace, body, story=story)
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
                # The API server restarting or overloaded: try again soon, inside this loop,
                # rather than let kopf restart the daemon after its own (long) backoff. Told
                # once per outage, not every retry.
                if not story.api_failing:
                    log.warning("%s: Kubernetes API call failed (%s); retrying every %.0f s",
                                story.ref, logs.describe_api_error(exc), RETRY_SECONDS)
                story.api_failing = True
                metrics.RECONCILES.labels("api_error").inc()
                delay = RETRY_SECONDS
            else:
                if story.api_failing:
                    log.info("%s: Kubernetes API calls succeed again", story.ref)
                story.api_failing = False
            # Sleep until the refresh is due, the spec changes, or kopf stops the daemon.
            await _until(wake.wait(), stopped, timeout=_jitter(delay))
    finally:
        metrics.MANAGED.dec()
        await BACKENDS.forget(f"{namespace}/{name}")


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


async def _has_timelines(backend: Backend, timelines: tuple[str, ...]) -> bool:
    rows = await backend.fetch("SELECT DISTINCT timeline FROM {timestamps}")
    return set(timelines) <= {r[0] for r in rows}


def _bootstrap_text(bootstrap: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(bootstrap.items()))


async def reconcile_once(name: str, namespace: str, body: kopf.Body,
                         story: logs.Story | None = None) -> float:
    """One pass: check ownership, provision what is missing, apply fencing and the
    implementation flag, publish status. `story` remembers what was logged across passes."""
    story = story or logs.Story(f"{namespace}/{name}")
    ref = story.ref
    started = time.perf_counter()
    generation = int(body.meta.get("generation") or 0)
    owner = Owner(namespace, name, str(body.meta.get("uid") or ""))
    old_status = dict(body.get("status") or {})
    obs = Observation()
    spec: OracleSpec | None = None
    url: str | None = None
    extra: dict[str, Any] = {}
    try:
        spec = parse_spec(body.get("spec") or {})
        url = await read_secret_url(namespace, spec.secret_name, spec.secret_key)
        url = resource_url(url, spec.schema)  # a mismatch is a BadURL, not an InvalidSpec
        backend = await BACKENDS.get(f"{namespace}/{name}", url)
        found = await find_deployment(backend)
        check_ownership(found, owner, spec.schema, old_status)
        has_timelines = found is not None and await _has_timelines(backend, spec.timelines)
        if needs_provisioning(found, has_timelines):
            made = await provision(backend, spec.timelines, implementation=spec.implementation,
                                   owner=owner.tag)
            if found is None or made.created:
                log.info("%s: provisioned schema %r: implementation %s, epoch %d, timelines "
                         "created %s", ref, spec.schema, made.deployment.implementation,
                         made.deployment.epoch, ", ".join(made.created) or "none")
        dep = await claim(backend, owner.tag)
        check_ownership(dep, owner, spec.schema, {})  # another resource seeded it first
        if found is not None and not found.owner:
            log.info("%s: adopted schema %r (nobody owned it): implementation %s, epoch %d",
                     ref, spec.schema, dep.implementation, dep.epoch)
        obs.provisioned = True
        now = dt.datetime.now(dt.UTC)
        if plan(spec, dep, old_status, now).set_fencing:
            before = dep.fence
            dep = await set_fencing(backend, spec.fencing, generation=generation)
            if dep.fence != before:
                log.info("%s: fencing %s -> %s (epoch %d)", ref, before, dep.fence, dep.epoch)
            else:
                log.info("%s: fencing %s asked for by generation %d, older than the one the "
                         "backend applied; left at %s", ref, spec.fencing, generation, dep.fence)
        todo = plan(spec, dep, old_status, now)
        flipped = None
        if todo.flip_to is not None:
            log.info("%s: flip started: %s -> %s, epoch %d (generation %d)", ref,
                     dep.implementation, todo.flip_to, dep.epoch, generation)
            t0 = time.perf_counter()
            flipped = await flip_backend(backend, todo.flip_to, generation=generation)
            if flipped.changed:
                took = time.perf_counter() - t0
                metrics.FLIP_SECONDS.observe(took)
                metrics.FLIPS.labels(todo.flip_to).inc()
                log.info("%s: flip finished: %s -> %s, epoch %d -> %d in %.0f ms; bootstrap %s",
                         ref, flipped.previous, flipped.implementation, dep.epoch,
                         flipped.epoch, took * 1000, _bootstrap_text(flipped.bootstrap))
            elif flipped.stale:
                log.info("%s: flip to %s not applied: generation %d is older than the one the "
                         "backend applied; left as it is", ref, todo.flip_to, generation)
            else:
                log.info("%s: flip to %s changed nothing: %s is active at epoch %d", ref,
                         todo.flip_to, flipped.implementation, flipped.epoch)
        if flipped is not None and flipped.changed:
            _flipped_event(body, flipped.previous, flipped.implementation, flipped.epoch,
                           flipped.bootstrap, obs, extra)
        elif todo.resume_flip:
            position = await flip_backend(backend, dep.implementation)
            previous = next(i for i in IMPLEMENTATIONS if i != dep.implementation)
            log.info("%s: flip finished: %s -> %s, epoch %s -> %d (committed by an earlier "
                     "pass, published now); bootstrap %s", ref, previous, dep.implementation,
                     old_status.get("epoch", "?"), dep.epoch,
                     _bootstrap_text(position.bootstrap))
            _flipped_event(body, previous, dep.implementation, dep.epoch,
                           position.bootstrap, obs, extra)
        elif todo.finish_rollout:
            await finish_rollout(backend)
            log.info("%s: rollout window over: only the inactive implementation is fenced now",
                     ref)
        status = await read_status(backend, wall_clock_ms)
        obs.status = status
        obs.rollout = status.deployment.rollout
    except (SecretProblem, OwnershipProblem) as exc:
        obs.degraded_reason, obs.degraded_message = exc.reason, redact(str(exc), url)
    except ConfigError as exc:
        obs.degraded_reason = "BadURL" if url is not None else "InvalidSpec"
        obs.degraded_message = redact(str(exc), url)
    except OracleUnavailable as exc:
        obs.degraded_reason = "BackendUnavailable"
        obs.degraded_message = redact(str(exc), url)
    except OracleError as exc:
        obs.degraded_reason = type(exc).__name__
        obs.degraded_message = redact(str(exc), url)
    story.degraded_now(log, obs.degraded_reason, obs.degraded_message,
                       _degraded_reason(old_status))
    if obs.degraded_reason:
        metrics.FAILURES.labels(obs.degraded_reason).inc()
        if obs.degraded_reason in ("BackendChanged", "SchemaInUse", "SecretNotLabelled") \
                and _degraded_reason(old_status) != obs.degraded_reason:
            kopf.warn(body, reason=obs.degraded_reason, message=obs.degraded_message)
    metrics.ROLLOUT.labels(namespace, name).set(1 if obs.rollout else 0)
    patch = status_patch(obs, spec, old_status, generation, _now())
    patch.update(extra)
    await patch_status(namespace, name, patch)
    metrics.RECONCILES.labels("degraded" if obs.degraded_reason else "ok").inc()
    metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)
    if obs.degraded_reason or spec is None:
        return RETRY_SECONDS
    return float(spec.refresh_s)


def _flipped_event(body: kopf.Body, previous: str, to: str, epoch: int,
                   bootstrap: dict[str, int], obs: Observation, extra: dict[str, Any]) -> None:
    obs.bootstrap = bootstrap
    extra["lastFlipTime"] = _now()
    kopf.info(body, reason="Flipped", message=f"implementation {previous} -> {to}, epoch "
                                              f"{epoch}; bootstrap {_bootstrap_text(bootstrap)}")


def _degraded_reason(status: dict[str, Any]) -> str:
    for c in status.get("conditions") or []:
        if c.get("type") == "Degraded" and c.get("status") == "True":
            return str(c.get("reason") or "")
    return ""


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def deleted(name: str, namespace: str, spec: kopf.Spec, meta: kopf.Meta, body: kopf.Body,
                  memo: kopf.Memo, **_: Any) -> None:
    """Honour deletionPolicy for what this resource owns: Delete drops tsoracle's tables,
    Retain gives up ownership so that a new resource may adopt them. Nothing else is touched."""
    ref = f"{namespace}/{name}"
    try:
        parsed = parse_spec(spec)
    except ConfigError:
        log.info("%s: deleted; its spec never parsed, so nothing was provisioned", ref)
        return
    if LEASE is not None and not LEASE.held():
        if not memo.get("deletion_waits_for_lease"):
            log.info("%s: deletion waits for the operator holding the lease", ref)
            memo["deletion_waits_for_lease"] = True
        raise kopf.TemporaryError("another operator holds the lease", delay=RETRY_SECONDS)
    owner = Owner(namespace, name, str(meta.get("uid") or ""))
    what = "drop" if parsed.deletion_policy == "Delete" else "release"
    url = None
    try:
        url = resource_url(await read_secret_url(namespace, parsed.secret_name,
                                                parsed.secret_key), parsed.schema)
        backend = await BACKENDS.get(f"{namespace}/{name}", url)
        found = await find_deployment(backend)
        if found is None:
            log.info("%s: deleted; schema %r holds no tsoracle deployment, nothing to %s",
                     ref, parsed.schema, what)
            return
        if found.owner and found.owner != owner.tag:
            other = "/".join(found.owner.split("/")[:2])
            log.warning("%s: deletion skipped: schema %r belongs to TimestampOracle %s; "
                        "nothing was dropped or released", ref, parsed.schema, other)
            kopf.warn(body, reason="DeletionSkipped",
                      message=f"schema {parsed.schema!r} belongs to another TimestampOracle; "
                              "nothing was dropped or released")
            return
        if what == "drop":
            schema_gone = await drop_deployment(backend)
            log.info("%s: deleted; dropped tsoracle's tables in schema %r%s (deletionPolicy "
                     "Delete, epoch %d)", ref, parsed.schema,
                     " and the schema" if schema_gone else "", found.epoch)
            kopf.info(body, reason="Dropped", message=f"dropped tsoracle's tables in schema "
                                                      f"{parsed.schema!r}")
        else:
            await release(backend, owner.tag)
            log.info("%s: deleted; retained schema %r at epoch %d, ownership released "
                     "(deletionPolicy Retain)", ref, parsed.schema, found.epoch)
    except ConfigError as exc:  # Secret gone, unlabelled or unusable: never block deletion
        message = (f"cannot {what} schema {parsed.schema!r}: {redact(str(exc), url)}; "
                   "the tables are kept as they are")
        log.warning("%s: deletion skipped: %s", ref, message)
        kopf.warn(body, reason="DeletionSkipped", message=message)
    except OracleError as exc:
        message = (f"cannot {what} schema {parsed.schema!r} ({type(exc).__name__}: "
                   f"{redact(str(exc), url)}); deletion waits and retries")
        if memo.get("deletion_blocked") != message:  # once, not every retry
            log.warning("%s: deletion blocked: %s", ref, message)
            memo["deletion_blocked"] = message
        kopf.warn(body, reason="DeletionBlocked", message=message)
        obs = Observation(degraded_reason="DeletionBlocked", degraded_message=message)
        await patch_status(namespace, name, status_patch(
            obs, None, dict(body.get("status") or {}), int(meta.get("generation") or 0),
            _now()))
        raise kopf.TemporaryError(f"{what} failed; retrying", delay=RETRY_SECONDS) from None
    finally:
        await BACKENDS.forget(f"{namespace}/{name}")

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
import time
from typing import Any

import kopf

from tsoracle.errors import ConfigError, OracleError, OracleUnavailable
from tsoracle.fencing import finish_rollout, set_fencing
from tsoracle.operator import metrics
from tsoracle.operator.kube import SecretProblem, patch_status, read_secret_url
from tsoracle.operator.model import (
    GROUP,
    PLURAL,
    VERSION,
    Observation,
    OracleSpec,
    parse_spec,
    status_patch,
    with_schema,
)
from tsoracle.operator.redact import redact
from tsoracle.oracle.api import wall_clock_ms
from tsoracle.oracle.connect import admin_backend
from tsoracle.oracle.flip import flip_backend
from tsoracle.oracle.provision import provision
from tsoracle.oracle.status import read_status
from tsoracle.store import parse_url
from tsoracle.store.schema import drop_schema

RETRY_SECONDS = 5.0
FAULT_ENV = "TSORACLE_OPERATOR_FAULT"  # test-only fault injection: "exit-after-flip"
log = logging.getLogger("tsoracle.operator")


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    # Our resources are known in advance: skip kopf's cluster scan of CRDs and namespaces, which
    # would need cluster-wide list/watch rights the operator has no other use for.
    settings.scanning.disabled = True
    # Without these a silently stalled watch stream never delivers another event.
    settings.watching.server_timeout = 60
    settings.watching.client_timeout = 90
    settings.watching.connect_timeout = 30
    settings.posting.level = logging.INFO
    settings.posting.reporting_component = "tsoracle-operator"


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10)
async def reconcile_loop(name: str, namespace: str, body: kopf.Body, memo: kopf.Memo,
                         stopped: kopf.DaemonStopped, **_: Any) -> None:
    wake = memo.setdefault("wake", asyncio.Event())
    metrics.MANAGED.inc()
    try:
        while not stopped:
            wake.clear()
            delay = await reconcile_once(name, namespace, body)
            # Sleep until the refresh is due, the spec changes, or kopf stops the daemon.
            waiters = [asyncio.ensure_future(wake.wait()),
                       asyncio.ensure_future(stopped.wait())]
            try:
                await asyncio.wait(waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()
    finally:
        metrics.MANAGED.dec()


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def spec_changed(memo: kopf.Memo, **_: Any) -> None:
    """Wake the object's loop at once instead of at its next refresh."""
    wake = memo.get("wake")
    if wake is not None:
        wake.set()


async def reconcile_once(name: str, namespace: str, body: kopf.Body) -> float:
    """One pass: provision, apply fencing and the implementation flag, publish status."""
    started = time.perf_counter()
    generation = int(body.meta.get("generation") or 0)
    old_status = dict(body.get("status") or {})
    obs = Observation()
    spec: OracleSpec | None = None
    url: str | None = None
    extra: dict[str, Any] = {}
    try:
        spec = parse_spec(body.get("spec") or {})
        url = with_schema(await read_secret_url(namespace, spec.secret_name, spec.secret_key),
                          spec.schema)
        parse_url(url)
        async with admin_backend(url, create=True) as backend:
            done = await provision(backend, spec.timelines, implementation=spec.implementation)
            obs.provisioned = True
            dep = done.deployment
            if dep.fence != spec.fencing:
                dep = await set_fencing(backend, spec.fencing)
            flipped = None
            if dep.implementation != spec.implementation:
                t0 = time.perf_counter()
                flipped = await flip_backend(backend, spec.implementation)
                metrics.FLIP_SECONDS.observe(time.perf_counter() - t0)
                metrics.FLIPS.labels(spec.implementation).inc()
                if os.environ.get(FAULT_ENV) == "exit-after-flip":
                    os._exit(3)  # simulate a crash between the flip and its publication
            published = old_status.get("activeImplementation")
            if flipped is not None or published not in (None, spec.implementation):
                if flipped is None:
                    # The flip committed before a crash: the no-op call reports its position.
                    flipped = await flip_backend(backend, spec.implementation)
                obs.bootstrap = flipped.bootstrap
                extra["lastFlipTime"] = _now()
                boot = ", ".join(f"{k}={v}" for k, v in sorted(flipped.bootstrap.items()))
                kopf.info(body, reason="Flipped",
                          message=f"implementation {published or flipped.previous} -> "
                                  f"{spec.implementation}, epoch {flipped.epoch}; "
                                  f"bootstrap {boot}")
            elif dep.rollout and _rollout_over(old_status, spec):
                await finish_rollout(backend)
            status = await read_status(backend, wall_clock_ms)
            obs.status = status
            obs.rollout = status.deployment.rollout
    except SecretProblem as exc:
        obs.degraded_reason, obs.degraded_message = exc.reason, str(exc)
    except ConfigError as exc:
        obs.degraded_reason = "BadURL" if url is not None else "InvalidSpec"
        obs.degraded_message = redact(str(exc), url)
    except OracleUnavailable as exc:
        obs.degraded_reason = "BackendUnavailable"
        obs.degraded_message = redact(str(exc), url)
    except OracleError as exc:
        obs.degraded_reason = type(exc).__name__
        obs.degraded_message = redact(str(exc), url)
    if obs.degraded_reason:
        metrics.FAILURES.labels(obs.degraded_reason).inc()
        log.warning("%s/%s degraded (%s): %s", namespace, name, obs.degraded_reason,
                    obs.degraded_message)
    metrics.ROLLOUT.labels(namespace, name).set(1 if obs.rollout else 0)
    patch = status_patch(obs, spec, old_status, generation, _now())
    patch.update(extra)
    await patch_status(namespace, name, patch)
    metrics.RECONCILES.labels("degraded" if obs.degraded_reason else "ok").inc()
    metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)
    if obs.degraded_reason or spec is None:
        return RETRY_SECONDS
    return float(spec.refresh_s)


def _rollout_over(old_status: dict[str, Any], spec: OracleSpec) -> bool:
    since = old_status.get("lastFlipTime")
    if not since:
        return True
    flipped = dt.datetime.strptime(since, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    return (dt.datetime.now(dt.UTC) - flipped).total_seconds() >= spec.rollout_window_s


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def deleted(name: str, namespace: str, spec: kopf.Spec, **_: Any) -> None:
    """Honour deletionPolicy: Retain keeps the tables, Delete drops the schema."""
    try:
        parsed = parse_spec(spec)
    except ConfigError:
        return  # never provisioned anything
    if parsed.deletion_policy != "Delete":
        return
    try:
        url = with_schema(await read_secret_url(namespace, parsed.secret_name,
                                                parsed.secret_key), parsed.schema)
        async with admin_backend(url) as backend:
            await drop_schema(backend)
    except SecretProblem as exc:
        raise kopf.PermanentError(f"cannot drop the schema: {exc}; tables are kept") from None
    except OracleError as exc:
        raise kopf.TemporaryError(f"dropping the schema failed ({type(exc).__name__}); "
                                  "will retry", delay=RETRY_SECONDS) from None

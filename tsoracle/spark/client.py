"""The driver-side oracle client: finds the configured oracle and survives flips.

Tables are not its business (they are Iceberg tables in tsoracle's catalog: `Lakehouse`); it
is for drivers that take timestamps from the oracle themselves.

It runs the async oracle on a private event loop thread (Spark driver code is synchronous),
keeps one oracle per timeline, and when an operation raises `Fenced` (the epoch moved: a flip or
a newer leader) it reopens on the active implementation and retries, so nothing is ever served
by the superseded one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar, cast

from tsoracle.errors import ConfigError, OracleClosed
from tsoracle.extras import needs_extra
from tsoracle.fencing import read_deployment
from tsoracle.oracle import TimestampOracle, open_oracle, parse_timeline
from tsoracle.oracle.api import WriteTimestamp
from tsoracle.oracle.connect import open_instrumented_backend
from tsoracle.oracle.reopening import ReopeningOracle
from tsoracle.oracle.sync import LoopThread
from tsoracle.oracle.timeline import EPOCH_MILLISECONDS
from tsoracle.store import Backend, RetryPolicy

T = TypeVar("T")
log = logging.getLogger("tsoracle.spark")


class OracleClient:
    def __init__(self, url: str, *, timeline: str = EPOCH_MILLISECONDS,
                 fencing: str | None = None, retry: RetryPolicy | None = None) -> None:
        self.url = url
        self.default_timeline = parse_timeline(timeline).name
        self._fencing = fencing
        self._retry = retry  # how long each call retries a failing database
        self._runner = LoopThread()
        self._oracles: dict[str, ReopeningOracle] = {}
        self._lock = threading.Lock()
        self._shut = False
        # What the resource's status said when found through one (from_resource), else None.
        self.resource_epoch: int | None = None
        self.resource_implementation: str | None = None
        # Reads the deployment row: whether a lost legacy timeline may be served again.
        self.backend: Backend = self._runner.run(
            open_instrumented_backend(self.url, "client", retry=self._retry))

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> OracleClient:
        return cls(url, **kwargs)

    @classmethod
    def from_resource(cls, name: str, namespace: str, *, kubeconfig: str | None = None,
                      timeline: str | None = None, **kwargs: Any) -> OracleClient:
        """Find the oracle through a TimestampOracle resource: its Secret and its status."""
        with needs_extra("operator", "finding the oracle through a TimestampOracle resource"):
            import urllib3
            from kubernetes import client, config

        from tsoracle.resource import (
            GROUP,
            KUBECONFIG_FILE_ERRORS,
            PLURAL,
            VERSION,
            kubeconfig_problem,
            parse_spec,
            read_secret_url_sync,
            resource_url,
        )

        unusable: tuple[type[Exception], ...] = (config.ConfigException, *KUBECONFIG_FILE_ERRORS)
        try:
            if kubeconfig:
                api_client = config.new_client_from_config(kubeconfig)
            else:
                try:
                    config.load_incluster_config()
                except config.ConfigException:
                    config.load_kube_config()
                api_client = client.ApiClient()
        except unusable as exc:
            where = f"kubeconfig={kubeconfig!r}" if kubeconfig else (
                "$KUBECONFIG or ~/.kube/config (outside a pod)")
            raise ConfigError(f"no usable Kubernetes configuration in {where}: "
                              f"{kubeconfig_problem(exc)}; pass "
                              "kubeconfig= the path of a working kubeconfig, set $KUBECONFIG, "
                              "or run inside a pod with a ServiceAccount") from None
        try:
            obj = cast(dict[str, Any], client.CustomObjectsApi(
                api_client).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))
        except client.exceptions.ApiException as exc:
            raise _resource_problem(exc, namespace, name) from None
        except urllib3.exceptions.HTTPError as exc:
            raise ConfigError(f"cannot reach the Kubernetes API server of the kubeconfig "
                              f"({type(exc).__name__}); check that the cluster is up and the "
                              "kubeconfig's server address is right") from None
        spec = parse_spec(obj.get("spec") or {})
        status = obj.get("status") or {}
        if not status.get("activeImplementation"):
            raise ConfigError(f"TimestampOracle {namespace}/{name} is not provisioned yet "
                              "(no status.activeImplementation); check its conditions")
        url = resource_url(read_secret_url_sync(api_client, namespace, spec.secret_name,
                                               spec.secret_key), spec.schema)
        self = cls(url, timeline=timeline or spec.timelines[0], **kwargs)
        self.resource_epoch = int(status.get("epoch") or 0)
        self.resource_implementation = status["activeImplementation"]
        return self

    # --- oracle calls, with reopen on Fenced (oracle/reopening.py) ----------------------------

    def call(self, fn: Callable[[TimestampOracle], Awaitable[T]],
             timeline: str | None = None) -> T:
        return self._runner.run(self.acall(fn, timeline))

    async def acall(self, fn: Callable[[TimestampOracle], Awaitable[T]],
                    timeline: str | None = None) -> T:
        return await self.oracle(timeline).call(fn)

    def oracle(self, timeline: str | None = None) -> ReopeningOracle:
        """The timeline's oracle, reopened on the active implementation after each flip."""
        name = timeline or self.default_timeline
        with self._lock:  # driver threads call this: one oracle per timeline, never two leaders
            found = self._oracles.get(name)
            if found is None:
                if self._shut:
                    raise OracleClosed("this client is closed; create a new OracleClient")
                found = ReopeningOracle(
                    lambda: open_oracle(self.url, timeline=name, implementation=None,
                                        fencing=self._fencing, retry=self._retry),
                    name=name, still_lost=self._legacy_active)
                self._oracles[name] = found
        return found

    async def _legacy_active(self) -> bool:
        return (await read_deployment(self.backend)).implementation == "legacy"

    @property
    def reopens(self) -> int:
        return sum(o.reopens for o in self._oracles.values())

    def read_ts(self, timeline: str | None = None) -> int:
        return self.run(self.oracle(timeline).read_ts())

    def write_ts(self, timeline: str | None = None) -> WriteTimestamp:
        return self.run(self.oracle(timeline).write_ts())

    def peek_write_ts(self, timeline: str | None = None) -> int:
        return self.run(self.oracle(timeline).peek_write_ts())

    def apply_write(self, ts: int, timeline: str | None = None) -> None:
        self.run(self.oracle(timeline).apply_write(ts))

    def confirm_leadership(self, timeline: str | None = None) -> None:
        self.run(self.oracle(timeline).confirm_leadership())

    def epoch(self, timeline: str | None = None) -> int:
        return self.call(lambda o: _epoch(o), timeline)

    def implementation(self, timeline: str | None = None) -> str:
        return self.call(lambda o: _implementation(o), timeline)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(coro)

    def close(self) -> None:
        async def shutdown() -> None:
            self._shut = True
            for oracle in list(self._oracles.values()):
                await oracle.close()
            await self.backend.close()

        try:
            self._runner.run(shutdown())
        finally:
            self._runner.stop()

    def __enter__(self) -> OracleClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _epoch(oracle: TimestampOracle) -> int:
    await oracle.confirm_leadership()
    return oracle.epoch


async def _implementation(oracle: TimestampOracle) -> str:
    await oracle.confirm_leadership()
    return oracle.implementation


def _resource_problem(exc: Any, namespace: str, name: str) -> ConfigError:
    """The API server's refusal in the user's terms (its raw form carries headers and body)."""
    if exc.status == 404:
        return ConfigError(f"TimestampOracle {namespace}/{name} not found: check the name and the "
                           f"namespace (`kubectl get tso -n {namespace}`)")
    if exc.status in (401, 403):
        return ConfigError(f"not allowed to get TimestampOracle {namespace}/{name} "
                           f"({exc.status} {exc.reason}): the driver's ServiceAccount needs `get` "
                           "on timestamporacles (the chart's sparkDrivers values grant it)")
    return ConfigError(f"reading TimestampOracle {namespace}/{name} failed: the API server "
                       f"answered {exc.status} {exc.reason}")

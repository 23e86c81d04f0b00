"""The few Kubernetes API calls the operator makes itself (kopf does the watching)."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Collection, Mapping, Sequence
from functools import cache
from typing import Any, cast

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tsoracle.operator.catalog import FIELD_MANAGER, Desired, Seen, SeenObject
from tsoracle.operator.logs import describe_api_error, is_transient
from tsoracle.resource import GROUP, PLURAL, VERSION, read_secret_text_sync, read_secret_url_sync

log = logging.getLogger("tsoracle.operator")
PROBE_BUDGET_S = 30.0  # then kopf starts anyway (and keeps retrying, at WARNING)
PROBE_EVERY_S = 1.0
APPLY = "application/apply-patch+yaml"  # server-side apply (JSON is YAML)
# (connect, read) of every call below that names none: without one, a call on a connection the
# API server stopped answering (a replica lost behind a load balancer) waited as long as TCP
# kept the connection, and the resource's reconcile loop with it. urllib3 retries a timed-out
# GET on a new connection; any other failed call fails the pass, which the loop retries.
REQUEST_TIMEOUT_S = (5.0, 20.0)


class _TimedApiClient(client.ApiClient):
    def call_api(self, method: str, url: str, header_params: Any = None, body: Any = None,
                 post_params: Any = None, _request_timeout: Any = None) -> Any:
        return super().call_api(method, url, header_params, body, post_params,
                                _request_timeout=_request_timeout or REQUEST_TIMEOUT_S)


@cache
def api_client() -> client.ApiClient:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return _TimedApiClient()


def single_try_client(config_file: str | None = None) -> client.ApiClient:
    """Without urllib3's own retries: each call is one request, so its `_request_timeout`
    bounds it (urllib3 would retry a timed-out GET or PUT three times), and a refused
    connection is not logged by urllib3 three times over. `config_file`: a kubeconfig other
    than the environment's."""
    cfg = client.Configuration()
    if config_file is not None:
        config.load_kube_config(config_file=config_file, client_configuration=cfg)
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            config.load_kube_config(client_configuration=cfg)
    cfg.retries = False
    return client.ApiClient(cfg)


def _probe(api: client.ApiClient, namespaces: Sequence[str]) -> str | None:
    """Why the API server cannot serve the operator yet, or None once it can (or once it
    answers with something a wait will not change: kopf reports that itself)."""
    objects = client.CustomObjectsApi(api)
    try:
        found = objects.get_api_resources(GROUP, VERSION, _request_timeout=5)
        if not any(r.name == PLURAL for r in (found.resources or [])):
            return f"{PLURAL}.{GROUP} not served yet"
    except ApiException as exc:
        if exc.status == 404:  # discovery lags a starting server's CRDs by a moment
            return f"{PLURAL}.{GROUP} not served yet"
        if exc.status == 403:
            # Discovery is open to every authenticated user: a starting server refuses it
            # until its RBAC authorizer has loaded the bootstrap roles.
            return f"403 {_forbidden(exc)}"
        return describe_api_error(exc) if is_transient(exc) else None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        return describe_api_error(exc)
    # A list through the watch cache, the request kopf starts with: it answers 429 "storage
    # is (re)initializing" until that cache is filled.
    scopes: list[str | None] = [*namespaces] or [None]  # None: cluster-wide
    for ns in scopes:
        try:
            if ns is None:
                objects.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=1,
                                                   _request_timeout=5)
            else:
                objects.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, limit=1,
                                                      _request_timeout=5)
        except ApiException as exc:
            # A namespace's 403 is RBAC still loading (the chart grants the list), or missing
            # rights that waiting will not fix: wait within the budget. Cluster-wide, the
            # operator may rightly lack the right (`kopf run` with --namespace): go on.
            if exc.status == 403 and ns is not None:
                return f"403 {_forbidden(exc)}"
            return describe_api_error(exc) if is_transient(exc) else None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return describe_api_error(exc)
    return None


def _forbidden(exc: ApiException) -> str:
    # The server appends every role it could not find yet ("RBAC: [...]"): noise here.
    said = describe_api_error(exc).removeprefix("403 ").split(": RBAC:", 1)[0]
    return f"{said}; authorization not loaded yet?"


async def wait_until_served(namespaces: Sequence[str],
                            budget_s: float = PROBE_BUDGET_S) -> None:
    """Hold kopf's start until the API server serves TimestampOracles.

    kopf resolves its resources once at start (scanning is off): one that the API server does
    not list yet, as right after it starts, would never be served. And every request kopf makes
    meanwhile would be logged as an ERROR. Bounded, so that the liveness endpoint (which kopf
    opens only after start-up) comes up even if the API server does not.
    """
    started = time.monotonic()
    api = single_try_client()
    told: str | None = None
    try:
        while True:
            problem = await asyncio.to_thread(_probe, api, namespaces)
            if problem is None:
                if told is not None:
                    log.info("API server ready after %.1f s", time.monotonic() - started)
                return
            if time.monotonic() - started > budget_s:
                log.warning("API server still not ready after %.0f s (%s); starting anyway",
                            budget_s, problem)
                return
            if problem != told:
                log.info("API server not ready yet (%s); retrying", problem)
                told = problem
            await asyncio.sleep(PROBE_EVERY_S)
    finally:
        api.close()


async def read_secret_url(namespace: str, name: str, key: str) -> str:
    """The backend URL stored in a Secret. Errors name the Secret and key, never the value."""
    return await asyncio.to_thread(read_secret_url_sync, api_client(), namespace, name, key)


async def read_secret_text(namespace: str, name: str, key: str) -> str:
    """The backend Secret's value as stored (`read_secret_url` strips it)."""
    return await asyncio.to_thread(read_secret_text_sync, api_client(), namespace, name, key)


def _owner_exists_sync(namespace: str, name: str, uid: str) -> bool:
    api = client.CustomObjectsApi(api_client())
    try:
        obj = cast(dict[str, Any],
                   api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))
    except ApiException as exc:
        if exc.status == 404:
            return False
        if exc.status == 403:
            return True  # cannot look there (a namespaced install): assume it is still in use
        raise
    return str((obj.get("metadata") or {}).get("uid") or "") == uid


async def owner_exists(tag: str) -> bool:
    """Whether the TimestampOracle named by an owner tag (`namespace/name/uid`) still exists:
    one of that name with another uid is another resource."""
    namespace, name, uid = (tag.split("/") + ["", "", ""])[:3]
    return await asyncio.to_thread(_owner_exists_sync, namespace, name, uid)


def _missing(exc: ApiException) -> bool:
    return exc.status == 404


def _read_catalog_sync(namespace: str, name: str) -> Seen:
    api = api_client()
    found: list[SeenObject | None] = []
    for read in (client.AppsV1Api(api).read_namespaced_deployment,
                 client.CoreV1Api(api).read_namespaced_service):
        try:
            found.append(SeenObject.of(api.sanitize_for_serialization(read(name, namespace))))
        except ApiException as exc:
            if not _missing(exc):
                raise
            found.append(None)
    return Seen(deployment=found[0], service=found[1])


async def read_catalog(namespace: str, name: str) -> Seen:
    """The catalog's Deployment and Service of that name, as they are."""
    return await asyncio.to_thread(_read_catalog_sync, namespace, name)


def _apply_catalog_sync(want: Desired) -> SeenObject:
    api = api_client()
    namespace = want.service["metadata"]["namespace"]
    name = want.service["metadata"]["name"]
    # Server-side apply: created when missing, and a field the operator stops setting goes
    # away; forced, since these objects are the resource's (nobody else's edits stand).
    client.CoreV1Api(api).patch_namespaced_service(
        name, namespace, want.service, field_manager=FIELD_MANAGER, force=True,
        _content_type=APPLY)
    applied = client.AppsV1Api(api).patch_namespaced_deployment(
        name, namespace, want.deployment, field_manager=FIELD_MANAGER, force=True,
        _content_type=APPLY)
    return SeenObject.of(api.sanitize_for_serialization(applied))


async def apply_catalog(want: Desired) -> SeenObject:
    """Create or update the catalog's Service and Deployment; the Deployment as applied."""
    return await asyncio.to_thread(_apply_catalog_sync, want)


def _delete_catalog_sync(namespace: str, name: str, deployment: bool, service: bool) -> None:
    api = api_client()
    deletes = [client.AppsV1Api(api).delete_namespaced_deployment] if deployment else []
    deletes += [client.CoreV1Api(api).delete_namespaced_service] if service else []
    for delete in deletes:
        try:
            # Background: the Deployment's ReplicaSets and pods follow by garbage collection.
            delete(name, namespace, propagation_policy="Background")
        except ApiException as exc:
            if not _missing(exc):
                raise


async def delete_catalog(namespace: str, name: str, *, deployment: bool, service: bool) -> None:
    await asyncio.to_thread(_delete_catalog_sync, namespace, name, deployment, service)


def _token_problem_sync(namespace: str, name: str, key: str) -> tuple[str, str] | None:
    try:
        secret = client.CoreV1Api(api_client()).read_namespaced_secret(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return ("TokenSecretNotFound", f"Secret {namespace}/{name} (spec.catalog."
                    f"tokenSecretRef) does not exist; create it with the bearer token under "
                    f"key {key!r}")
        if exc.status == 403:
            return ("TokenSecretForbidden", f"the operator may not read Secret "
                    f"{namespace}/{name} (spec.catalog.tokenSecretRef)")
        raise
    value = (secret.data or {}).get(key)
    if value is None:
        return ("TokenSecretKeyMissing", f"Secret {namespace}/{name} (spec.catalog."
                f"tokenSecretRef) has no key {key!r}")
    if not base64.b64decode(value).strip():
        return ("TokenSecretEmpty", f"Secret {namespace}/{name} key {key!r} (spec.catalog."
                "tokenSecretRef) is empty; put the bearer token in it")
    return None


async def token_problem(namespace: str, name: str, key: str) -> tuple[str, str] | None:
    """Why the catalog's token Secret cannot serve as its --token-file (reason, message), or
    None. The value is only checked for being there, never kept or told."""
    return await asyncio.to_thread(_token_problem_sync, namespace, name, key)


async def patch_status(namespace: str, name: str, status: dict[str, Any], *,
                       expect: Mapping[str, Any] | None = None,
                       present: Collection[str] = ()) -> bool:
    """Patch the resource's status; a key set to None is removed.

    With `expect` (JSON pointers into the resource and the values the pass read, see
    `model.status_expectations`; `present`: the keys its status had), the API server applies
    the patch only while each still holds its value, in the same request (a JSON Patch
    `test`), so a late pass never moves the status back. Returns False when the patch was not
    applied: a value moved, or the resource is gone."""
    api = client.CustomObjectsApi(api_client())
    body: Any = {"status": status}
    kind = None
    if expect:
        kind = "application/json-patch+json"
        body = [{"op": "test", "path": path, "value": v} for path, v in expect.items()]
        if not present:  # a resource with no status yet: `add` needs the object there
            body.append({"op": "add", "path": "/status", "value": {}})
        for k, v in status.items():
            if v is not None:
                body.append({"op": "add", "path": f"/status/{k}", "value": v})
            elif k in present:
                body.append({"op": "remove", "path": f"/status/{k}"})
    try:
        await asyncio.to_thread(api.patch_namespaced_custom_object_status, GROUP, VERSION,
                                namespace, PLURAL, name, body, _content_type=kind)
    except ApiException as exc:
        if exc.status == 404:  # deleted meanwhile: nothing to report on
            return False
        if expect and exc.status == 422:  # a `test` failed: the status moved meanwhile
            return False
        raise
    return True

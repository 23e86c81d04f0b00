"""The plugin's way to the API server: TimestampOracle resources in one namespace, and the
API server's refusals as one-line errors."""

from __future__ import annotations

import json
import os
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.kube_config import (
    ENV_KUBECONFIG_PATH_SEPARATOR,
    KUBE_CONFIG_DEFAULT_LOCATION,
    KubeConfigLoader,
    KubeConfigMerger,
)

from tsoracle.kubectl.connection import Connection
from tsoracle.resource import GROUP, KUBECONFIG_FILE_ERRORS, PLURAL, VERSION, kubeconfig_problem

OVERRIDE_CONTEXT = "kubectl-tsoracle-flags"  # the context --cluster/--user make, in memory


class PluginError(Exception):
    """A failure the user can act on: printed as one line, exit code 1."""


class Api:
    """The kubeconfig's client and the namespace the command works in."""

    def __init__(self, kubeconfig: str | None, namespace: str | None, *,
                 connection: Connection | None = None) -> None:
        conn = connection or Connection(kubeconfig=kubeconfig, namespace=namespace)
        self.client, self.namespace = load(conn)
        self.custom = client.CustomObjectsApi(self.client)
        self.core = client.CoreV1Api(self.client)

    def get(self, name: str) -> dict[str, Any]:
        try:
            found = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                             PLURAL, name)
            return cast(dict[str, Any], found)
        except ApiException as exc:
            if exc.status == 404:
                raise PluginError(f"TimestampOracle {self.namespace}/{name} not found; "
                                  f"`kubectl tsoracle status -n {self.namespace}` lists "
                                  "them") from None
            raise PluginError(f"the API server refused: {exc.reason}") from None

    def list(self, all_namespaces: bool, timeout_s: float | None = None
             ) -> list[dict[str, Any]]:
        """`timeout_s`: a bound on the request (shell completion must not hang a TAB)."""
        extra: dict[str, Any] = {} if timeout_s is None else {"_request_timeout": timeout_s}
        try:
            if all_namespaces:
                found = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, **extra)
            else:
                found = self.custom.list_namespaced_custom_object(GROUP, VERSION,
                                                                  self.namespace, PLURAL,
                                                                  **extra)
        except ApiException as exc:
            raise PluginError(f"the API server refused to list TimestampOracles: "
                              f"{exc.reason}") from None
        items: list[dict[str, Any]] = cast(dict[str, Any], found).get("items") or []
        return sorted(items, key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"]))

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        try:
            self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL,
                                                       name, {"spec": spec})
        except ApiException as exc:
            raise PluginError(f"the API server refused the change: "
                              f"{refusal(exc)}") from None

    def plain(self, obj: Any) -> Any:
        """A client model (Secret, Event) as the plain dict the API server sent."""
        return self.client.sanitize_for_serialization(obj)


def refusal(exc: ApiException) -> str:
    """The API server's own message (a Status body), else its reason: a proxy in between may
    answer with HTML or plain text."""
    try:
        body = json.loads(exc.body) if exc.body else {}
    except ValueError:
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or exc.reason or exc.status)


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    """The resource's status condition of type `kind` ({} if it has none)."""
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return c
    return {}


def _entries(kcfg: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """A kubeconfig list (`contexts`, `clusters`, `users`) as plain dicts: the merger wraps
    each file's entries to remember the file (for relative certificate paths)."""
    entries = [getattr(e, "value", e) for e in kcfg.get(kind) or []]
    if not all(isinstance(e, dict) and isinstance(e.get(kind[:-1], {}), dict)
               for e in entries):
        raise PluginError(f"no usable kubeconfig: its {kind} are not a list of named entries")
    return entries


def _named(items: list[dict[str, Any]], name: str) -> bool:
    return any(item.get("name") == name for item in items)


def _names(items: list[dict[str, Any]]) -> str:
    return ", ".join(str(item.get("name")) for item in items) or "none"


def _merged(conn: Connection) -> Any:
    """The kubeconfig files merged as kubectl merges them (the first file's entry wins)."""
    paths = conn.kubeconfig or os.environ.get("KUBECONFIG") or KUBE_CONFIG_DEFAULT_LOCATION
    unusable: tuple[type[Exception], ...] = (config.ConfigException, *KUBECONFIG_FILE_ERRORS)
    try:
        merger = KubeConfigMerger(paths)
    except unusable as exc:
        raise PluginError(f"no usable kubeconfig: {kubeconfig_problem(exc)}") from None
    merged = merger.config
    if merged is None:
        shown = paths.split(ENV_KUBECONFIG_PATH_SEPARATOR)
        raise PluginError(f"no kubeconfig found at {', '.join(shown)}: give --kubeconfig or "
                          "set KUBECONFIG")
    if not isinstance(merged.value, dict) or not all(
            isinstance(merger.config_files[p], dict) for p in merger.paths):
        raise PluginError("no usable kubeconfig: it is not a kubeconfig (no clusters, users "
                          "and contexts in it)")
    # kubectl takes the current context from the first file that sets one (the merger keeps
    # the last).
    current = next((merger.config_files[p]["current-context"] for p in merger.paths
                    if merger.config_files[p].get("current-context")), None)
    if current is not None:
        merged.value["current-context"] = current
    return merged


def kubeconfig_entries(conn: Connection, kind: str) -> list[str]:
    """The names of the kubeconfig's `contexts`, `clusters` or `users`."""
    return [str(e.get("name")) for e in _entries(_merged(conn).value, kind)]


def load(conn: Connection) -> tuple[client.ApiClient, str]:
    """The API client and the namespace the flags choose, as kubectl would choose them."""
    merged = _merged(conn)
    kcfg = merged.value
    contexts = _entries(kcfg, "contexts")
    name = conn.context or kcfg.get("current-context")
    if not name:
        raise PluginError("the kubeconfig has no current context: give --context "
                          f"(its contexts: {_names(contexts)})")
    if not _named(contexts, name):
        raise PluginError(f"no context {name!r} in the kubeconfig (its contexts: "
                          f"{_names(contexts)})")
    chosen = next(c for c in contexts if c.get("name") == name)
    context = dict(chosen.get("context") or {})
    for kind, wanted in (("cluster", conn.cluster), ("user", conn.user)):
        if wanted is None:
            continue
        entries = _entries(kcfg, f"{kind}s")
        if not _named(entries, wanted):
            raise PluginError(f"no {kind} {wanted!r} in the kubeconfig (its {kind}s: "
                              f"{_names(entries)})")
        context[kind] = wanted
    if conn.cluster or conn.user:
        # Only in memory: the kubeconfig file is never written.
        kcfg["contexts"].append({"name": OVERRIDE_CONTEXT, "context": context})
        name = OVERRIDE_CONTEXT
    configuration = type.__call__(client.Configuration)
    try:
        # config_base_path None: a relative certificate path is relative to its own file.
        KubeConfigLoader(config_dict=merged, config_base_path=None,
                         active_context=name).load_and_set(configuration)
    except Exception as exc:  # noqa: BLE001 - its messages may quote tokens: named, not shown
        raise PluginError(f"the kubeconfig's context {name!r} is not usable "
                          f"({type(exc).__name__}): check its cluster and user") from None
    namespace = conn.namespace or str(context.get("namespace") or "default")
    return client.ApiClient(configuration), namespace

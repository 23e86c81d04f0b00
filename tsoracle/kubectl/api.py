"""The plugin's way to the API server: TimestampOracle resources in one namespace, and the
API server's refusals as one-line errors."""

from __future__ import annotations

import json
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tsoracle.resource import GROUP, KUBECONFIG_FILE_ERRORS, PLURAL, VERSION, kubeconfig_problem


class PluginError(Exception):
    """A failure the user can act on: printed as one line, exit code 1."""


class Api:
    """The kubeconfig's client and the namespace the command works in."""

    def __init__(self, kubeconfig: str | None, namespace: str | None) -> None:
        unusable: tuple[type[Exception], ...] = (config.ConfigException, *KUBECONFIG_FILE_ERRORS)
        try:
            if kubeconfig:
                self.client = config.new_client_from_config(kubeconfig)
                _, ctx = config.list_kube_config_contexts(kubeconfig)
            else:
                config.load_kube_config()
                self.client = client.ApiClient()
                _, ctx = config.list_kube_config_contexts()
        except unusable as exc:
            raise PluginError(f"no usable kubeconfig: {kubeconfig_problem(exc)}") from None
        self.namespace = namespace or ctx.get("context", {}).get("namespace") or "default"
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

    def list(self, all_namespaces: bool) -> list[dict[str, Any]]:
        try:
            if all_namespaces:
                found = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
            else:
                found = self.custom.list_namespaced_custom_object(GROUP, VERSION,
                                                                  self.namespace, PLURAL)
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
            body = json.loads(exc.body or "{}") if exc.body else {}
            raise PluginError(f"the API server refused the change: "
                              f"{body.get('message', exc.reason)}") from None

    def plain(self, obj: Any) -> Any:
        """A client model (Secret, Event) as the plain dict the API server sent."""
        return self.client.sanitize_for_serialization(obj)


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    """The resource's status condition of type `kind` ({} if it has none)."""
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return c
    return {}

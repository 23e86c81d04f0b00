"""The few Kubernetes API calls the operator makes itself (kopf does the watching)."""

from __future__ import annotations

import asyncio
import base64
from functools import cache
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tsoracle.errors import ConfigError
from tsoracle.operator.model import GROUP, PLURAL, VERSION

# A Secret the operator may use must say so: anyone who may create a TimestampOracle could
# otherwise point the operator (which may read every Secret in the namespace) at any database
# credentials there, and with deletionPolicy: Delete make it drop tables with them.
BACKEND_LABEL = "tsoracle.io/backend"


class SecretProblem(ConfigError):
    """The backend Secret is missing or does not hold a usable URL."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@cache
def api_client() -> client.ApiClient:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


async def read_secret_url(namespace: str, name: str, key: str) -> str:
    """The backend URL stored in a Secret. Errors name the Secret and key, never the value."""
    return await asyncio.to_thread(read_secret_url_sync, api_client(), namespace, name, key)


def read_secret_url_sync(api: client.ApiClient, namespace: str, name: str, key: str) -> str:
    core = client.CoreV1Api(api)
    try:
        secret = core.read_namespaced_secret(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            raise SecretProblem("SecretNotFound",
                                f"Secret {namespace}/{name} does not exist; create it with "
                                f"the backend URL under key {key!r}") from None
        if exc.status == 403:
            raise SecretProblem("SecretForbidden",
                                f"the operator may not read Secret {namespace}/{name}") from None
        raise
    labels = (secret.metadata.labels if secret.metadata else None) or {}
    if labels.get(BACKEND_LABEL) != "true":
        raise SecretProblem("SecretNotLabelled",
                            f"Secret {namespace}/{name} is not labelled {BACKEND_LABEL}=true, "
                            "so the operator will not use it; if it holds this oracle's backend "
                            f"URL, run: kubectl label secret {name} -n {namespace} "
                            f"{BACKEND_LABEL}=true")
    data = (secret.data or {}).get(key)
    if data is None:
        raise SecretProblem("SecretKeyMissing",
                            f"Secret {namespace}/{name} has no key {key!r}")
    try:
        return base64.b64decode(data).decode().strip()
    except (ValueError, UnicodeDecodeError):
        raise SecretProblem("BadURL", f"Secret {namespace}/{name} key {key!r} is not "
                            "UTF-8 text") from None


async def patch_status(namespace: str, name: str, status: dict[str, Any]) -> None:
    api = client.CustomObjectsApi(api_client())
    try:
        await asyncio.to_thread(api.patch_namespaced_custom_object_status, GROUP, VERSION,
                                namespace, PLURAL, name, {"status": status})
    except ApiException as exc:
        if exc.status != 404:  # deleted meanwhile: nothing to report on
            raise

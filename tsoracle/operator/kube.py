"""The few Kubernetes API calls the operator makes itself (kopf does the watching)."""

from __future__ import annotations

import asyncio
from functools import cache
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tsoracle.resource import GROUP, PLURAL, VERSION, read_secret_url_sync


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


async def patch_status(namespace: str, name: str, status: dict[str, Any]) -> None:
    api = client.CustomObjectsApi(api_client())
    try:
        await asyncio.to_thread(api.patch_namespaced_custom_object_status, GROUP, VERSION,
                                namespace, PLURAL, name, {"status": status})
    except ApiException as exc:
        if exc.status != 404:  # deleted meanwhile: nothing to report on
            raise

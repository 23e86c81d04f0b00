"""The TimestampOracle resource as clients see it: its API coordinates, its spec, and the
backend Secret it names. The operator, the kubectl plugin and Spark drivers all read it here.

Kubernetes' client is imported only by the functions that call the API (the `operator`
extra), so the spec can be parsed without it.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tsoracle.errors import ConfigError, InvalidTimeline
from tsoracle.fencing import IMPLEMENTATIONS, MODES
from tsoracle.oracle.timeline import EPOCH_MILLISECONDS, parse_timeline
from tsoracle.store import with_schema

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

GROUP = "tsoracle.io"
VERSION = "v1alpha1"
PLURAL = "timestamporacles"
KIND = "TimestampOracle"


@dataclass(frozen=True)
class OracleSpec:
    secret_name: str
    secret_key: str
    schema: str
    implementation: str
    fencing: str
    timelines: tuple[str, ...]
    deletion_policy: str
    rollout_window_s: int
    refresh_s: int


def parse_spec(spec: Mapping[str, Any]) -> OracleSpec:
    """Validate what the CRD schema cannot (it already checks shapes and enums)."""
    backend = spec.get("backend") or {}
    ref = backend.get("urlSecretRef") or {}
    if not ref.get("name"):
        raise ConfigError("spec.backend.urlSecretRef.name is required")
    implementation = spec.get("implementation", "distributed")
    if implementation not in IMPLEMENTATIONS:
        raise ConfigError(f"spec.implementation {implementation!r} is not one of {IMPLEMENTATIONS}")
    fencing = spec.get("fencing", "Always")
    if fencing not in MODES:
        raise ConfigError(f"spec.fencing {fencing!r} is not one of {MODES}")
    timelines = tuple(spec.get("timelines") or [EPOCH_MILLISECONDS])
    for t in timelines:
        try:
            parse_timeline(t)
        except InvalidTimeline as exc:
            raise ConfigError(f"spec.timelines: {exc}") from None
    return OracleSpec(
        secret_name=str(ref["name"]),
        secret_key=str(ref.get("key") or "url"),
        schema=str(backend.get("schema") or "tsoracle"),
        implementation=implementation,
        fencing=fencing,
        timelines=timelines,
        deletion_policy=spec.get("deletionPolicy", "Retain"),
        rollout_window_s=int(spec.get("rolloutWindowSeconds", 30)),
        refresh_s=int(spec.get("statusRefreshSeconds", 10)),
    )


def resource_url(url: str, schema: str) -> str:
    """The backend URL with the resource's schema. A URL that names another schema is refused:
    spec.backend.schema is immutable, and a Secret edit must not move the oracle elsewhere."""
    return with_schema(url, schema, refusal=(
        f"the backend URL in the Secret names a schema other than spec.backend.schema "
        f"({schema!r}); remove the schema parameter from the Secret's URL"))


# A Secret the operator may use must say so: anyone who may create a TimestampOracle could
# otherwise point the operator (which may read every Secret in the namespace) at any database
# credentials there, and with deletionPolicy: Delete make it drop tables with them.
BACKEND_LABEL = "tsoracle.io/backend"


class SecretProblem(ConfigError):
    """The backend Secret is missing or does not hold a usable URL."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def read_secret_url_sync(api: ApiClient, namespace: str, name: str, key: str) -> str:
    """The backend URL stored in a Secret. Errors name the Secret and key, never the value."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

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

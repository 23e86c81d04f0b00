"""The TimestampOracle resource as clients see it: its API coordinates, its spec, and the
backend Secret it names. The operator, the kubectl plugin and Spark drivers all read it here.

Kubernetes' client is imported only by the functions that call the API (the `operator`
extra), so the spec can be parsed without it.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml

from tsoracle.errors import ConfigError, InvalidTimeline
from tsoracle.fencing import IMPLEMENTATIONS, MODES
from tsoracle.oracle.timeline import EPOCH_MILLISECONDS, parse_timeline
from tsoracle.redact import names_a_secret
from tsoracle.store import with_schema

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

GROUP = "tsoracle.io"
VERSION = "v1alpha1"
PLURAL = "timestamporacles"
KIND = "TimestampOracle"


# What reading a kubeconfig file can raise besides kubernetes' own ConfigException: a file that
# is missing or unreadable, not YAML, or YAML of another shape (a plain string, a list).
# (A KeyError: an entry without a name in a later file of a $KUBECONFIG list.)
KUBECONFIG_FILE_ERRORS: tuple[type[Exception], ...] = (
    OSError, yaml.YAMLError, TypeError, AttributeError, ValueError, LookupError)


def kubeconfig_problem(exc: Exception) -> str:
    """What is wrong with a kubeconfig, in a phrase that quotes none of the file (its tokens)."""
    if isinstance(exc, yaml.YAMLError):
        mark = getattr(exc, "problem_mark", None)
        return "it is not valid YAML" + (f" (line {mark.line + 1})" if mark else "")
    if isinstance(exc, (TypeError, AttributeError, ValueError, LookupError)):
        return "it is not a kubeconfig (no clusters, users and contexts in it)"
    # kubernetes' own messages go on after " in " with the offending entry, token and all
    # ("Expected key name in <path>/{'user': {'token': …}}"): keep only what comes before.
    return str(exc).split(" in ", 1)[0].strip()[:200]


@dataclass(frozen=True)
class CatalogVolume:
    """What holds a file:// warehouse in the catalog's pods: a node directory or a claim."""

    host_path: str = ""
    claim_name: str = ""


@dataclass(frozen=True)
class CatalogSpec:
    """spec.catalog, enabled: the Iceberg REST catalog the operator runs for the resource."""

    warehouse: str  # file:///path or s3://bucket/prefix (s3a:// too)
    timeline: str  # orders its commits; one of the resource's timelines
    replicas: int = 1
    token_secret: str = ""  # a Secret holding the bearer token; "": no token required
    token_key: str = "token"
    volume: CatalogVolume | None = None  # file:// warehouses only (and required there)
    # An object store's FileIO settings (`--io-property`), and a Secret whose keys become the
    # container's environment: the credentials the FileIO reads (s3:// warehouses only).
    io_properties: tuple[tuple[str, str], ...] = ()
    credentials_secret: str = ""
    # Container resources, as Kubernetes has them: {"requests": {...}, "limits": {...}}.
    resources: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # How long reads at timestamps the catalog handed out keep the snapshots they need from
    # snapshot expiry (`--retention`); None: not set, the catalog's own default.
    retention_s: float | None = None

    @property
    def warehouse_path(self) -> str:
        """The directory of a file:// warehouse ("" for object stores)."""
        return self.warehouse.removeprefix("file://") if self.warehouse.startswith("file://") \
            else ""


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
    catalog: CatalogSpec | None = None  # None: spec.catalog is absent or not enabled


# What the CRD allows: a Kubernetes quantity (an integer or a string such as 500m or 256Mi).
_NUMBER = r"(\d+(\.\d*)?|\.\d+)"
_QUANTITY = re.compile(rf"^[+-]?{_NUMBER}([KMGTPE]i|[numkMGTPE]|[eE][+-]?{_NUMBER})?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
MAX_CATALOG_REPLICAS = 16
MAX_CATALOG_RETENTION_S = 10 * 365 * 86400  # ten years, as `catalog serve --retention` allows


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
        catalog=parse_catalog(spec.get("catalog") or {}, timelines),
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


def parse_catalog(catalog: Mapping[str, Any], timelines: tuple[str, ...]) -> CatalogSpec | None:
    """spec.catalog, checked as the CRD does (for resources it did not check) and beyond: the
    timeline must be one of the resource's, a file:// warehouse needs a volume."""
    if not catalog.get("enabled", False):
        return None
    warehouse = str(catalog.get("warehouse") or "")
    if not warehouse:
        raise ConfigError("spec.catalog.warehouse is required when spec.catalog.enabled is "
                          "true: where tables' files go (file:///path or s3://bucket/prefix)")
    if warehouse.startswith("file://"):
        path = warehouse.removeprefix("file://")
        if not path.startswith("/") or path.rstrip("/") == "" or ".." in path.split("/"):
            raise ConfigError(f"spec.catalog.warehouse {warehouse!r} must name an absolute "
                              "directory, as file:///data/warehouse (three slashes, no ..)")
    elif not re.match(r"^s3a?://[^/]+", warehouse):
        raise ConfigError(f"spec.catalog.warehouse {warehouse!r} must be a file:///… path "
                          "or an s3://bucket/prefix URI")
    timeline = str(catalog.get("timeline") or timelines[0])
    if timeline not in timelines:
        raise ConfigError(f"spec.catalog.timeline {timeline!r} is not one of spec.timelines "
                          f"({', '.join(timelines)}); add it there first")
    replicas = catalog.get("replicas", 1)
    if not isinstance(replicas, int) or not 1 <= replicas <= MAX_CATALOG_REPLICAS:
        raise ConfigError(f"spec.catalog.replicas must be 1 to {MAX_CATALOG_REPLICAS}")
    token = catalog.get("tokenSecretRef") or {}
    if token and not token.get("name"):
        raise ConfigError("spec.catalog.tokenSecretRef.name is required (the Secret holding "
                          "the bearer token)")
    return CatalogSpec(
        warehouse=warehouse.rstrip("/") if warehouse.startswith("file://") else warehouse,
        timeline=timeline, replicas=replicas,
        token_secret=str(token.get("name") or ""), token_key=str(token.get("key") or "token"),
        volume=_catalog_volume(catalog.get("volume"), warehouse),
        resources=_catalog_resources(catalog.get("resources") or {}),
        io_properties=_catalog_io(catalog.get("ioProperties") or {}, warehouse),
        credentials_secret=_catalog_credentials(catalog.get("credentialsSecretRef") or {},
                                                warehouse),
        retention_s=_catalog_retention(catalog.get("retentionSeconds")))


def _catalog_retention(value: Any) -> float | None:
    if value is None:
        return None
    # A number as JSON has it (not a bool, not a string: the CRD says `type: number`); NaN and
    # infinities fail the range check.
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 <= value <= MAX_CATALOG_RETENTION_S:
        raise ConfigError(f"spec.catalog.retentionSeconds must be a number of seconds from 0 "
                          f"to {MAX_CATALOG_RETENTION_S} (ten years), not {value!r}")
    return float(value)


# A FileIO setting's name; never one that starts with '-' (it would be read as a flag).
_IO_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _catalog_io(properties: Mapping[str, Any], warehouse: str) -> tuple[tuple[str, str], ...]:
    if properties and warehouse.startswith("file://"):
        raise ConfigError("spec.catalog.ioProperties are an object store's settings; a file:// "
                          "warehouse takes none")
    out = []
    for key, value in sorted(properties.items()):
        if not _IO_KEY.match(str(key)):
            raise ConfigError(f"spec.catalog.ioProperties: {key!r} is not a FileIO setting's "
                              "name (letters, digits, '.', '_' and '-', for example "
                              "s3.endpoint)")
        if names_a_secret(str(key)):
            raise ConfigError(f"spec.catalog.ioProperties.{key} would put a credential in the "
                              "resource, where anyone who reads it sees it: put it in the "
                              "Secret of spec.catalog.credentialsSecretRef (as "
                              "AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN for S3)")
        out.append((str(key), str(value)))
    return tuple(out)


def _catalog_credentials(ref: Mapping[str, Any], warehouse: str) -> str:
    if not ref:
        return ""
    if warehouse.startswith("file://"):
        raise ConfigError("spec.catalog.credentialsSecretRef is for an object store; a file:// "
                          "warehouse needs none")
    name = str(ref.get("name") or "")
    if not name or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise ConfigError(f"spec.catalog.credentialsSecretRef.name {name!r} is not a Secret "
                          "name")
    return name


def _catalog_volume(volume: Mapping[str, Any] | None, warehouse: str) -> CatalogVolume | None:
    if not warehouse.startswith("file://"):
        if volume:
            raise ConfigError("spec.catalog.volume is only for file:// warehouses; an object "
                              "store needs none")
        return None
    if not volume:
        raise ConfigError("spec.catalog.volume is required for a file:// warehouse: the "
                          "catalog's pods need the directory (hostPath: a node directory, or "
                          "claimName: a PersistentVolumeClaim)")
    host_path, claim = str(volume.get("hostPath") or ""), str(volume.get("claimName") or "")
    if bool(host_path) == bool(claim):
        raise ConfigError("spec.catalog.volume needs exactly one of hostPath and claimName")
    if host_path and not host_path.startswith("/"):
        raise ConfigError(f"spec.catalog.volume.hostPath {host_path!r} must be an absolute "
                          "path on the node")
    if claim and (len(claim) > 253 or not _DNS_SUBDOMAIN.match(claim)):
        raise ConfigError(f"spec.catalog.volume.claimName {claim!r} is not a "
                          "PersistentVolumeClaim name")
    return CatalogVolume(host_path=host_path, claim_name=claim)


def _catalog_resources(resources: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for kind in ("requests", "limits"):
        for name, value in (resources.get(kind) or {}).items():
            text = str(value)
            if isinstance(value, bool) or not _QUANTITY.match(text):
                raise ConfigError(f"spec.catalog.resources.{kind}.{name} {text!r} is not a "
                                  "quantity (for example 250m, 1, 256Mi)")
            out.setdefault(kind, {})[str(name)] = text
    return out


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
    return read_secret_text_sync(api, namespace, name, key).strip()


def read_secret_text_sync(api: ApiClient, namespace: str, name: str, key: str) -> str:
    """The backend Secret's value as it is stored (pods that take it as an environment
    variable see it so, blanks included). Errors name the Secret and key, never the value."""
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
        return base64.b64decode(data).decode()
    except (ValueError, UnicodeDecodeError):
        raise SecretProblem("BadURL", f"Secret {namespace}/{name} key {key!r} is not "
                            "UTF-8 text") from None

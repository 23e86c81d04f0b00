"""The Iceberg catalog a TimestampOracle runs (spec.catalog): its Deployment and Service as
plain dicts, built by pure functions (`desired`), and what a pass found of them (`Seen`).

The pods run `tsoracle catalog serve` from the operator's own image. The backend URL reaches
them only as an environment variable taken from the resource's Secret (never in arguments, the
pod spec or a log); the schema is appended by Kubernetes' own `$(VAR)` expansion, with the
separator the Secret's URL needs (`url_suffix`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from tsoracle.errors import ConfigError
from tsoracle.operator.ownership import Owner
from tsoracle.resource import GROUP, KIND, VERSION, CatalogSpec, OracleSpec
from tsoracle.store import parse_url, url_with_schema

HTTP_PORT = 8181
METRICS_PORT = 9090
TOKEN_DIR = "/etc/tsoracle/catalog-token"
FIELD_MANAGER = "tsoracle-operator"
# On the Deployment and the Service (not the pod template: a new value must not restart pods):
# the digest of what the operator applied, so a pass applies only what changed.
DIGEST_ANNOTATION = "tsoracle.io/applied-digest"
APP_NAME = "tsoracle-catalog"
UID = 65532  # the image's user (images.toml, the chart's runAsUser)
# The Secret's value, as the kubelet reads it; TSORACLE_URL, what `tsoracle` reads, adds the
# resource's schema to it.
SECRET_ENV, URL_ENV = "TSORACLE_BACKEND_URL", "TSORACLE_URL"
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def name_of(owner: Owner) -> str:
    """The Deployment's and the Service's name."""
    return f"{owner.name}-catalog"


def valid_name(owner: Owner) -> bool:
    """Whether name_of(owner) can name a Service (an RFC 1035 label)."""
    name = name_of(owner)
    return len(name) <= 63 and bool(_DNS_LABEL.match(name))


def service_url(owner: Owner) -> str:
    return f"http://{name_of(owner)}.{owner.namespace}.svc:{HTTP_PORT}"


def url_suffix(stored: str, schema: str) -> str | None:
    """What to append to the Secret's value, as stored, to address `schema`; None when
    appending cannot (a URL followed by a newline, or with a #fragment). Checked with the same
    parser `tsoracle` uses, against the URL the operator itself uses."""
    try:
        want = parse_url(url_with_schema(stored.strip(), schema))
    except ConfigError:
        return None
    for suffix in ("", f"?schema={schema}", f"&schema={schema}", f" schema={schema}"):
        try:
            got = parse_url(stored + suffix)
        except ConfigError:
            continue
        if (got.kind, got.dsn, got.schema) == (want.kind, want.dsn, want.schema):
            return suffix
    return None


@dataclass(frozen=True)
class Desired:
    """The objects one resource's catalog should be, and their digest."""

    deployment: dict[str, Any]
    service: dict[str, Any]
    digest: str


def seconds_arg(seconds: float) -> str:
    """A number of seconds as an argument: 7200, not 7200.0 (nor 3.1536e+08); one spelling
    per value, so 7200 and 7200.0 in the resource make the same Deployment."""
    return str(int(seconds)) if seconds.is_integer() else repr(seconds)


def labels(owner: Owner) -> dict[str, str]:
    return {"app.kubernetes.io/name": APP_NAME, "app.kubernetes.io/instance": owner.name}


def desired(spec: OracleSpec, owner: Owner, image: str, suffix: str) -> Desired:
    """The Deployment and Service of `spec.catalog` (which must be enabled)."""
    catalog = spec.catalog
    assert catalog is not None
    meta_labels = _meta_labels(owner)
    volumes, mounts = _volumes(catalog)
    container = _container(spec, catalog, image, suffix, mounts)
    deployment = _deployment(owner, meta_labels, catalog.replicas, container, volumes)
    service = _service(owner, meta_labels)
    digest = hashlib.sha256(json.dumps([deployment, service], sort_keys=True).encode())
    for obj in (deployment, service):
        obj["metadata"]["annotations"] = {DIGEST_ANNOTATION: digest.hexdigest()[:16]}
    return Desired(deployment, service, digest.hexdigest()[:16])


def _meta_labels(owner: Owner) -> dict[str, str]:
    """The labels of the Deployment, its pods and the Service: labels(owner), and more."""
    return {**labels(owner), "app.kubernetes.io/component": "catalog",
            "app.kubernetes.io/part-of": "tsoracle",
            "app.kubernetes.io/managed-by": FIELD_MANAGER}


def _args(catalog: CatalogSpec) -> list[str]:
    """The container's arguments: `tsoracle catalog serve` and its options."""
    args = ["catalog", "serve", "--warehouse", catalog.warehouse, "--host", "0.0.0.0",
            "--port", str(HTTP_PORT), "--metrics-port", str(METRICS_PORT),
            "--timeline", catalog.timeline]
    for key, value in catalog.io_properties:
        args += ["--io-property", f"{key}={value}"]
    if catalog.retention_s is not None:
        # Only when set: a resource without it keeps its Deployment (and digest) as it was, so
        # an operator upgrade rolls no pods; a new value is a new pod template, and they roll.
        args += ["--retention", seconds_arg(catalog.retention_s)]
    if catalog.token_secret:
        args += ["--token-file", f"{TOKEN_DIR}/token"]  # mounted by _volumes
    return args


def _volumes(catalog: CatalogSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's volumes and the container's mounts of them: a scratch /tmp, the token
    Secret (when there is one) and the warehouse directory (a file:// warehouse's)."""
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": "/tmp"}]
    if catalog.token_secret:
        volumes.append({"name": "token", "secret": {
            "secretName": catalog.token_secret, "defaultMode": 0o440,
            "items": [{"key": catalog.token_key, "path": "token"}]}})
        mounts.append({"name": "token", "mountPath": TOKEN_DIR, "readOnly": True})
    if catalog.volume is not None:
        source = ({"hostPath": {"path": catalog.volume.host_path, "type": "Directory"}}
                  if catalog.volume.host_path else
                  {"persistentVolumeClaim": {"claimName": catalog.volume.claim_name}})
        volumes.append({"name": "warehouse", **source})
        mounts.append({"name": "warehouse", "mountPath": catalog.warehouse_path})
    return volumes, mounts


def _env(spec: OracleSpec, suffix: str) -> list[dict[str, Any]]:
    """The container's environment: the backend URL from the resource's Secret, and
    URL_ENV, that URL with `suffix` appended by Kubernetes' `$(VAR)` expansion."""
    return [
        {"name": SECRET_ENV, "valueFrom": {"secretKeyRef": {
            "name": spec.secret_name, "key": spec.secret_key}}},
        {"name": URL_ENV, "value": f"$({SECRET_ENV}){suffix}"},
        # libpq names the sessions: a DBA tells the catalog's from the operator's.
        {"name": "PGAPPNAME", "value": APP_NAME},
    ]


def _container(spec: OracleSpec, catalog: CatalogSpec, image: str, suffix: str,
               mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """The pod's one container, running `tsoracle catalog serve` from `image`."""
    container: dict[str, Any] = {
        "name": "catalog", "image": image, "args": _args(catalog), "env": _env(spec, suffix),
        "ports": [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        # Ready only while the database answers and the replica may take timestamps (on
        # legacy, a replica that lost the timeline to another is not): the Service then
        # sends it no requests.
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"},
                           "periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 2},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"},
                          "initialDelaySeconds": 10, "periodSeconds": 20, "timeoutSeconds": 5},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": mounts,
    }
    if catalog.credentials_secret:
        # Every key of the Secret becomes a variable (AWS_ACCESS_KEY_ID, ...): the kubelet
        # fills them in, so they are in no argument and no object the operator writes.
        container["envFrom"] = [{"secretRef": {"name": catalog.credentials_secret}}]
    if catalog.resources:
        container["resources"] = {k: dict(v) for k, v in catalog.resources.items()}
    return container


def _pod_template(meta_labels: dict[str, str], container: dict[str, Any],
                  volumes: list[dict[str, Any]]) -> dict[str, Any]:
    """The Deployment's pod template (no digest annotation: a new digest alone restarts no
    pod)."""
    return {
        "metadata": {"labels": meta_labels},
        "spec": {
            "automountServiceAccountToken": False,  # it never calls the API server
            "enableServiceLinks": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": UID,
                                "runAsGroup": UID, "fsGroup": UID,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [container],
            "volumes": volumes,
        },
    }


def _deployment(owner: Owner, meta_labels: dict[str, str], replicas: int,
                container: dict[str, Any], volumes: list[dict[str, Any]]) -> dict[str, Any]:
    """The Deployment, without its digest annotation (desired adds it)."""
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _metadata(name_of(owner), owner, meta_labels),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels(owner)},
            "template": _pod_template(meta_labels, container, volumes),
        },
    }


def _service(owner: Owner, meta_labels: dict[str, str]) -> dict[str, Any]:
    """The Service in front of the pods, without its digest annotation (desired adds it)."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _metadata(name_of(owner), owner, meta_labels),
        "spec": {"selector": labels(owner), "ports": [
            {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
            {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics",
             "protocol": "TCP"}]},
    }


def _metadata(name: str, owner: Owner, meta_labels: dict[str, str]) -> dict[str, Any]:
    # The resource owns them: deleting it deletes them (garbage collection), and
    # `kubectl get deploy` names it as their controller.
    return {"name": name, "namespace": owner.namespace, "labels": dict(meta_labels),
            "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
                                 "name": owner.name, "uid": owner.uid, "controller": True,
                                 "blockOwnerDeletion": True}]}


@dataclass(frozen=True)
class SeenObject:
    """A Deployment or Service of the catalog's name, as a pass found it."""

    controller_uid: str  # the uid its controller ownerReference names; "" for none
    digest: str  # DIGEST_ANNOTATION; "" for none
    replicas: int = 0  # a Deployment's spec.replicas
    ready_replicas: int = 0  # ... and status.readyReplicas

    @classmethod
    def of(cls, obj: dict[str, Any]) -> SeenObject:
        """From an object as the API server returns it (JSON field names)."""
        meta = obj.get("metadata") or {}
        controller: dict[str, Any] = next((r for r in meta.get("ownerReferences") or []
                           if r.get("controller")), {})
        return cls(controller_uid=str(controller.get("uid") or ""),
                   digest=str((meta.get("annotations") or {}).get(DIGEST_ANNOTATION) or ""),
                   replicas=int((obj.get("spec") or {}).get("replicas") or 0),
                   ready_replicas=int((obj.get("status") or {}).get("readyReplicas") or 0))


@dataclass(frozen=True)
class Seen:
    """The catalog's objects as a pass found them (None: there is none of that name)."""

    deployment: SeenObject | None = None
    service: SeenObject | None = None

    def foreign(self, owner: Owner) -> str:
        """The kind of an object of the catalog's name that this resource does not control."""
        for kind, obj in (("Deployment", self.deployment), ("Service", self.service)):
            if obj is not None and obj.controller_uid != owner.uid:
                return kind
        return ""

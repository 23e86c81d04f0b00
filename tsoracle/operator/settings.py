"""The operator's settings: one frozen object, read once at start-up, then handed to the handlers
through kopf's memo. The only place that reads the environment the chart sets."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

LEASE_NAMESPACE_ENV, LEASE_NAME_ENV = "TSORACLE_LEASE_NAMESPACE", "TSORACLE_LEASE_NAME"
LEASE_OWNER_ENV = "TSORACLE_LEASE_OWNER"  # the operator's Deployment (set by the chart)
# For `kopf run -m tsoracle.operator`: kopf does not hand its --namespace to start-up handlers,
# and the start-up probe needs them (comma-separated; empty: cluster-wide).
WATCH_NAMESPACES_ENV = "TSORACLE_WATCH_NAMESPACES"
# The image the catalog's pods run (spec.catalog): the chart sets it to the operator's own.
CATALOG_IMAGE_ENV = "TSORACLE_CATALOG_IMAGE"
DEFAULT_LEASE_NAME = "tsoracle-operator"


@dataclass(frozen=True)
class OperatorSettings:
    namespaces: tuple[str, ...] = ()  # the namespaces watched (as given); none: cluster-wide
    lease_namespace: str | None = None  # where the Lease lives; None: run alone, no Lease
    lease_name: str = DEFAULT_LEASE_NAME
    lease_owner: str | None = None  # the Deployment the Lease names as its owner
    retry_s: float = 5.0  # the next pass after a degraded one, or a failed API call
    pool_size: int = 4  # connections per database, shared by every resource that uses it
    catalog_image: str = ""  # what spec.catalog's pods run; "": catalogs cannot be run


def from_environment(environ: Mapping[str, str] = os.environ) -> OperatorSettings:
    """What `kopf run -m tsoracle.operator` runs with: the environment alone."""
    return OperatorSettings(
        namespaces=tuple(n for n in environ.get(WATCH_NAMESPACES_ENV, "").split(",") if n),
        lease_namespace=environ.get(LEASE_NAMESPACE_ENV) or None,
        lease_name=environ.get(LEASE_NAME_ENV) or DEFAULT_LEASE_NAME,
        lease_owner=environ.get(LEASE_OWNER_ENV) or None,
        catalog_image=environ.get(CATALOG_IMAGE_ENV, "").strip(),
    )


def for_command(*, namespaces: Sequence[str], lease_namespace: str | None,
                lease_name: str | None,
                environ: Mapping[str, str] = os.environ) -> OperatorSettings:
    """What `tsoracle operator` runs with: its flags, then the environment. In a pod the chart
    sets POD_NAMESPACE (the Lease's namespace) and TSORACLE_LEASE_OWNER."""
    env = from_environment(environ)
    return dataclasses.replace(
        env,
        namespaces=tuple(namespaces),
        lease_namespace=(lease_namespace or env.lease_namespace
                         or environ.get("POD_NAMESPACE") or None),
        lease_name=lease_name or env.lease_name,
    )

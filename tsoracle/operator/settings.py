"""The operator's settings: one frozen object, read once at start-up, then handed to the handlers
through kopf's memo. The only place that reads the environment the chart sets."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from tsoracle.errors import ConfigError

LEASE_NAMESPACE_ENV, LEASE_NAME_ENV = "TSORACLE_LEASE_NAMESPACE", "TSORACLE_LEASE_NAME"
LEASE_OWNER_ENV = "TSORACLE_LEASE_OWNER"  # the operator's Deployment (set by the chart)
# For `kopf run -m tsoracle.operator`: kopf does not hand its --namespace to start-up handlers,
# and the start-up probe needs them (comma-separated; empty: cluster-wide).
WATCH_NAMESPACES_ENV = "TSORACLE_WATCH_NAMESPACES"
# The image the catalog's pods run (spec.catalog): the chart sets it to the operator's own.
CATALOG_IMAGE_ENV = "TSORACLE_CATALOG_IMAGE"
DEFAULT_LEASE_NAME = "tsoracle-operator"
N = TypeVar("N", int, float)
# kopf's watch requests (the chart sets them from values `watch.*`).
WATCH_SERVER_TIMEOUT_ENV = "TSORACLE_WATCH_SERVER_TIMEOUT_SECONDS"
WATCH_CLIENT_TIMEOUT_ENV = "TSORACLE_WATCH_CLIENT_TIMEOUT_SECONDS"
WATCH_CONNECT_TIMEOUT_ENV = "TSORACLE_WATCH_CONNECT_TIMEOUT_SECONDS"


@dataclass(frozen=True)
class WatchTimeouts:
    """kopf's `settings.watching`. Without a client timeout a watch stream that goes silent
    without closing (an API server replica lost behind a load balancer) never delivers another
    event, and a spec change waits for the next periodic pass, which reads the same stale body.
    The server ends every watch after `server_s` (kopf then watches again from the last
    resourceVersion); the client gives up `client_s` after the request began, so a silent stream
    is replaced at most `client_s` after it was opened."""

    # Whole seconds: kopf sends it as the request's timeoutSeconds, and the API server answers
    # "60.0" with 400 Bad Request. Its own default is a random 30-60 minutes. Short: a silent
    # stream hides changes for up to twice client_s (docs/operator.md), and a re-watch from the
    # last resourceVersion is cheap.
    server_s: int = 60
    client_s: float = 90.0  # above server_s: a healthy stream is ended by the server first
    connect_s: float = 30.0  # TCP and TLS to the API server

    def __post_init__(self) -> None:
        for env, value in ((WATCH_SERVER_TIMEOUT_ENV, self.server_s),
                           (WATCH_CLIENT_TIMEOUT_ENV, self.client_s),
                           (WATCH_CONNECT_TIMEOUT_ENV, self.connect_s)):
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"${env} must be a positive number of seconds, not {value!r}")
        if self.client_s <= self.server_s:
            raise ConfigError(f"${WATCH_CLIENT_TIMEOUT_ENV} ({self.client_s:g}) must be above "
                              f"${WATCH_SERVER_TIMEOUT_ENV} ({self.server_s:g}): a healthy "
                              "watch is ended by the server, the client only ends a silent one")


@dataclass(frozen=True)
class OperatorSettings:
    namespaces: tuple[str, ...] = ()  # the namespaces watched (as given); none: cluster-wide
    lease_namespace: str | None = None  # where the Lease lives; None: run alone, no Lease
    lease_name: str = DEFAULT_LEASE_NAME
    lease_owner: str | None = None  # the Deployment the Lease names as its owner
    retry_s: float = 5.0  # the next pass after a degraded one, or a failed API call
    pool_size: int = 4  # connections per database, shared by every resource that uses it
    catalog_image: str = ""  # what spec.catalog's pods run; "": catalogs cannot be run
    watch: WatchTimeouts = field(default_factory=WatchTimeouts)


def _seconds(environ: Mapping[str, str], name: str, default: N) -> N:
    """$name as the default's type (int: whole seconds), or the default when unset."""
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        return type(default)(text)
    except ValueError:
        whole = " whole" if isinstance(default, int) else ""
        raise ConfigError(f"${name} must be a number of{whole} seconds, not {text!r}") from None


def from_environment(environ: Mapping[str, str] = os.environ) -> OperatorSettings:
    """What `kopf run -m tsoracle.operator` runs with: the environment alone."""
    return OperatorSettings(
        namespaces=tuple(n for n in environ.get(WATCH_NAMESPACES_ENV, "").split(",") if n),
        lease_namespace=environ.get(LEASE_NAMESPACE_ENV) or None,
        lease_name=environ.get(LEASE_NAME_ENV) or DEFAULT_LEASE_NAME,
        lease_owner=environ.get(LEASE_OWNER_ENV) or None,
        catalog_image=environ.get(CATALOG_IMAGE_ENV, "").strip(),
        watch=WatchTimeouts(
            server_s=_seconds(environ, WATCH_SERVER_TIMEOUT_ENV, WatchTimeouts.server_s),
            client_s=_seconds(environ, WATCH_CLIENT_TIMEOUT_ENV, WatchTimeouts.client_s),
            connect_s=_seconds(environ, WATCH_CONNECT_TIMEOUT_ENV, WatchTimeouts.connect_s)),
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

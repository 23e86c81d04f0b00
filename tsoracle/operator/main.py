"""`tsoracle operator`: run the kopf operator with liveness and metrics endpoints."""

from __future__ import annotations

import os

import kopf
from prometheus_client import start_http_server

import tsoracle.operator  # noqa: F401  (registers the handlers)
from tsoracle.operator.settings import for_command


def run_operator(*, namespaces: list[str], liveness_port: int, metrics_port: int,
                 bind: str = "0.0.0.0", lease_namespace: str | None = None,
                 lease_name: str | None = None) -> None:
    """Reconciles only while holding the Lease (see operator/lease.py); without a lease
    namespace (flag, $TSORACLE_LEASE_NAMESPACE or $POD_NAMESPACE) it runs alone."""
    settings = for_command(namespaces=namespaces, lease_namespace=lease_namespace,
                           lease_name=lease_name)
    # libpq names the session, so a DBA sees the operator's sessions in pg_stat_activity.
    os.environ.setdefault("PGAPPNAME", "tsoracle-operator")
    kopf.configure(verbose=False)  # INFO logs in kopf's format; object bodies only at DEBUG
    if metrics_port:
        start_http_server(metrics_port, addr=bind)
    kopf.run(
        standalone=True,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=f"http://{bind}:{liveness_port}/healthz" if liveness_port else None,
        memo=kopf.Memo(settings=settings),  # handlers.configure picks them up
    )

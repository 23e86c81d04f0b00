"""`tsoracle operator`: run the kopf operator with liveness and metrics endpoints."""

from __future__ import annotations

import kopf
from prometheus_client import start_http_server

import tsoracle.operator  # noqa: F401  (registers the handlers)


def run_operator(*, namespaces: list[str], liveness_port: int, metrics_port: int,
                 bind: str = "0.0.0.0") -> None:
    """Single replica, no peering: the chart runs one pod with the Recreate strategy."""
    kopf.configure(verbose=False)  # INFO logs in kopf's format; object bodies only at DEBUG
    if metrics_port:
        start_http_server(metrics_port, addr=bind)
    kopf.run(
        standalone=True,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=f"http://{bind}:{liveness_port}/healthz" if liveness_port else None,
    )

"""Operator metrics (low rate, so plain prometheus-client objects)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter("tsoracle_operator_reconciles", "Reconcile passes", ["result"])
FAILURES = Counter("tsoracle_operator_failures", "Reconciles that ended degraded", ["reason"])
FLIPS = Counter("tsoracle_operator_flips", "Implementation flips performed", ["to"])
REWINDS = Counter("tsoracle_operator_backend_rewinds",
                  "Backends found gone back in time (restored) and moved forward")
RECONCILE_SECONDS = Histogram("tsoracle_operator_reconcile_duration_seconds",
                              "Duration of one reconcile pass")
FLIP_SECONDS = Histogram("tsoracle_operator_flip_duration_seconds",
                         "Duration of the flip transaction")
MANAGED = Gauge("tsoracle_operator_managed_oracles", "TimestampOracle resources being reconciled")
ROLLOUT = Gauge("tsoracle_operator_rollout_in_progress",
                "1 while a TimestampOracle's rollout window is open", ["namespace", "name"])

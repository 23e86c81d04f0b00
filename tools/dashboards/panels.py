"""The PromQL behind every dashboard panel and alert: one list, used to build the dashboards,
the alert rules, and the test that checks each expression returns data from a real Prometheus."""

from __future__ import annotations

R = "[1m]"

ORACLE_PANELS = [
    ("Operations/s by operation and implementation",
     f"sum by (operation, implementation) (rate(tsoracle_operations_succeeded_total{R}))",
     "ops"),
    ("Latency p50",
     "histogram_quantile(0.5, sum by (le, operation, implementation) "
     f"(rate(tsoracle_operation_duration_seconds_bucket{R})))", "s"),
    ("Latency p99",
     "histogram_quantile(0.99, sum by (le, operation, implementation) "
     f"(rate(tsoracle_operation_duration_seconds_bucket{R})))", "s"),
    ("Mean batch size",
     f"sum by (operation, implementation) (rate(tsoracle_batch_size_sum{R})) / "
     f"sum by (operation, implementation) (rate(tsoracle_batch_size_count{R}))", "short"),
    ("Backend queries/s",
     f"sum by (statement, implementation) (rate(tsoracle_backend_queries_total{R}))", "ops"),
    ("Backend retries/s",
     f"sum by (reason, implementation) (rate(tsoracle_backend_retries_total{R}))", "ops"),
    ("Failed operations/s",
     f"sum by (operation, error) (rate(tsoracle_operations_failed_total{R}))", "ops"),
    ("confirm_leadership p99",
     "histogram_quantile(0.99, sum by (le, implementation) "
     f"(rate(tsoracle_confirm_leadership_duration_seconds_bucket{R})))", "s"),
    ("Epoch", "max by (timeline) (tsoracle_epoch)", "short"),
    ("read_ts lag behind the wall clock",
     "max by (timeline) (tsoracle_read_ts_lag_milliseconds)", "ms"),
]

OPERATOR_PANELS = [
    ("Reconciles/s", "sum by (result) (rate(tsoracle_operator_reconciles_total[5m]))", "ops"),
    ("Flips (last hour)", "sum by (to) (increase(tsoracle_operator_flips_total[1h]))", "short"),
    ("Reconcile failures/s",
     "sum by (reason) (rate(tsoracle_operator_failures_total[5m]))", "ops"),
    ("Reconcile duration p99",
     "histogram_quantile(0.99, sum by (le) "
     "(rate(tsoracle_operator_reconcile_duration_seconds_bucket[5m])))", "s"),
    ("Flip duration p99",
     "histogram_quantile(0.99, sum by (le) "
     "(rate(tsoracle_operator_flip_duration_seconds_bucket[1h])))", "s"),
    ("Managed TimestampOracles", "sum(tsoracle_operator_managed_oracles)", "short"),
]

# (name, expr, for, severity, summary, runbook); ALERT_SIGNALS lists, per alert, the series its
# expression is built on: they must return data even while the alert does not fire.
ALERTS = [
    ("TsoracleOperationsFailing",
     "sum by (job, operation) (rate(tsoracle_operations_failed_total"
     "{error=~\"OracleUnavailable|NotInitialized|UnknownTimeline\"}[2m])) > 0",
     "2m", "critical", "oracle operations {{ $labels.operation }} are failing",
     "oracle-unavailable"),
    ("TsoracleReadLagGrowing",
     "deriv(max by (timeline) (tsoracle_read_ts_lag_milliseconds)[10m:30s]) > 0.5 and "
     "max by (timeline) (tsoracle_read_ts_lag_milliseconds) > 60000",
     "10m", "warning", "read_ts of {{ $labels.timeline }} falls further behind the wall clock",
     "read-lag"),
    ("TsoracleEpochFlapping", "changes(max by (timeline) (tsoracle_epoch)[30m:1m]) > 4",
     "0m", "warning", "the epoch of {{ $labels.timeline }} changed more than 4 times in 30m",
     "epoch-flapping"),
    ("TsoracleReconcileFailing",
     "sum by (reason) (rate(tsoracle_operator_failures_total[5m])) > 0",
     "10m", "warning", "operator reconciles fail: {{ $labels.reason }}", "reconcile-failing"),
    ("TsoracleRolloutStuck",
     "max by (namespace, name) (tsoracle_operator_rollout_in_progress) > 0",
     "30m", "warning", "rollout of {{ $labels.namespace }}/{{ $labels.name }} has not finished",
     "rollout-stuck"),
]

ALERT_SIGNALS = {
    "TsoracleOperationsFailing": [
        "sum by (job, operation) (rate(tsoracle_operations_failed_total[2m]))"],
    "TsoracleReadLagGrowing": ["max by (timeline) (tsoracle_read_ts_lag_milliseconds)"],
    "TsoracleEpochFlapping": ["changes(max by (timeline) (tsoracle_epoch)[30m:1m])"],
    "TsoracleReconcileFailing": [
        "sum by (reason) (rate(tsoracle_operator_failures_total[5m]))"],
    "TsoracleRolloutStuck": [
        "max by (namespace, name) (tsoracle_operator_rollout_in_progress)"],
}

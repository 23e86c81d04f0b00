"""The PromQL behind every dashboard panel and alert: one list, used to build the dashboards,
the alert rules, and the test that checks each expression returns data from a real Prometheus."""

from __future__ import annotations

from typing import NamedTuple

R = "[1m]"


class P(NamedTuple):
    """One panel. `unit` is Grafana's unit id (the dashboards); `legend` is Grafana's
    legendFormat, also used for the rendered pictures; `axis` names the y axis there (default:
    from the unit)."""

    title: str
    expr: str
    unit: str
    legend: str
    axis: str = ""


OI = "{{operation}} {{implementation}}"

ORACLE_PANELS = [
    P("Operations/s by operation and implementation",
      f"sum by (operation, implementation) (rate(tsoracle_operations_succeeded_total{R}))",
      "ops", OI),
    P("Latency p50",
      "histogram_quantile(0.5, sum by (le, operation, implementation) "
      f"(rate(tsoracle_operation_duration_seconds_bucket{R})))", "s", OI),
    P("Latency p99",
      "histogram_quantile(0.99, sum by (le, operation, implementation) "
      f"(rate(tsoracle_operation_duration_seconds_bucket{R})))", "s", OI),
    P("Mean batch size",
      f"sum by (operation, implementation) (rate(tsoracle_batch_size_sum{R})) / "
      f"sum by (operation, implementation) (rate(tsoracle_batch_size_count{R}))", "short", OI,
      "callers per backend query"),
    P("Backend queries/s",
      f"sum by (statement, implementation) (rate(tsoracle_backend_queries_total{R}))", "ops",
      "{{statement}} {{implementation}}"),
    P("Backend retries/s",
      f"sum by (reason, implementation) (rate(tsoracle_backend_retries_total{R}))", "ops",
      "{{reason}} {{implementation}}"),
    P("Failed operations/s",
      f"sum by (operation, error) (rate(tsoracle_operations_failed_total{R}))", "ops",
      "{{operation}} {{error}}"),
    P("confirm_leadership p99",
      "histogram_quantile(0.99, sum by (le, implementation) "
      f"(rate(tsoracle_confirm_leadership_duration_seconds_bucket{R})))", "s",
      "{{implementation}}"),
    P("Epoch", "max by (timeline) (tsoracle_epoch)", "short", "{{timeline}}", "epoch"),
    P("read_ts lag behind the wall clock",
      "max by (timeline) (tsoracle_read_ts_lag_milliseconds)", "ms", "{{timeline}}"),
]

# Flips in the last hour: increase() over a counter child that appeared within the window
# misses its first flip (the child is created by that flip, so there is no earlier 0), so such
# a child counts its whole value; a child that existed an hour ago counts its increase.
FLIPS = "tsoracle_operator_flips_total"
# The operator reconciles every few seconds per resource: two minutes hold enough passes.
RO = "[2m]"

OPERATOR_PANELS = [
    P("Reconciles/s", f"sum by (result) (rate(tsoracle_operator_reconciles_total{RO}))", "ops",
      "{{result}}"),
    P("Flips (last hour)",
      f"sum((increase({FLIPS}[1h]) and {FLIPS} offset 1h) or {FLIPS}) or vector(0)", "short",
      "flips", "flips"),
    P("Reconcile failures/s",
      f"sum by (reason) (rate(tsoracle_operator_failures_total{RO}))", "ops", "{{reason}}"),
    P("Reconcile duration p99",
      "histogram_quantile(0.99, sum by (le) "
      f"(rate(tsoracle_operator_reconcile_duration_seconds_bucket{RO})))", "s", "p99"),
    P("Flip duration p99",
      "histogram_quantile(0.99, sum by (le) "
      "(rate(tsoracle_operator_flip_duration_seconds_bucket[1h])))", "s", "p99"),
    P("Managed TimestampOracles", "sum(tsoracle_operator_managed_oracles)", "short",
      "resources", "resources"),
]

# The catalog's commit routes (`route` is the path template): a table's commits and
# multi-table transactions. The table's route also answers loads (GET), so its latency mixes
# both until the catalog's histogram has a method label.
COMMIT_ROUTES = (r'route=~"/v1/namespaces/\\{namespace\\}/tables/\\{table\\}'
                 r'|/v1/transactions/commit"')
RC = "{{route}}"

CATALOG_PANELS = [
    P("Catalog commits/s", f"sum(rate(tsoracle_catalog_commits_total{R}))", "ops", "commits",
      "commits per second"),
    P("Commit latency p50",
      "histogram_quantile(0.5, sum by (le, route) "
      f"(rate(tsoracle_catalog_request_seconds_bucket{{{COMMIT_ROUTES}}}{R})))", "s", RC),
    P("Commit latency p99",
      "histogram_quantile(0.99, sum by (le, route) "
      f"(rate(tsoracle_catalog_request_seconds_bucket{{{COMMIT_ROUTES}}}{R})))", "s", RC),
    P("Commit conflicts/s (retried at a fresh timestamp)",
      f"sum by (kind) (rate(tsoracle_catalog_conflicts_total{R}))", "ops", "{{kind}}"),
    P("Commit retries/s", f"sum(rate(tsoracle_catalog_commit_retries_total{R}))", "ops",
      "retries", "retries per second"),
    P("Failed requests/s by status",
      "sum by (route, status) "
      f"(rate(tsoracle_catalog_request_seconds_count{{status!~\"2..\"}}{R}))", "ops",
      "{{status}} {{route}}"),
]

# (name, expr, for, severity, summary, runbook, description); ALERT_SIGNALS lists, per
# alert, the series its expression is built on: they must return data even while the alert
# does not fire.
ALERTS = [
    ("TsoracleOperationsFailing",
     "sum by (job, operation) (rate(tsoracle_operations_failed_total"
     "{error=~\"OracleUnavailable|NotInitialized|UnknownTimeline\"}[2m])) > 0",
     "2m", "critical", "oracle operations {{ $labels.operation }} are failing",
     "oracle-unavailable",
     "{{ $labels.job }} fails {{ $labels.operation }} calls: the oracle's database "
     "cannot be reached, its schema is not provisioned (`tsoracle init`), or the "
     "timeline is unknown; the errors' messages say which"),
    ("TsoracleReadLagGrowing",
     "deriv(max by (timeline) (tsoracle_read_ts_lag_milliseconds)[10m:30s]) > 0.5 and "
     "max by (timeline) (tsoracle_read_ts_lag_milliseconds) > 60000",
     "10m", "warning", "read_ts of {{ $labels.timeline }} falls further behind the wall clock",
     "read-lag",
     "timestamps of {{ $labels.timeline }} are handed out but not applied: read_ts "
     "is over a minute behind the wall clock and falling further behind (a writer "
     "that stopped between write_ts and apply_write, or applies that fail)"),
    ("TsoracleEpochFlapping", "changes(max by (timeline) (tsoracle_epoch)[30m:1m]) > 4",
     "0m", "warning", "the epoch of {{ $labels.timeline }} changed more than 4 times in 30m",
     "epoch-flapping",
     "every flip or legacy take-over of {{ $labels.timeline }} fences its clients, "
     "and it happened more than 4 times in 30 minutes: look for two operators, "
     "scripts or legacy leaders flipping against each other"),
    ("TsoracleReconcileFailing",
     "sum by (reason) (rate(tsoracle_operator_failures_total[5m])) > 0",
     "10m", "warning", "operator reconciles fail: {{ $labels.reason }}", "reconcile-failing",
     "the operator's passes have ended Degraded with reason {{ $labels.reason }} for "
     "10 minutes; `kubectl tsoracle status` shows the message"),
    ("TsoracleRolloutStuck",
     "max by (namespace, name) (tsoracle_operator_rollout_in_progress) > 0",
     "30m", "warning", "rollout of {{ $labels.namespace }}/{{ $labels.name }} has not finished",
     "rollout-stuck",
     "the Rollout fencing window of {{ $labels.namespace }}/{{ $labels.name }} has "
     "been open for 30 minutes; the operator ends it after "
     "spec.rolloutWindowSeconds: check that it runs and holds its Lease"),
    # Every refusal is a writer or reader stopped by a database that went back in time: at once.
    ("TsoracleTimestampFallback",
     "sum by (job, timeline) (increase(tsoracle_timestamp_fallback_total[5m])) > 0",
     "0m", "critical",
     "timestamps of {{ $labels.timeline }} went back (a restored database?): calls are refused",
     "timestamp-fallback",
     "{{ $labels.job }} was answered a timestamp of {{ $labels.timeline }} below one "
     "it already saw, and refuses every call on it until the timeline is moved "
     "forward above what clients saw: the operator does it within a pass; without "
     "it, `tsoracle advance`"),
    # The operator repaired a restored database by itself: someone should know, and check what
    # the repair cannot cover (the runbook). Fires at once and stays for half an hour.
    ("TsoracleBackendRewound",
     "sum by (job) (increase(tsoracle_operator_backend_rewinds_total[30m])) > 0",
     "0m", "warning", "the operator moved a restored oracle database forward",
     "backend-rewound",
     "the operator found the database of a TimestampOracle gone back in time (restored "
     "from a backup or to an earlier point) and moved its timelines above the resource's "
     "high-water mark, with a new epoch: the BackendRewound Event names the resource; "
     "check what was handed out between the restore and the repair"),
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
    "TsoracleTimestampFallback": [
        "sum by (job, timeline) (increase(tsoracle_timestamp_fallback_total[5m]))"],
    "TsoracleBackendRewound": [
        "sum by (job) (increase(tsoracle_operator_backend_rewinds_total[30m]))"],
}

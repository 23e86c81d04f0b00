"""Prometheus metrics of the oracle. Children are bound once per oracle, off the hot path."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

OPERATIONS = ("write_ts", "peek_write_ts", "read_ts", "apply_write", "confirm_leadership")
_LATENCY_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0,
)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)

STARTED = Counter(
    "tsoracle_operations_started", "Oracle operations started", ["operation", "implementation"]
)
SUCCEEDED = Counter(
    "tsoracle_operations_succeeded", "Oracle operations that returned a result",
    ["operation", "implementation"],
)
FAILED = Counter(
    "tsoracle_operations_failed", "Oracle operations that raised, by error type",
    ["operation", "implementation", "error"],
)
LATENCY = Histogram(
    "tsoracle_operation_duration_seconds", "Latency of oracle operations as callers see it",
    ["operation", "implementation"], buckets=_LATENCY_BUCKETS,
)
BATCH_SIZE = Histogram(
    "tsoracle_batch_size", "Callers answered by one shared backend call",
    ["operation", "implementation"], buckets=_BATCH_BUCKETS,
)
BACKEND_QUERIES = Counter(
    "tsoracle_backend_queries", "Statements sent to the backend", ["statement", "implementation"]
)
RETRIES = Counter(
    "tsoracle_backend_retries", "Backend calls retried after a transient failure",
    ["reason", "implementation"],
)
CONFIRM_LATENCY = Histogram(
    "tsoracle_confirm_leadership_duration_seconds",
    "Latency of confirm_leadership as callers see it", ["implementation"],
    buckets=_LATENCY_BUCKETS,
)
EPOCH = Gauge("tsoracle_epoch", "Deployment epoch this process opened under", ["timeline"])
LEADER_EPOCH = Gauge(
    "tsoracle_leader_epoch", "Legacy leader epoch held by this process", ["timeline"]
)
READ_LAG = Gauge(
    "tsoracle_read_ts_lag_milliseconds",
    "Wall clock minus the last read_ts returned (EpochMilliseconds timeline)", ["timeline"],
)
FENCED = Counter("tsoracle_fenced", "Times this process found itself fenced", ["implementation"])


def serve_metrics(port: int, addr: str = "127.0.0.1") -> int:
    """Serve /metrics on a background thread; port 0 picks a free port, which is returned."""
    server, _thread = start_http_server(port, addr=addr)
    return int(server.server_address[1])

"""Prometheus metrics of the oracle, cheap enough for the hot path.

prometheus-client takes a lock and walks Python objects on every `inc`/`observe`, which cost more
than a batched `read_ts` itself. Here each oracle owns plain-number children that only its event
loop touches (no locks needed); one collector adds them up when Prometheus scrapes.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from tsoracle.oracle.operations import NAMES

OPERATIONS = NAMES  # oracle/operations.py declares them
LATENCY_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class HistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value


class Family:
    """A labelled counter, histogram or gauge whose children are plain numbers."""

    def __init__(self, name: str, doc: str, labelnames: tuple[str, ...], kind: str,
                 buckets: tuple[float, ...] = ()) -> None:
        self.name, self.doc, self.labelnames, self.kind = name, doc, labelnames, kind
        self.buckets = buckets
        self._children: list[tuple[tuple[str, ...], Any]] = []
        self._gauges: dict[tuple[str, ...], float] = {}
        self._shared: dict[tuple[str, ...], CounterChild] = {}
        self._lock = threading.Lock()

    def labels(self, *values: str) -> Any:
        """A new child for one owner (an oracle); several children of one label set add up."""
        child = CounterChild() if self.kind == "counter" else HistogramChild(self.buckets)
        with self._lock:
            self._children.append((tuple(values), child))
        return child

    def inc(self, *values: str, amount: float = 1.0) -> None:
        """Count a rare event (errors, retries) on one shared child per label set."""
        key = tuple(values)
        with self._lock:
            child = self._shared.get(key)
            if child is None:
                child = self._shared[key] = CounterChild()
                self._children.append((key, child))
            child.inc(amount)

    def set(self, labels: tuple[str, ...], value: float) -> None:
        self._gauges[labels] = value  # one dict store: atomic under the GIL

    def total(self, **match: str) -> float:
        """Sum of a counter's children whose labels match `match`."""
        idx = {name: self.labelnames.index(name) for name in match}
        with self._lock:
            return sum(c.value for k, c in self._children
                       if all(k[i] == match[n] for n, i in idx.items()))

    def collect(self) -> Metric:
        with self._lock:
            children = list(self._children)
        if self.kind == "gauge":
            g = GaugeMetricFamily(self.name, self.doc, labels=self.labelnames)
            for key, v in list(self._gauges.items()):
                g.add_metric(list(key), v)
            return g
        if self.kind == "counter":
            sums: dict[tuple[str, ...], float] = {}
            for key, c in children:
                sums[key] = sums.get(key, 0.0) + c.value
            m = CounterMetricFamily(self.name, self.doc, labels=self.labelnames)
            for key, v in sums.items():
                m.add_metric(list(key), v)
            return m
        merged: dict[tuple[str, ...], tuple[list[int], float]] = {}
        for key, c in children:
            counts, total = merged.get(key, ([0] * len(c.counts), 0.0))
            merged[key] = ([a + b for a, b in zip(counts, c.counts, strict=True)], total + c.sum)
        h = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
        for key, (counts, total) in merged.items():
            cumulative, running = [], 0
            for bound, n in zip([*map(str, self.buckets), "+Inf"], counts, strict=True):
                running += n
                cumulative.append((bound, running))
            h.add_metric(list(key), cumulative, sum_value=total)
        return h


class _Collector:
    def __init__(self, families: list[Family]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        for family in self.families:
            yield family.collect()


OP_LABELS = ("operation", "implementation")
STARTED = Family("tsoracle_operations_started", "Oracle operations started", OP_LABELS,
                 "counter")
SUCCEEDED = Family("tsoracle_operations_succeeded", "Oracle operations that returned a result",
                   OP_LABELS, "counter")
FAILED = Family("tsoracle_operations_failed", "Oracle operations that raised, by error type",
                ("operation", "implementation", "error"), "counter")
LATENCY = Family("tsoracle_operation_duration_seconds",
                 "Latency of oracle operations as callers see it", OP_LABELS, "histogram",
                 LATENCY_BUCKETS)
BATCH_SIZE = Family("tsoracle_batch_size", "Callers answered by one shared backend call",
                    OP_LABELS, "histogram", BATCH_BUCKETS)
BACKEND_QUERIES = Family("tsoracle_backend_queries", "Statements sent to the backend",
                         ("statement", "implementation"), "counter")
RETRIES = Family("tsoracle_backend_retries", "Backend calls retried after a transient failure",
                 ("reason", "implementation"), "counter")
CONFIRM_LATENCY = Family("tsoracle_confirm_leadership_duration_seconds",
                         "Latency of confirm_leadership as callers see it", ("implementation",),
                         "histogram", LATENCY_BUCKETS)
FENCED = Family("tsoracle_fenced", "Times this process found itself fenced", ("implementation",),
                "counter")
EPOCH = Family("tsoracle_epoch", "Deployment epoch this process opened under", ("timeline",),
               "gauge")
LEADER_EPOCH = Family("tsoracle_leader_epoch", "Legacy leader epoch held by this process",
                      ("timeline",), "gauge")
READ_LAG = Family("tsoracle_read_ts_lag_milliseconds",
                  "Wall clock minus the last read_ts returned (EpochMilliseconds timeline)",
                  ("timeline",), "gauge")
FALLBACK = Family("tsoracle_timestamp_fallback",
                  "Answers refused because the database went below a timestamp this process saw "
                  "(a restore?)", ("timeline",), "counter")

REGISTRY.register(_Collector([STARTED, SUCCEEDED, FAILED, LATENCY, BATCH_SIZE, BACKEND_QUERIES,
                              RETRIES, CONFIRM_LATENCY, FENCED, EPOCH, LEADER_EPOCH, READ_LAG,
                              FALLBACK]))


def serve_metrics(port: int, addr: str = "127.0.0.1") -> int:
    """Serve /metrics on a background thread; port 0 picks a free port, which is returned."""
    server, _thread = start_http_server(port, addr=addr)
    return int(server.server_address[1])

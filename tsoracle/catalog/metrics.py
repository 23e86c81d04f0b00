"""The catalog's Prometheus metrics (served by `--metrics-port`, beside the oracle's)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

COMMITS = Counter("tsoracle_catalog_commits_total",
                  "Commits (one table, several tables, or DDL) the catalog acknowledged")
CONFLICTS = Counter("tsoracle_catalog_conflicts_total",
                    "Commit attempts that landed nothing and took a fresh timestamp: another "
                    "commit moved the table (moved) or the timeline's upper (superseded)",
                    ["kind"])
RETRIES = Counter("tsoracle_catalog_commit_retries_total",
                  "Commit attempts retried inside the catalog at a fresh timestamp")
REQUESTS = Histogram("tsoracle_catalog_request_seconds",
                     "Requests by route and status, in seconds", ["route", "status"],
                     buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
                              5, 10))
GROUP_SIZE = Histogram("tsoracle_catalog_group_commits",
                       "Commits landed together in one transaction at one timestamp",
                       buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))

# Every kind exported from the start (at 0): a rate over a series that does not exist yet is no
# data, not zero, and dashboards and alerts would read it as a scrape that failed.
for _kind in ("moved", "superseded"):
    CONFLICTS.labels(_kind)

"""Database round trips and statements per catalog commit.

Round trips are counted on the wire: the catalog reaches PostgreSQL through a relay
(`tsoracle_dev.pgfaults.LossyRelay`, losing nothing) that counts the server's replies, one per
round trip (each ends in ReadyForQuery). Statements are counted by PostgreSQL's
pg_stat_statements; a group sent at once (pipeline mode) is several statements in one round
trip. The oracle's `write_ts` and `apply_write` count with them. Two shapes: property commits
one after another (each its own group), and `--writers` clients committing to one table at
once (commits that queue together share a group).

    python bench/catalog_round_trips.py --commits 200 --writers 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

SCHEMA = {"type": "struct", "schema-id": 0,
          "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}


def call(base: str, method: str, path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, method=method)
    with urllib.request.urlopen(request, timeout=60) as reply:
        text = reply.read()
        return json.loads(text) if text else None


def commit(base: str, value: str) -> int:
    """One property commit; returns its W (the metadata's last-updated-ms)."""
    body = call(base, "POST", "/v1/namespaces/rt/tables/t", {
        "updates": [{"action": "set-properties", "updates": {"k": value}}]})
    return int(body["metadata"]["last-updated-ms"])


def statements(pg: Any) -> dict[str, int]:
    """Calls per statement (normalised text) since the last reset, the stats' own left out."""
    rows = pg.sql("SELECT query, calls FROM pg_stat_statements"
                  " WHERE query NOT LIKE '%pg_stat_statements%'")
    return {str(q): int(c) for q, c in rows}


def measure(pg: Any, work: Path, commits: int, writers: int) -> dict[str, Any]:
    import tsoracle
    from tsoracle.catalog.serve import CatalogConfig, RunningCatalog
    from tsoracle_dev.pgfaults import LossyRelay

    relay = LossyRelay(pg.port)
    url = relay.url(f"{pg.url()}?schema=round_trips")
    asyncio.run(tsoracle.init(url))
    report: dict[str, Any] = {}
    with RunningCatalog(CatalogConfig(url=url, warehouse=str(work / "wh"), port=0)) as cat:
        call(cat.url, "POST", "/v1/namespaces", {"namespace": ["rt"]})
        call(cat.url, "POST", "/v1/namespaces/rt/tables", {"name": "t", "schema": SCHEMA})
        for i in range(20):  # warm: the pools' connections, prepared statements
            commit(cat.url, f"w{i}")
        pg.sql("SELECT pg_stat_statements_reset()")
        before = relay.delivered
        stamps = {commit(cat.url, str(i)) for i in range(commits)}
        report["sequential"] = summary(statements(pg), relay.delivered - before, commits,
                                       len(stamps))
        pg.sql("SELECT pg_stat_statements_reset()")
        before = relay.delivered
        seen: set[int] = set()
        lock = threading.Lock()

        def writer(w: int) -> None:
            for i in range(commits // writers):
                ts = commit(cat.url, f"{w}.{i}")
                with lock:
                    seen.add(ts)

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        report[f"{writers} writers, one table"] = summary(
            statements(pg), relay.delivered - before, commits // writers * writers, len(seen))
    relay.close()
    return report


def summary(counts: dict[str, int], trips: int, commits: int, groups: int) -> dict[str, Any]:
    total = sum(counts.values())
    top = sorted(counts.items(), key=lambda kv: -kv[1])
    return {"commits": commits, "groups": groups, "statements": total,
            "per_commit": round(total / commits, 2), "per_group": round(total / groups, 2),
            "round_trips": trips, "trips_per_commit": round(trips / commits, 2),
            "trips_per_group": round(trips / groups, 2),
            "by_statement": {q[:90]: round(c / groups, 2) for q, c in top}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--commits", type=int, default=200, help="commits per shape")
    p.add_argument("--writers", type=int, default=8, help="clients on one table at once")
    p.add_argument("--json", help="write the report here")
    a = p.parse_args()
    from tsoracle_dev.localpg import LocalPostgres

    with LocalPostgres.temporary("round-trips-") as pg:
        report = measure(pg, pg.base.parent, a.commits, a.writers)
    for shape, r in report.items():
        print(f"{shape}: {r['commits']} commits in {r['groups']} groups; round trips "
              f"{r['trips_per_commit']} per commit, {r['trips_per_group']} per group; "
              f"statements {r['per_commit']} per commit, {r['per_group']} per group")
        for query, calls in r["by_statement"].items():
            print(f"    {calls:6.2f} per group  {query}")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

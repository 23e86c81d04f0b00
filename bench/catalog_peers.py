"""tsoracle's REST catalog beside Iceberg's own REST server, on one PostgreSQL, one client.

The peer is Iceberg's `RESTCatalogServer` (the test-fixtures jar of `iceberg-open-api`, the
server the REST Compatibility Kit runs against) over its `JdbcCatalog`, with its rows in a
schema of the same PostgreSQL server as tsoracle's. Both are driven by the same client, cell by
cell, tsoracle then the peer, for `--rounds` rounds; each cell's best round is reported.

Cells (the shape of the public catalog-commit benchmarks):
- `sequential`: set-properties commits with an assert-table-uuid requirement, one client;
- `one-table`: the same, `--writers` clients on one table;
- `distinct`: the same, `--distinct` clients, a table each;
- `append-1`, `append-N`: appends of one row through pyiceberg's RestCatalog (a Parquet
  file, a manifest and a manifest list written by the client), 1 and `--writers` clients on
  one table; pyiceberg's own commit retries off on both.

A 409 is counted as a conflict and not retried (what a client sees); only 200s count as
commits. Needs Java and Maven (the kit's jars, tsoracle_dev.rck) and PostgreSQL's binaries.

    python bench/catalog_peers.py --json docs/data/catalog-peers.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa

SCHEMA = {"type": "struct", "schema-id": 0,
          "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
NO_RETRIES = {"commit.retry.num-retries": "0"}


class Client:
    """One keep-alive HTTP connection, JSON in and out."""

    def __init__(self, base: str) -> None:
        where = urlsplit(base)
        self.conn = http.client.HTTPConnection(where.hostname or "", where.port, timeout=60)

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        self.conn.request(method, path, body=data,
                          headers={"Content-Type": "application/json"} if data else {})
        reply = self.conn.getresponse()
        text = reply.read()
        return reply.status, json.loads(text) if text else None

    def close(self) -> None:
        self.conn.close()


def make_table(base: str, name: str) -> str:
    """A table `peers.<name>` (the namespace made if missing); returns its UUID."""
    client = Client(base)
    try:
        client.call("POST", "/v1/namespaces", {"namespace": ["peers"]})
        status, body = client.call("POST", "/v1/namespaces/peers/tables",
                                   {"name": name, "schema": SCHEMA, "properties": NO_RETRIES})
        if status != 200:
            raise RuntimeError(f"creating peers.{name} at {base}: {status} {body}")
        return str(body["metadata"]["table-uuid"])
    finally:
        client.close()


def run_cell(workers: list[Callable[[], bool]], seconds: float, warmup: float
             ) -> dict[str, Any]:
    """Each worker's commits, back to back, in a thread of its own; only those that began
    after the warm-up and ended before its end are counted."""
    start = time.monotonic() + warmup
    end = start + seconds
    latencies: list[float] = []
    conflicts = [0]
    lock = threading.Lock()

    def loop(commit: Callable[[], bool]) -> None:
        while True:
            began = time.monotonic()
            if began >= end:
                return
            landed = commit()
            done = time.monotonic()
            if began >= start and done <= end:
                with lock:
                    if landed:
                        latencies.append(done - began)
                    else:
                        conflicts[0] += 1

    threads = [threading.Thread(target=loop, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ordered = sorted(latencies) or [float("nan")]
    return {"commits_per_s": round(len(latencies) / seconds, 1),
            "p50_ms": round(statistics.median(ordered) * 1000, 2),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 2),
            "conflicts": conflicts[0]}


def property_workers(base: str, tables: list[tuple[str, str]], n: int
                     ) -> list[Callable[[], bool]]:
    """`n` committers over `tables` ((name, uuid)) round robin: set-properties commits."""
    workers = []
    for i in range(n):
        name, table_uuid = tables[i % len(tables)]
        client, count = Client(base), iter(range(10**9))

        def commit(client: Client = client, name: str = name, table_uuid: str = table_uuid,
                   count: Iterator[int] = count, i: int = i) -> bool:
            status, body = client.call("POST", f"/v1/namespaces/peers/tables/{name}", {
                "requirements": [{"type": "assert-table-uuid", "uuid": table_uuid}],
                "updates": [{"action": "set-properties",
                             "updates": {f"w{i}": str(next(count))}}]})
            if status not in (200, 409):
                raise RuntimeError(f"a commit at {base} answered {status}: {body}")
            return status == 200
        workers.append(commit)
    return workers


def append_workers(base: str, name: str, n: int) -> list[Callable[[], bool]]:
    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.exceptions import CommitFailedException

    workers = []
    for i in range(n):
        catalog = RestCatalog(f"c{i}", uri=base)
        row = pa.table({"id": pa.array([i], pa.int64())})

        def commit(catalog: RestCatalog = catalog, row: pa.Table = row) -> bool:
            try:
                catalog.load_table(f"peers.{name}").append(row)
                return True
            except CommitFailedException:
                return False
        workers.append(commit)
    return workers


def cells(writers: int, distinct: int) -> dict[str, Callable[[str, str], list[Any]]]:
    """Each cell: (catalog URL, a fresh name prefix) -> its workers."""
    def props(n: int, tables: int) -> Callable[[str, str], list[Any]]:
        return lambda base, tag: property_workers(
            base, [(f"{tag}{t}", make_table(base, f"{tag}{t}")) for t in range(tables)], n)

    def appends(n: int) -> Callable[[str, str], list[Any]]:
        return lambda base, tag: (make_table(base, tag), append_workers(base, tag, n))[1]

    return {"sequential": props(1, 1), "one-table": props(writers, 1),
            "distinct": props(distinct, distinct), "append-1": appends(1),
            f"append-{writers}": appends(writers)}


@contextmanager
def tsoracle_catalog(url: str, warehouse: Path) -> Iterator[str]:
    tool = Path(sys.executable).with_name("tsoracle")
    subprocess.run([str(tool), "init", "--url", url], check=True, capture_output=True)
    proc = subprocess.Popen([str(tool), "catalog", "serve", "--url", url, "--warehouse",
                             str(warehouse), "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("catalog: "):
            raise RuntimeError(f"tsoracle catalog serve did not start: {line!r}")
        yield line.split()[1]
    finally:
        proc.terminate()
        proc.wait(30)


@contextmanager
def peer_catalog(pg: Any, warehouse: Path) -> Iterator[str]:
    from tsoracle_dev.localpg import DATABASE, ROLE
    from tsoracle_dev.rck import reference_server

    pg.sql(f"CREATE SCHEMA IF NOT EXISTS peers_ref AUTHORIZATION {ROLE}")
    jdbc = f"jdbc:postgresql://127.0.0.1:{pg.port}/{DATABASE}?currentSchema=peers_ref"
    extra = {"CATALOG_JDBC_USER": ROLE, "CATALOG_JDBC_PASSWORD": pg.password}
    with reference_server(warehouse, jdbc_uri=jdbc, extra_env=extra) as base:
        yield base


def measure(pg: Any, work: Path, *, rounds: int, seconds: float, warmup: float, writers: int,
            distinct: int, progress: Callable[[str], None]) -> dict[str, Any]:
    url = f"{pg.url()}?schema=peers_tso"
    report: dict[str, Any] = {"rounds": rounds, "seconds": seconds, "writers": writers,
                              "distinct": distinct, "cells": {}}
    with tsoracle_catalog(url, work / "tso") as tso, peer_catalog(pg, work / "ref") as ref:
        for cell, workers in cells(writers, distinct).items():
            best: dict[str, dict[str, Any]] = {}
            for r in range(rounds):
                for side, base in (("tsoracle", tso), ("iceberg", ref)):
                    got = run_cell(workers(base, f"{cell.replace('-', '_')}_{r}_"),
                                   seconds, warmup)
                    progress(f"{cell} round {r + 1} {side}: {got}")
                    if side not in best or got["commits_per_s"] > \
                            best[side]["commits_per_s"]:
                        best[side] = got
            report["cells"][cell] = best
    return report


def markdown(report: dict[str, Any]) -> str:
    lines = ["| cell | tsoracle commits/s | Iceberg's server | ratio | tsoracle p50 / p99 ms | "
             "Iceberg's p50 / p99 ms | conflicts (tsoracle / Iceberg's) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for cell, sides in report["cells"].items():
        t, i = sides["tsoracle"], sides["iceberg"]
        ratio = t["commits_per_s"] / i["commits_per_s"] if i["commits_per_s"] else float("inf")
        lines.append(f"| {cell} | {t['commits_per_s']} | {i['commits_per_s']} | {ratio:.2f}× | "
                     f"{t['p50_ms']} / {t['p99_ms']} | {i['p50_ms']} / {i['p99_ms']} | "
                     f"{t['conflicts']} / {i['conflicts']} |")
    return "\n".join(lines)


# Published figures of other Iceberg REST catalogs (the catalog-commit-bench project's
# RESULTS.md: one machine, one run): context on the plot, not a same-run ratio.
PUBLISHED = {"sequential": {"Nessie 0.107": 170.6, "Polaris 1.5": 84.0},
             "one-table": {"Gravitino": 272.6, "Polaris 1.5": 61.5}}
SIDES = {"tsoracle": ("tsoracle", "tab:blue"), "iceberg": ("Iceberg RESTCatalogServer",
                                                            "tab:orange")}


def plot(report: dict[str, Any], path: str) -> None:
    """Commits/s per cell, the two catalogs side by side, the same-run ratio above each pair;
    the published anchors as grey ticks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = list(report["cells"])
    fig, ax = plt.subplots(figsize=(9, 4.8))
    for k, (side, (label, color)) in enumerate(SIDES.items()):
        values = [report["cells"][c][side]["commits_per_s"] for c in cells]
        ax.bar([i + (k - 0.5) * 0.38 for i in range(len(cells))], values, 0.38,
               label=label, color=color)
    for i, cell in enumerate(cells):
        t, r = (report["cells"][cell][s]["commits_per_s"] for s in SIDES)
        ax.annotate(f"{t / r:.2f}×" if r else "", (i, max(t, r)), ha="center",
                    xytext=(0, 4), textcoords="offset points", fontsize=9)
        for name, value in PUBLISHED.get(cell, {}).items():
            ax.plot([i - 0.4, i + 0.4], [value, value], color="grey", linewidth=1)
            ax.annotate(name, (i + 0.42, value), fontsize=7, color="grey", va="center")
    ax.set_xticks(range(len(cells)), cells)
    ax.set_yscale("log")
    ax.set_ylabel("successful commits/s (log)")
    ax.grid(axis="y", alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title(f"Iceberg REST commits on one PostgreSQL, same client, best of "
                 f"{report['rounds']} rounds of {report['seconds']:g} s\n"
                 f"({report['writers']} writers on one table, {report['distinct']} on a "
                 "table each; grey: published figures of other catalogs)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2, help="rounds per cell; the best is kept")
    p.add_argument("--seconds", type=float, default=5.0, help="seconds measured per cell")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds before, not measured")
    p.add_argument("--writers", type=int, default=8, help="clients on one table")
    p.add_argument("--distinct", type=int, default=64, help="clients on a table each")
    p.add_argument("--json", help="write the report here")
    p.add_argument("--plot", metavar="PNG", help="draw the report here (needs matplotlib)")
    p.add_argument("--from-json", metavar="FILE",
                   help="print and draw a report written before instead of measuring")
    a = p.parse_args()
    if a.from_json:
        report = json.loads(Path(a.from_json).read_text())
    else:
        from tsoracle_dev.localpg import LocalPostgres

        with LocalPostgres.temporary("catalog-peers-") as pg:
            report = measure(pg, pg.base.parent, rounds=a.rounds, seconds=a.seconds,
                             warmup=a.warmup, writers=a.writers, distinct=a.distinct,
                             progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(markdown(report))
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=2) + "\n")
    if a.plot:
        plot(report, a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())

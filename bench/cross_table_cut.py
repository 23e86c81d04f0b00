"""Cross-table time travel: is "as of T" one consistent, repeatable cut?

Writers (pyiceberg, threads) append id i to table `a` and then to table `b`, one commit each.
Readers pick a timestamp T, read both tables as of T (`snapshot_as_of_timestamp`), and record
what they saw; at the end every recorded read is repeated at its T. Counted:

- inconsistent cuts: b holds an id that a does not (b is written after a);
- changed reads: the same read at the same T returned different rows later.

Against tsoracle's catalog T comes from the catalog's `read_ts` (POST /v1/tsoracle/read-ts);
against Iceberg's reference REST catalog (JDBC on a SQLite file, the Java test fixture that
tsoracle_dev.rck runs) T is the reader's clock, as time travel by timestamp is used there.

    python bench/cross_table_cut.py --writers 3 --ids 30 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException, ServerError

SCHEMA = pa.schema([("id", pa.int64())])


@dataclass
class Outcome:
    catalog: str
    reads: int = 0
    inconsistent: int = 0
    changed: int = 0
    commits: int = 0
    unknown: int = 0  # commits the catalog answered "state unknown" (a 5xx)
    examples: list[str] = field(default_factory=list)


def _rows(table: Any, ts: int) -> list[int]:
    snapshot = table.snapshot_as_of_timestamp(ts)
    if snapshot is None:
        return []
    return sorted(table.scan(snapshot_id=snapshot.snapshot_id).to_arrow()["id"].to_pylist())


def run(uri: str, name: str, read_ts: Callable[[], int], *, writers: int = 3,
        ids: int = 30, readers: int = 1) -> Outcome:
    setup = RestCatalog("setup", uri=uri)
    setup.create_namespace("cut")
    for t in ("a", "b"):
        setup.create_table(f"cut.{t}", schema=SCHEMA)
    outcome = Outcome(name)
    seen: list[tuple[int, list[int], list[int]]] = []
    stop = threading.Event()
    lock = threading.Lock()
    failures: list[BaseException] = []

    def write(first: int) -> None:
        try:
            cat = RestCatalog("w", uri=uri)
            for i in range(first, first + ids):
                for t in ("a", "b"):
                    while True:
                        try:
                            _load(cat, f"cut.{t}").append(pa.table({"id": [i]},
                                                                       schema=SCHEMA))
                            break
                        except CommitFailedException:
                            continue
                        except CommitStateUnknownException:
                            # The reference server's in-memory SQLite fails now and then
                            # under concurrent commits (a 500): append again only if the
                            # row is not there.
                            with lock:
                                outcome.unknown += 1
                            table = _load(cat, f"cut.{t}")
                            if i in table.scan().to_arrow()["id"].to_pylist():
                                break
                    with lock:
                        outcome.commits += 1
        except BaseException as exc:
            failures.append(exc)

    def read() -> None:
        try:
            cat = RestCatalog("r", uri=uri)
            while not stop.is_set():
                ts = read_ts()
                a, b = (_rows(_load(cat, f"cut.{t}"), ts) for t in ("a", "b"))
                with lock:
                    seen.append((ts, a, b))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=write, args=(w * 10_000,)) for w in range(writers)]
    reading = [threading.Thread(target=read) for _ in range(readers)]
    for t in (*threads, *reading):
        t.start()
    for t in threads:
        t.join()
    stop.set()
    for t in reading:
        t.join()
    if failures:
        raise failures[0]
    final = {t: setup.load_table(f"cut.{t}") for t in ("a", "b")}
    for ts, a, b in seen:
        outcome.reads += 1
        if not set(b) <= set(a):
            outcome.inconsistent += 1
            _example(outcome, f"T={ts}: b has {sorted(set(b) - set(a))} that a lacks")
        again = (_rows(final["a"], ts), _rows(final["b"], ts))
        if again != (a, b):
            outcome.changed += 1
            _example(outcome, f"T={ts}: {len(a)}/{len(b)} rows then, "
                              f"{len(again[0])}/{len(again[1])} later")
    return outcome


def _load(cat: RestCatalog, name: str) -> Any:
    """load_table, again after a 5xx: the reference server's in-memory SQLite fails now and then
    under concurrent requests."""
    for attempt in range(50):
        try:
            return cat.load_table(name)
        except ServerError:
            time.sleep(0.05 * (attempt + 1))
    return cat.load_table(name)


def _example(outcome: Outcome, text: str) -> None:
    if len(outcome.examples) < 3:
        outcome.examples.append(text)


def tsoracle_catalog(home: Path, **kwargs: Any) -> Outcome:
    import tsoracle
    from tsoracle.catalog.serve import CatalogConfig, RunningCatalog

    url = f"sqlite:///{home / 'oracle.db'}"
    asyncio.run(tsoracle.init(url))
    with RunningCatalog(CatalogConfig(url=url, warehouse=str(home / "wh"), port=0)) as running:
        def read_ts() -> int:
            request = urllib.request.Request(f"{running.url}/v1/tsoracle/read-ts",
                                             method="POST")
            with urllib.request.urlopen(request, timeout=30) as response:
                return int(json.load(response)["read-ts"])

        return run(running.url, "tsoracle (T from read_ts)", read_ts, **kwargs)


def reference_catalog(home: Path, **kwargs: Any) -> Outcome:
    from tsoracle_dev.rck import reference_server

    with reference_server(home / "wh", jdbc_uri=f"jdbc:sqlite:file:{home / 'catalog.db'}") as uri:
        return run(uri, "Iceberg reference REST catalog (T from the clock)",
                   lambda: int(time.time() * 1000), **kwargs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--writers", type=int, default=3)
    p.add_argument("--ids", type=int, default=30, help="ids each writer appends to a and b")
    p.add_argument("--readers", type=int, default=1)
    p.add_argument("--only", choices=["tsoracle", "reference"])
    p.add_argument("--json", type=Path, help="write the outcomes here")
    args = p.parse_args(argv)
    kwargs = {"writers": args.writers, "ids": args.ids, "readers": args.readers}
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="cross-table-") as tmp:
        for name, fn in (("tsoracle", tsoracle_catalog), ("reference", reference_catalog)):
            if args.only in (None, name):
                home = Path(tmp) / name
                home.mkdir()
                outcomes.append(fn(home, **kwargs))
    for o in outcomes:
        print(f"{o.catalog}: {o.reads} reads at a timestamp, {o.inconsistent} inconsistent "
              f"cuts, {o.changed} changed when repeated ({o.commits} commits, {o.unknown} "
              "answered with an unknown outcome)")
        for e in o.examples:
            print(f"    e.g. {e}")
    if args.json:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The catalog under a small load that serves /metrics, for the observability tests: the
catalog in this process (`--metrics-port`, as its pods run it) and pyiceberg writers appending
to one table at once, so that commits conflict and are retried, plus a reader that asks for a
table that does not exist (failed requests).

    python -m tsoracle_dev.catalog_workload URL WAREHOUSE METRICS_PORT SECONDS
"""

from __future__ import annotations

import sys
import threading
import time

import pyarrow as pa
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError

from tsoracle.catalog.serve import CatalogConfig, start

WRITERS = 4


def main(url: str, warehouse: str, metrics_port: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    with start(CatalogConfig(url=url, warehouse=warehouse, port=0,
                             metrics_port=metrics_port)) as running:
        setup = RestCatalog("setup", uri=running.url)
        setup.create_namespace_if_not_exists("obs")
        schema = pa.schema([("writer", pa.int32()), ("n", pa.int64())])
        setup.create_table_if_not_exists("obs.events", schema=schema)

        def writer(me: int) -> None:
            table = RestCatalog(f"w{me}", uri=running.url).load_table("obs.events")
            n = 0
            while time.monotonic() < deadline:
                try:
                    table.append(pa.table({"writer": pa.array([me], pa.int32()),
                                           "n": pa.array([n], pa.int64())}))
                    n += 1
                    time.sleep(0.1)  # a load, not a stress test: the machine is shared
                except CommitFailedException:
                    table.refresh()  # another writer got there first: the engines' way
                except Exception:  # noqa: BLE001 - the backend is down
                    time.sleep(0.5)  # (the tests take it away); keep going

        def reader() -> None:
            catalog = RestCatalog("r", uri=running.url)
            while time.monotonic() < deadline:
                try:
                    catalog.load_table("obs.missing")
                except NoSuchTableError:
                    pass
                except Exception:  # noqa: BLE001 - the backend is down: keep going
                    pass
                time.sleep(0.5)

        threads = [threading.Thread(target=writer, args=(i,), daemon=True)
                   for i in range(WRITERS)] + [threading.Thread(target=reader, daemon=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))

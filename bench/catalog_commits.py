"""Iceberg commits: tsoracle's REST catalog against Iceberg's JDBC catalog on one PostgreSQL.

For each kind of commit (a table property set, or an append of one row), each layout (every
committer on ONE table, or DISTINCT tables, one per committer) and each number of concurrent
committers, both catalogs run back to back for a fixed time; reported: commits/s, commit
latency p50/p99, conflicts, and the CPU each process spent per commit.

- tsoracle: `tsoracle catalog serve` (a process of its own by default, as it is deployed;
  `--server thread` runs it in the bench process) reached over HTTP by pyiceberg's RestCatalog.
- JDBC: pyiceberg's SqlCatalog, whose rows are Iceberg's JdbcCatalog's (`iceberg_tables`, a
  compare-and-set on `metadata_location`), through SQLAlchemy and psycopg 3.

Each committer is a thread with a catalog client of its own. A commit refused for a conflict
(a 409 / CommitFailedException) is retried by the committer at once, after reloading the
table: the retries belong to that one commit and its latency, and are counted as conflicts.
pyiceberg's own commit retries are switched off on every table so the two catalogs retry alike.

    python bench/catalog_commits.py --committers 1,8,64 --duration 5 \
        --json docs/data/catalog-commits.json --plot docs/img/catalog-commits.png

Starts its own PostgreSQL (tsoracle_dev.localpg) unless `--url` names one (the bench then makes
schemas of its own there).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import psycopg
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from sqlalchemy.engine import URL

import tsoracle
from tsoracle.redact import password_forms, redact_texts

CATALOGS = ("tsoracle", "jdbc")
KINDS = ("property", "append")
LAYOUTS = ("one", "distinct")
SCHEMA = pa.schema([("id", pa.int64()), ("who", pa.string())])
# pyiceberg retries failed appends itself (with backoff); the committers do it instead, alike
# for both catalogs and for both kinds of commit, so that every conflict is seen and counted.
TABLE_PROPERTIES = {"commit.retry.num-retries": "0"}
TICKS = os.sysconf("SC_CLK_TCK")
CHILD_URL = "CATALOG_BENCH_ORACLE_URL"


@dataclass(frozen=True)
class Settings:
    committers: tuple[int, ...] = (1, 8, 64)
    kinds: tuple[str, ...] = KINDS
    layouts: tuple[str, ...] = LAYOUTS
    duration: float = 5.0  # seconds measured per cell
    warmup: float = 1.0  # seconds of commits before that, not measured
    server: str = "process"  # or "thread": tsoracle's catalog inside the bench process


@dataclass
class Tally:
    """One committer's measured commits."""

    latencies: list[float] = field(default_factory=list)
    conflicts: int = 0
    errors: int = 0
    abandoned: int = 0  # still conflicting when the cell ended
    error_sample: str = ""


# --- the catalogs under test -------------------------------------------------------------------

class Targets:
    """Both catalogs on one PostgreSQL: a client per call, and the CPU clocks to read."""

    def __init__(self, base_url: str, workdir: Path, server: str,
                 postmaster: int | None, profile: str | None = None) -> None:
        self.tag = uuid.uuid4().hex[:8]
        self.secrets = password_forms(base_url)
        self.postmaster = postmaster
        self.oracle_url = f"{base_url}?schema=catbench_{self.tag}"
        jdbc_schema = f"catbench_jdbc_{self.tag}"
        with psycopg.connect(base_url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {jdbc_schema}")  # a fresh hex name: nothing to quote
        parts = urlsplit(base_url)
        self.jdbc_uri = URL.create(
            "postgresql+psycopg", username=unquote(parts.username or ""),
            password=unquote(parts.password or ""),
            host=parts.hostname, port=parts.port, database=parts.path.lstrip("/"),
            query={"options": f"-csearch_path={jdbc_schema}"}).render_as_string(
                hide_password=False)
        self.jdbc_warehouse = (workdir / "jdbc-warehouse").as_uri()
        tso_warehouse = str(workdir / "tsoracle-warehouse")
        asyncio.run(tsoracle.init(self.oracle_url))
        self.server = server
        self._child: subprocess.Popen[str] | None = None
        self._running: Any = None
        if server == "process":
            self._child = subprocess.Popen(
                [sys.executable, __file__, "--serve-child", tso_warehouse,
                 *([profile] if profile else [])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                env={**os.environ, CHILD_URL: self.oracle_url})  # not in argv: ps shows that
            assert self._child.stdout is not None
            line = self._child.stdout.readline().strip()
            if not line.startswith("catalog: "):
                self.close()
                raise RuntimeError("tsoracle's catalog did not start; its error is above")
            self.rest_uri = line.removeprefix("catalog: ")
        else:
            from tsoracle.catalog.serve import CatalogConfig, RunningCatalog

            self._running = RunningCatalog(CatalogConfig(url=self.oracle_url,
                                                         warehouse=tso_warehouse, port=0))
            self.rest_uri = self._running.url
        try:
            self.client("jdbc").close()  # SqlCatalog makes its tables once, not in a race
        except BaseException:
            self.close()
            raise

    def client(self, catalog: str) -> Catalog:
        if catalog == "tsoracle":
            return RestCatalog("bench", uri=self.rest_uri)
        return SqlCatalog("bench", uri=self.jdbc_uri, warehouse=self.jdbc_warehouse)

    def server_counters(self) -> dict[str, float]:
        """tsoracle's catalog: commits, retries and conflicts it counted itself."""
        if self._child is None:
            return _counters()
        assert self._child.stdin is not None and self._child.stdout is not None
        self._child.stdin.write("metrics\n")
        self._child.stdin.flush()
        return dict(json.loads(self._child.stdout.readline()))

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far: this process (the committers, and the catalog in thread mode),
        the catalog's process, and PostgreSQL (its live processes and those it reaped)."""
        found = {"bench": time.process_time()}
        if self._child is not None:
            found["server"] = _proc_cpu(self._child.pid)
        if self.postmaster is not None:
            found["postgres"] = _proc_cpu(self.postmaster, reaped=True) + sum(
                _proc_cpu(pid) for pid in _children(self.postmaster))
        return found

    def redact(self, text: str) -> str:
        return redact_texts(text, self.secrets, mark="<hidden>")

    def close(self) -> None:
        if self._child is not None:
            if self._child.stdin is not None:
                self._child.stdin.close()  # the child stops serving at end of input
            try:
                self._child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._child.kill()
                self._child.wait()
        if self._running is not None:
            self._running.close()


def _counters() -> dict[str, float]:
    from tsoracle.catalog.metrics import COMMITS, CONFLICTS, RETRIES

    out = {"commits": COMMITS._value.get(), "retries": RETRIES._value.get()}
    for kind in ("moved", "superseded"):
        out[f"conflicts_{kind}"] = CONFLICTS.labels(kind)._value.get()
    return out


def _proc_cpu(pid: int, reaped: bool = False) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0  # gone meanwhile: a backend that exited (its parent's reaped time has it)
    # utime and stime are fields 14 and 15 of the line (11, 12 here), cutime/cstime next.
    ticks = int(fields[11]) + int(fields[12])
    if reaped:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICKS


def _children(ppid: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == ppid:
                    found.append(int(proc.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def serve_child(warehouse: str, profile: str | None) -> int:
    """`--serve-child`: tsoracle's catalog in this process's main thread; on stdin, `metrics`
    prints its counters as JSON, and the end of input stops it."""
    from tsoracle.catalog.serve import CatalogConfig, serve

    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    def commands() -> None:
        for line in sys.stdin:
            if line.strip() == "metrics":
                print(json.dumps(_counters()), flush=True)
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=commands, daemon=True).start()
    serving = serve(CatalogConfig(url=os.environ[CHILD_URL], warehouse=warehouse, port=0),
                    lambda at: print(f"catalog: {at}", flush=True), stop)
    if profile is None:
        loop.run_until_complete(serving)
        return 0
    import cProfile

    # The event loop's thread only: metadata files are written on worker threads.
    with cProfile.Profile() as prof:
        loop.run_until_complete(serving)
    prof.dump_stats(profile)
    return 0


# --- one cell ----------------------------------------------------------------------------------

def _commit(table: Table, kind: str, tag: str) -> None:
    if kind == "property":
        table.transaction().set_properties({"bench.last": tag}).commit_transaction()
    else:
        table.append(pa.table({"id": [1], "who": [tag]}, schema=SCHEMA))


def committer(make_client: Callable[[], Catalog], ident: str, kind: str, me: int,
              start: threading.Barrier, window: list[float], release: threading.Event,
              tally: Tally, redact: Callable[[str], str]) -> None:
    client = make_client()
    try:
        table = client.load_table(ident)
        start.wait()
        _commit_until(client, table, ident, kind, me, window, tally, redact)
        # Connections stay open until the CPU clocks are read: a PostgreSQL backend that
        # exits meanwhile would move its CPU time between the clocks read.
        release.wait()
    finally:
        client.close()


def _commit_until(client: Catalog, table: Table, ident: str, kind: str, me: int,
                  window: list[float], tally: Tally, redact: Callable[[str], str]) -> None:
    done = 0
    while time.perf_counter() < window[1]:
        begin = time.perf_counter()
        landed = False
        while not landed:
            try:
                _commit(table, kind, f"{me}-{done}")
                landed = True
            except CommitFailedException:
                tally.conflicts += 1
                if time.perf_counter() >= window[1]:
                    tally.abandoned += 1
                    break
                table = client.load_table(ident)
            except Exception as exc:  # counted and shown, then on: the cell must finish
                tally.errors += 1
                tally.error_sample = tally.error_sample or redact(
                    f"{exc.__class__.__name__}: {exc}")[:300]
                time.sleep(0.01)
                table = client.load_table(ident)
                if time.perf_counter() >= window[1]:
                    break
        end = time.perf_counter()
        done += 1
        if landed and window[0] <= end <= window[1]:
            tally.latencies.append(end - begin)


def run_cell(targets: Targets, catalog: str, kind: str, layout: str, committers: int,
             settings: Settings, index: int) -> dict[str, Any]:
    admin = targets.client(catalog)
    ns = f"c{index}"
    admin.create_namespace(ns)
    names = ["t"] if layout == "one" else [f"t{i}" for i in range(committers)]
    for name in names:
        admin.create_table(f"{ns}.{name}", schema=SCHEMA, properties=TABLE_PROPERTIES)
    window = [0.0, 0.0]

    def opened() -> None:  # once every committer has its client and table: the clock starts
        now = time.perf_counter()
        window[:] = [now + settings.warmup, now + settings.warmup + settings.duration]

    start = threading.Barrier(committers + 1, action=opened)
    release = threading.Event()
    tallies = [Tally() for _ in range(committers)]
    threads = [threading.Thread(
        target=committer, name=f"committer-{i}",
        args=(lambda: targets.client(catalog), f"{ns}.{names[i % len(names)]}", kind, i,
              start, window, release, tallies[i], targets.redact))
        for i in range(committers)]
    for t in threads:
        t.start()
    start.wait()
    time.sleep(max(0.0, window[0] - time.perf_counter()))
    counters, cpu = targets.server_counters(), targets.cpu()
    time.sleep(max(0.0, window[1] - time.perf_counter()))
    counters_after, cpu_after = targets.server_counters(), targets.cpu()
    release.set()
    for t in threads:
        t.join()
    admin.close()
    latencies = sorted(x for t in tallies for x in t.latencies)
    n = len(latencies)
    row: dict[str, Any] = {
        "catalog": catalog, "kind": kind, "layout": layout, "committers": committers,
        "commits": n, "commits_per_s": round(n / settings.duration, 1),
        "p50_ms": _ms(statistics.median(latencies)) if n else None,
        "p99_ms": _ms(_quantile(latencies, 0.99)) if n else None,
        "mean_ms": _ms(statistics.fmean(latencies)) if n else None,
        "conflicts": sum(t.conflicts for t in tallies),
        "abandoned": sum(t.abandoned for t in tallies),
        "errors": sum(t.errors for t in tallies),
        "error_sample": next((t.error_sample for t in tallies if t.error_sample), ""),
        # CPU per measured commit (the window's CPU over the window's commits), by process.
        "cpu_ms_per_commit": {k: _ms((cpu_after[k] - cpu[k]) / n) if n else None
                              for k in cpu},
        "cpu_cores_busy": round(sum(cpu_after[k] - cpu[k] for k in cpu) / settings.duration, 2),
    }
    if catalog == "tsoracle":
        # Attempts the catalog retried inside itself at a fresh timestamp (the client never
        # saw them): a pointer that moved, or the timeline's upper that passed the attempt's W.
        row["server_retries"] = {k: int(counters_after[k] - counters[k])
                                 for k in counters if k != "commits"}
    return row


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- the run -----------------------------------------------------------------------------------

def cells(settings: Settings) -> Iterator[tuple[str, str, int]]:
    """(kind, layout, committers); with one committer both layouts are the same cell: once."""
    for kind in settings.kinds:
        for n in settings.committers:
            for layout in settings.layouts:
                if n == 1 and layout != settings.layouts[0]:
                    continue
                yield kind, layout, n


def measure(base_url: str, settings: Settings, workdir: Path,
            postmaster: int | None = None, progress: Callable[[str], None] | None = None,
            profile: str | None = None) -> dict[str, Any]:
    """Every cell on both catalogs (tsoracle first, then JDBC, back to back)."""
    targets = Targets(base_url, workdir, settings.server, postmaster, profile)
    rows = []
    try:
        index = 0
        for kind, layout, n in cells(settings):
            for catalog in CATALOGS:
                rows.append(run_cell(targets, catalog, kind, layout, n, settings, index))
                index += 1
                if progress is not None:
                    progress(_line(rows[-1]))
    finally:
        targets.close()
    return {"settings": {**asdict(settings), "cpus": os.cpu_count()}, "rows": rows,
            "ratios": ratios(rows, settings)}


def ratios(rows: list[dict[str, Any]], settings: Settings) -> list[dict[str, Any]]:
    """Per kind: tsoracle ÷ JDBC latency at the fewest committers, and commits/s at the most
    on distinct tables, against the issue's goals (≤ 1.5× latency, > 1× commits/s)."""
    by = {(r["catalog"], r["kind"], r["layout"], r["committers"]): r for r in rows}
    out = []
    least, most = min(settings.committers), max(settings.committers)
    first = settings.layouts[0]
    spread = "distinct" if "distinct" in settings.layouts and most > 1 else first
    for kind in settings.kinds:
        tso, jdbc = by.get(("tsoracle", kind, first, least)), by.get(("jdbc", kind, first, least))
        wide_t = by.get(("tsoracle", kind, spread, most))
        wide_j = by.get(("jdbc", kind, spread, most))
        entry: dict[str, Any] = {"kind": kind, "least": least, "most": most, "layout": spread}
        if tso and jdbc and tso["p50_ms"] and jdbc["p50_ms"]:
            entry["latency_p50"] = round(tso["p50_ms"] / jdbc["p50_ms"], 2)
            entry["latency_p99"] = round(tso["p99_ms"] / jdbc["p99_ms"], 2)
            entry["latency_goal_met"] = entry["latency_p50"] <= 1.5
        if wide_t and wide_j and wide_j["commits_per_s"]:
            entry["commits_per_s"] = round(wide_t["commits_per_s"] / wide_j["commits_per_s"], 2)
            entry["throughput_goal_met"] = entry["commits_per_s"] > 1.0
        out.append(entry)
    return out


def _line(r: dict[str, Any]) -> str:
    retried = r.get("server_retries")
    inside = f", retried inside {retried['retries']}" if retried else ""
    err = f", errors {r['errors']} ({r['error_sample']})" if r["errors"] else ""
    return (f"{r['kind']:<8} {r['layout']:<8} {r['committers']:>3} {r['catalog']:<8}: "
            f"{r['commits_per_s']:>8,.1f} commits/s, p50 {r['p50_ms']} ms, p99 {r['p99_ms']} "
            f"ms, conflicts {r['conflicts']}{inside}{err}")


def markdown(report: dict[str, Any]) -> str:
    out = ["| commit | tables | committers | catalog | commits/s | p50 ms | p99 ms | "
           "conflicts | retried inside | CPU ms/commit (bench / server / postgres) |",
           "|" + " --- |" * 10]
    for r in report["rows"]:
        layout = "one" if r["committers"] == 1 else r["layout"]
        retried = r.get("server_retries")
        cpu = r["cpu_ms_per_commit"]
        shown = " / ".join("–" if cpu.get(k) is None else f"{cpu[k]:.1f}"
                           for k in ("bench", "server", "postgres"))
        out.append(
            f"| {r['kind']} | {layout} | {r['committers']} | {r['catalog']} | "
            f"{r['commits_per_s']:,.1f} | {_num(r['p50_ms'])} | {_num(r['p99_ms'])} | "
            f"{r['conflicts']} | {retried['retries'] if retried else '–'} | {shown} |")
    out.append("")
    for q in report["ratios"]:
        if "latency_p50" in q:
            out.append(f"- {q['kind']}: tsoracle ÷ JDBC latency at {q['least']} committer(s): "
                       f"p50 {q['latency_p50']}×, p99 {q['latency_p99']}× (goal ≤ 1.5×: "
                       f"{'met' if q['latency_goal_met'] else 'NOT met'})")
        if "commits_per_s" in q:
            out.append(f"- {q['kind']}: tsoracle ÷ JDBC commits/s at {q['most']} committers, "
                       f"{q['layout']} tables: {q['commits_per_s']}× (goal > 1×: "
                       f"{'met' if q['throughput_goal_met'] else 'NOT met'})")
    return "\n".join(out)


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f}"


def plot(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, settings = report["rows"], report["settings"]
    kinds = settings["kinds"]
    fig, axes = plt.subplots(2, len(kinds), figsize=(5.5 * len(kinds), 7), squeeze=False)
    colors = {"tsoracle": "tab:blue", "jdbc": "tab:orange"}
    styles = {"one": "--", "distinct": "-"}
    for col, kind in enumerate(kinds):
        for catalog in CATALOGS:
            for layout in settings["layouts"]:
                # One committer is both layouts' first point.
                sel = sorted((r for r in rows if r["kind"] == kind and r["catalog"] == catalog
                              and (r["layout"] == layout or r["committers"] == 1)
                              and r["commits"]), key=lambda r: r["committers"])
                if not sel:
                    continue
                xs = [r["committers"] for r in sel]
                label = f"{catalog}, {layout} table{'s' if layout == 'distinct' else ''}"
                kw = {"color": colors[catalog], "linestyle": styles.get(layout, "-"),
                      "marker": "o", "label": label}
                axes[0][col].plot(xs, [r["commits_per_s"] for r in sel], **kw)
                axes[1][col].plot(xs, [r["p50_ms"] for r in sel], **kw)
        axes[0][col].set_title(f"{kind} commits")
        for row, ylabel in ((0, "commits/s"), (1, "commit latency p50 (ms)")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(settings["committers"], [str(c) for c in settings["committers"]])
            ax.set_xlabel("concurrent committers")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3, which="both")
        axes[0][col].legend(fontsize=7)
    fig.suptitle(f"Iceberg commits on one PostgreSQL: tsoracle's REST catalog vs the JDBC "
                 f"catalog ({settings['cpus']} cores, {settings['duration']:g} s per point)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _csv(kind: type, allowed: tuple[str, ...] = ()) -> Callable[[str], tuple[Any, ...]]:
    def parse(text: str) -> tuple[Any, ...]:
        values = tuple(kind(x) for x in text.split(",") if x)
        if allowed and not set(values) <= set(allowed):
            raise argparse.ArgumentTypeError(f"choose from {', '.join(allowed)}")
        if not values:
            raise argparse.ArgumentTypeError("give at least one value")
        return values
    return parse


@contextmanager
def postgres(url: str | None) -> Iterator[tuple[str, int | None]]:
    """The given server, or one of the bench's own (then its postmaster's pid for CPU)."""
    if url is not None:
        yield url, None
        return
    from tsoracle_dev.localpg import LocalPostgres

    with tempfile.TemporaryDirectory(prefix="catalog-commits-pg-") as tmp:
        pg = LocalPostgres(Path(tmp) / "pg")
        try:
            started = pg.start()
            yield started, int((pg.data / "postmaster.pid").read_text().split()[0])
        finally:
            pg.destroy()


def main() -> int:
    if len(sys.argv) >= 3 and sys.argv[1] == "--serve-child":
        return serve_child(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--committers", type=_csv(int), default=(1, 8, 64),
                   help="concurrent committers per cell (comma-separated)")
    p.add_argument("--kind", type=_csv(str, KINDS), default=KINDS,
                   help="property (set a table property: the catalog alone), append (one row: "
                        "what users do)")
    p.add_argument("--layout", type=_csv(str, LAYOUTS), default=LAYOUTS,
                   help="one (every committer on one table), distinct (a table each)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds measured per cell")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds before, not measured")
    p.add_argument("--server", choices=["process", "thread"], default="process",
                   help="tsoracle's catalog in a process of its own, or in the bench's")
    p.add_argument("--url", help="an existing PostgreSQL (postgresql://...; no query); "
                                 "default: start one")
    p.add_argument("--profile-server", metavar="FILE",
                   help="cProfile tsoracle's catalog process (its event loop) into FILE")
    p.add_argument("--json", help="write the report here")
    p.add_argument("--plot", help="write a PNG here (needs matplotlib)")
    a = p.parse_args()
    if a.url is not None and urlsplit(a.url).query:
        p.error("--url must have no query: the bench makes schemas of its own")
    settings = Settings(committers=a.committers, kinds=a.kind, layouts=a.layout,
                        duration=a.duration, warmup=a.warmup, server=a.server)
    with tempfile.TemporaryDirectory(prefix="catalog-commits-") as tmp, \
            postgres(a.url) as (url, postmaster):
        report = measure(url, settings, Path(tmp), postmaster,
                         progress=lambda line: print(line, file=sys.stderr, flush=True),
                         profile=a.profile_server)
    print(markdown(report))
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=2) + "\n")
    if a.plot:
        plot(report, a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())

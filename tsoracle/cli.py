"""The `tsoracle` command: thin argument parsing over the library."""

from __future__ import annotations

import argparse
import importlib.metadata
import inspect
import os
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from tsoracle import errors, eventloop
from tsoracle.extras import needs_extra
from tsoracle.fencing import IMPLEMENTATIONS, MODE_ALIASES, MODE_WARNINGS, MODES, parse_mode
from tsoracle.oracle import (
    EPOCH_MILLISECONDS,
    advance,
    connect,
    finish_rollout,
    flip,
    init,
    set_fencing,
)
from tsoracle.oracle import status as read_status
from tsoracle.oracle.advance import MAX_AHEAD_MS, MAX_COUNTER_JUMP
from tsoracle.oracle.api import WriteTimestamp
from tsoracle.oracle.operations import BY_COMMAND
from tsoracle.oracle.options import DEFAULT_MAX_CLOCK_SKEW_MS
from tsoracle.output import add_output_flag, emit, table
from tsoracle.store import DEFAULT_URL, U64_MAX, parse_url

# The default is resolved after parsing (see `main`): a default taken from $TSORACLE_URL would
# print the variable's value, password and all, in `--help`.
URL_HELP = f"backend URL (default: $TSORACLE_URL or {DEFAULT_URL})"
# What `ts read|peek --stored` prints, per implementation and operation.
STORED_MEANING = {
    ("legacy", "read"): "the leader's durable read frontier: every applied write is at or below "
                        "it, and the leader's read_ts is not above it",
    ("legacy", "peek"): "the leader's reserved upper bound: every write timestamp it handed out "
                        "is at or below it (its latest may be lower)",
    ("distributed", "read"): "the distributed read_ts itself",
    ("distributed", "peek"): "the distributed write_ts itself (latest handed out)",
}


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless it has none or names it already."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if ("default" in text or default is None or default is False
                or default == argparse.SUPPRESS or not action.option_strings):
            return text
        shown = ",".join(map(str, default)) if isinstance(default, list) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


def _csv(kind: type) -> Any:
    def parse(text: str) -> list[Any]:
        try:
            return [kind(part) for part in text.split(",") if part]
        except ValueError:
            msg = f"expected a comma-separated list, got {text!r}"
            raise argparse.ArgumentTypeError(msg) from None
    return parse


def _mode(text: str) -> str:
    """A fencing mode as typed: any case, or on/off (fencing.parse_mode)."""
    mode = parse_mode(text)
    if mode is None:
        aliases = ", ".join(f"{a} = {m}" for a, m in MODE_ALIASES.items())
        raise argparse.ArgumentTypeError(f"{text!r} is not a fencing mode: give "
                                         f"{', '.join(MODES)} ({aliases}), in any case")
    return mode


def _version() -> str:
    try:
        return importlib.metadata.version("tsoracle")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return "unknown (not installed)"


# --- the commands: each one's flags and what it runs, in one table (COMMANDS) ------------


def _init_flags(c: argparse.ArgumentParser) -> None:
    c.add_argument("--timeline", action="append", dest="timelines", metavar="NAME",
                   help=f"timeline to create (repeatable; default: {EPOCH_MILLISECONDS})")
    c.add_argument("--implementation", choices=IMPLEMENTATIONS, default="distributed",
                   help="active implementation of a new deployment (use `flip` later)")
    c.add_argument("--fencing", type=_mode, metavar="MODE",
                   help=f"set the deployment's fencing mode, {'|'.join(MODES)} (default: "
                        "Always for a new deployment, unchanged for an existing one)")
    c.add_argument("--initial-ts", type=int, default=0, metavar="T",
                   help="start of new timelines")


async def _init(args: argparse.Namespace) -> int:
    done = await init(args.url, timelines=args.timelines or [EPOCH_MILLISECONDS],
                      initial_ts=args.initial_ts, implementation=args.implementation,
                      fencing=args.fencing)
    emit({"deployment": done.deployment, "created": done.created}, args.output, _init_text)
    _warn_mode(args.fencing)
    return 0


async def _status(args: argparse.Namespace) -> int:
    st = (await read_status(args.url)).as_dict()
    where = parse_url(args.url)
    st["backend"] = {"url": where.safe, "schema": where.schema}  # password masked
    emit(st, args.output, _status_text)
    return 0


def _ts_flags(c: argparse.ArgumentParser) -> None:
    c.add_argument("op", choices=list(BY_COMMAND),
                   help="; ".join(f"{o.command}: {o.help}" for o in BY_COMMAND.values()))
    c.add_argument("ts", nargs="?", type=int, help="the timestamp, for `apply`")
    c.add_argument("--timeline", default=EPOCH_MILLISECONDS, metavar="NAME", help="the timeline")
    c.add_argument("--implementation", choices=IMPLEMENTATIONS,
                   help="the implementation to open (default: the deployment's active one)")
    c.add_argument("--stored", action="store_true",
                   help="`read`/`peek` only: print the value stored in the backend, without "
                        "opening an oracle (a running legacy leader is not fenced)")
    c.add_argument("--take-leadership", action="store_true",
                   help="allow a one-shot legacy command to fence the running legacy leader")
    c.add_argument("--max-clock-skew-ms", type=int, default=DEFAULT_MAX_CLOCK_SKEW_MS, metavar="MS",
                   help="how far ahead of this machine's clock an EpochMilliseconds write "
                        "timestamp may be")


def _flip_flags(c: argparse.ArgumentParser) -> None:
    c.add_argument("--to", required=True, choices=IMPLEMENTATIONS,
                   help="the implementation to make active")


async def _flip(args: argparse.Namespace) -> int:
    emit(await flip(args.url, to=args.to), args.output, _flip_text)
    return 0


def _advance_flags(c: argparse.ArgumentParser) -> None:
    c.add_argument("--timeline", required=True, metavar="NAME", help="the timeline")
    c.add_argument("--to", required=True, metavar="T",
                   help="the next write timestamp will be above T and read_ts at least T: the "
                        "highest timestamp any client saw, plus a margin; a T at or below the "
                        "timeline's position changes nothing")
    c.add_argument("--force", action="store_true",
                   help=f"allow a counting timeline to jump more than {MAX_COUNTER_JUMP} "
                        f"timestamps, or {EPOCH_MILLISECONDS} to go more than {MAX_AHEAD_MS} ms "
                        "ahead of this machine's clock (writers refuse to follow beyond it)")


async def _advance(args: argparse.Namespace) -> int:
    moved = await advance(args.url, timeline=args.timeline, to=_timestamp("--to", args.to),
                          force=args.force)
    emit(moved, args.output, _advance_text)
    return 0


def _fencing_flags(c: argparse.ArgumentParser) -> None:
    c.add_argument("mode", type=_mode, metavar="MODE",
                   help=f"the new mode: {', '.join(MODES)}, in any case "
                        f"({', '.join(f'{a} = {m}' for a, m in MODE_ALIASES.items())})")


async def _fencing(args: argparse.Namespace) -> int:
    dep = await set_fencing(args.url, args.mode)
    emit({"deployment": dep}, args.output,
         lambda d: f"fencing is now {d['deployment']['fence']} "
                   f"(epoch {d['deployment']['epoch']})")
    _warn_mode(args.mode)
    return 0


async def _finish_rollout(args: argparse.Namespace) -> int:
    before = (await read_status(args.url)).deployment
    if not before.rollout:
        emit({"deployment": before, "finished": False}, args.output,
             lambda d: f"no rollout window is open (fencing {d['deployment']['fence']}, "
                       f"epoch {d['deployment']['epoch']}): nothing changed")
        return 0
    dep = await finish_rollout(args.url)
    emit({"deployment": dep, "finished": True}, args.output,
         lambda d: f"rollout finished: {d['deployment']['implementation']} at epoch "
                   f"{d['deployment']['epoch']}; only the inactive implementation stays "
                   "fenced")
    return 0


def _demo_flags(c: argparse.ArgumentParser) -> None:
    c.add_argument("--writers", type=int, default=3, help="writer threads")
    c.add_argument("--batches", type=int, default=4,
                   help="batches per writer (each appended to orders, then to shipments)")
    c.add_argument("--rows", type=int, default=50, help="rows per append")
    c.add_argument("--data-dir", help="keep the oracle and the warehouse here (default: a "
                   "temporary directory)")


def _demo(args: argparse.Namespace) -> int:
    # The demo imports Spark, then the catalog's pyiceberg, lazily.
    with needs_extra("spark", "`tsoracle demo`"), needs_extra("iceberg", "`tsoracle demo`"):
        from tsoracle.demo import run_demo

        return run_demo(writers=args.writers, batches=args.batches, rows=args.rows,
                        data_dir=args.data_dir)


def _catalog_flags(c: argparse.ArgumentParser) -> None:
    actions = c.add_subparsers(dest="catalog_command", required=True, metavar="ACTION")
    c = actions.add_parser("serve", help="serve the catalog until interrupted",
                           description="Serve an Iceberg REST catalog on the oracle's database "
                           "(its own tables in the URL's schema); prints `catalog: URL` once "
                           "it accepts requests.", formatter_class=HelpFormatter)
    c.add_argument("--url", metavar="URL", help=URL_HELP)
    c.add_argument("--warehouse", required=True, metavar="URI",
                   help="where tables' files go: a file:// path or an s3:// URI")
    c.add_argument("--host", default="127.0.0.1", help="address to listen on")
    c.add_argument("--port", type=int, default=8181, help="port to listen on (0: a free one)")
    c.add_argument("--timeline", default=EPOCH_MILLISECONDS, metavar="NAME",
                   help="the timeline that orders commits (snapshot timestamps are its "
                        "timestamps)")
    c.add_argument("--token-file", metavar="FILE",
                   help="require `Authorization: Bearer <the file's contents>` on every request")
    c.add_argument("--io-property", action="append", default=[], metavar="KEY=VALUE",
                   help="a FileIO setting for the warehouse (repeatable), e.g. "
                        "s3.endpoint=http://minio:9000 or s3.region=eu-west-1; credentials come "
                        "from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)")
    c.add_argument("--allow-location", action="append", default=[], metavar="URI",
                   help="also allow table locations under this root (repeatable; by default "
                        "every location must be under --warehouse)")
    c.add_argument("--metrics-port", type=int, metavar="N",
                   help="also serve Prometheus /metrics on this port, on --host (default: not "
                        "served)")
    c.add_argument("--retention", type=float, default=3600.0, metavar="SECONDS",
                   help="snapshot expiry (remove-snapshots, from any engine) is refused for "
                        "snapshots a read at a timestamp handed out within this many seconds "
                        "needs")
    c.add_argument("--idempotency-key-lifetime", type=int, default=1800, metavar="SECONDS",
                   help="a client may retry a change with the same Idempotency-Key header for "
                        "this long and get the first answer (advertised in /v1/config as an "
                        "ISO 8601 duration; default: 1800, PT30M)")


def _operator_flags(c: argparse.ArgumentParser) -> None:
    c.add_argument("--namespace", action="append", dest="namespaces", default=[],
                   help="watch only this namespace (repeatable; default: all namespaces)")
    c.add_argument("--liveness-port", type=int, default=8080, help="port of /healthz")
    c.add_argument("--metrics-port", type=int, default=8081, help="port of /metrics")
    c.add_argument("--bind", default="0.0.0.0", help="address of the liveness/metrics servers")
    c.add_argument("--lease-namespace",
                   help="hold this namespace's Lease while reconciling, so that only one "
                        "operator acts (default: $POD_NAMESPACE; none: run alone)")
    c.add_argument("--lease-name", default="tsoracle-operator", help="name of that Lease")


def _operator(args: argparse.Namespace) -> int:
    with needs_extra("operator", "`tsoracle operator`"):
        from tsoracle.operator.main import run_operator

    run_operator(namespaces=args.namespaces, liveness_port=args.liveness_port,
                 metrics_port=args.metrics_port, bind=args.bind,
                 lease_namespace=args.lease_namespace, lease_name=args.lease_name)
    return 0


def _bench_flags(c: argparse.ArgumentParser) -> None:
    c.add_argument("--mode", type=_csv(str), default=["read"], metavar="LIST",
                   help="read, write, mixed (comma-separated)")
    c.add_argument("--concurrency", type=_csv(int), default=[1, 8, 64, 512], metavar="LIST",
                   help="concurrent clients per measurement (comma-separated)")
    c.add_argument("--duration", type=float, default=3.0, metavar="S",
                   help="seconds per measurement")
    c.add_argument("--implementation", type=_csv(str), default=["distributed"], metavar="LIST",
                   help="legacy, distributed (comma-separated)")
    c.add_argument("--raw", action="store_true", help="no read_ts batching")
    c.add_argument("--with-raw", action="store_true",
                   help="measure batched and raw in the same run, and report ratios")
    c.add_argument("--pipeline-depth", type=int, metavar="K",
                   help="batched read_ts calls in flight at once, 1 to 16 (default: the "
                        "library's, 8)")
    c.add_argument("--backend-latency-ms", type=float, default=0.0, metavar="MS",
                   help="add this much to every round trip to PostgreSQL, through a relay the "
                        "bench starts and stops (a distant backend on this machine)")


def _no_flags(c: argparse.ArgumentParser) -> None:
    """A command with no flags of its own (`--url` and `-o` come with every backend command)."""


def _warn_mode(mode: str | None) -> None:
    """What a fencing mode gives up, on stderr, wherever a command sets it."""
    if mode in MODE_WARNINGS:
        print(f"tsoracle: {MODE_WARNINGS[mode]}", file=sys.stderr)


def _init_text(d: dict[str, Any]) -> str:
    dep = d["deployment"]
    made = ", ".join(d["created"]) or "none (all existed)"
    return (f"initialized: {dep['implementation']} at epoch {dep['epoch']}, fencing "
            f"{dep['fence']}; new timelines: {made}")


def _flip_text(r: dict[str, Any]) -> str:
    if not r["changed"]:
        return f"already on {r['implementation']} at epoch {r['epoch']}; nothing to do"
    lines = [f"flipped {r['previous']} -> {r['implementation']}: epoch {r['epoch']}"]
    lines += [f"  {timeline}: bootstrapped to {ts}"
              for timeline, ts in sorted(r["bootstrap"].items())]
    return "\n".join(lines)


def _advance_text(r: dict[str, Any]) -> str:
    if not r["changed"]:
        return (f"{r['timeline']} is already at {r['before']}, at or above {r['to']}: "
                "nothing changed")
    fenced = (f"; epoch {r['epoch']}: legacy leaders were fenced and reopen above it"
              if r["fenced"] else "")
    return f"advanced {r['timeline']} from {r['before']} to {r['after']}{fenced}"


def _timestamp(flag: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise errors.ConfigError(f"{flag} {text!r} is not a timestamp: give an integer") \
            from None


async def _ts(args: argparse.Namespace) -> int:
    op = BY_COMMAND[args.op]
    if op.takes_ts and args.ts is None:
        raise errors.ConfigError(f"`tsoracle ts {op.command}` needs the timestamp: "
                                 f"tsoracle ts {op.command} T")
    if not op.takes_ts and args.ts is not None:
        raise errors.ConfigError(f"`tsoracle ts {op.command}` takes no timestamp")
    if args.stored:
        return await _ts_stored(args)
    impl = args.implementation
    if impl is None:
        impl = (await read_status(args.url)).deployment.implementation
    if impl == "legacy" and not args.take_leadership:
        instead = (f"; `tsoracle ts {op.command} --stored` prints the stored value without "
                   "contacting the leader" if (impl, op.command) in STORED_MEANING else "")
        raise errors.ConfigError(
            "the legacy implementation serves from its leader's memory: a one-shot command "
            f"would fence the running leader; pass --take-leadership if that is "
            f"intended{instead}"
        )
    # A legacy oracle is its timeline's leader, so it is never read-only.
    read_only = not op.writes and impl != "legacy"
    async with connect(args.url, timeline=args.timeline, implementation=impl,
                       read_only=read_only, max_clock_skew_ms=args.max_clock_skew_ms) as oracle:
        if op.name == "apply_write" and not oracle.timeline.wall_clock:
            _check_apply_jump(args.timeline, await oracle.peek_write_ts(), args.ts)
        result = await getattr(oracle, op.name)(*([args.ts] if op.takes_ts else []))
        if isinstance(result, WriteTimestamp):
            result = result.timestamp
        # An operation with no answer (apply, confirm) prints where reads stand afterwards.
        ts = result if result is not None else await oracle.read_ts()
    emit({"operation": op.command, "timeline": args.timeline, "implementation": impl,
          "timestamp": ts, "stored": False}, args.output, lambda d: str(d["timestamp"]))
    return 0


def _check_apply_jump(timeline: str, position: int, ts: int) -> None:
    """Refuse `ts apply` far beyond what the counting timeline handed out: `apply_write(T)`
    raises write_ts to T, and nothing lowers it again, so one typed digit too many (or 2^64-1)
    would use up the timeline. The bound is `advance`'s without --force; EpochMilliseconds
    has its own, the clock-skew guard."""
    if ts - position > MAX_COUNTER_JUMP:
        raise errors.ConfigError(
            f"`tsoracle ts apply {ts}` would move timeline {timeline!r} {ts - position} "
            f"timestamps past the latest write timestamp ({position}), more than "
            f"{MAX_COUNTER_JUMP}: every write after it would start there, and at "
            f"{U64_MAX} none is left; apply only timestamps that `tsoracle ts write` handed "
            f"out, or, to move the timeline that far on purpose, run `tsoracle advance "
            f"--timeline {timeline} --to {ts} --force`")


async def _ts_stored(args: argparse.Namespace) -> int:
    """`ts read|peek --stored`: the backend's row, read like `status` does, so no oracle is
    opened and no legacy leadership is taken or confirmed."""
    if args.op not in ("read", "peek"):
        raise errors.ConfigError(f"--stored prints a stored value: use it with `tsoracle ts "
                                 f"read` or `tsoracle ts peek`, not `{args.op}`")
    if args.take_leadership or args.implementation:
        raise errors.ConfigError("--stored reads the active implementation's stored values "
                                 "and takes no leadership: drop --take-leadership and "
                                 "--implementation")
    st = await read_status(args.url)
    row = next((t for t in st.timelines if t.timeline == args.timeline), None)
    if row is None:
        raise errors.UnknownTimeline(args.timeline)
    impl = st.deployment.implementation
    ts = row.read_ts if args.op == "read" else row.write_ts
    meaning = STORED_MEANING[(impl, args.op)]
    emit({"operation": args.op, "timeline": args.timeline, "implementation": impl,
          "timestamp": ts, "stored": True, "meaning": meaning}, args.output,
         lambda d: str(d["timestamp"]))
    if args.output == "text":  # stdout stays one number for scripts; the label goes aside
        name = "read_ts" if args.op == "read" else "write_ts"
        print(f"stored {name} of {impl} timeline {args.timeline} at epoch "
              f"{st.deployment.epoch}: {meaning}; no oracle was opened", file=sys.stderr)
    return 0


def _rollout_text(fence: str, rollout: bool) -> str:
    """What the rollout flag means in this fencing mode."""
    if fence != "Rollout":
        return f"- (fencing {fence} has no rollout window)"
    if rollout:
        return ("window open: processes on the old epoch stay fenced until it ends "
                "(`tsoracle finish-rollout`)")
    return "no window open (the next flip opens one)"


def _status_text(st: dict[str, Any]) -> str:
    d = st["deployment"]
    where = st.get("backend") or {}
    head = (f"database: {where.get('url', '-')}   schema: {where.get('schema', '-')}\n"
            f"implementation: {d['implementation']}   epoch: {d['epoch']}   fencing: "
            f"{d['fence']}   incarnation: {d['incarnation'] or '-'}\n"
            f"rollout: {_rollout_text(d['fence'], d['rollout'])}")
    rows = [(t["timeline"], t["read_ts"], t["write_ts"], t["lag_ms"], t["leader_epoch"])
            for t in st["timelines"]]
    return head + "\n" + table(("TIMELINE", "READ_TS", "WRITE_TS", "LAG_MS", "LEADER_EPOCH"),
                                rows)


async def _bench(args: argparse.Namespace) -> int:
    from tsoracle.bench import Progress, report_text, run_bench

    for mode in args.mode:
        if mode not in ("read", "write", "mixed"):
            raise errors.ConfigError(f"unknown bench mode {mode!r}; use --mode with read, "
                                     "write or mixed")
    for impl in args.implementation:
        if impl not in IMPLEMENTATIONS:
            raise errors.ConfigError(f"unknown implementation {impl!r}; use --implementation "
                                     "with legacy, distributed or both")
    if args.backend_latency_ms < 0:
        raise errors.ConfigError("--backend-latency-ms must be 0 or more")
    batching = [True, False] if args.with_raw else [not args.raw]
    progress = Progress(modes=args.mode, implementations=args.implementation,
                        concurrencies=args.concurrency, batching=batching,
                        seconds=args.duration, file=sys.stderr)

    async def measure(url: str) -> dict[str, Any]:
        return await run_bench(
            url, modes=args.mode, implementations=args.implementation,
            concurrencies=args.concurrency, seconds=args.duration, batching=batching,
            on_result=progress.finished, pipeline_depth=args.pipeline_depth,
        )

    if args.backend_latency_ms:
        from tsoracle.latency import relayed

        with relayed(args.url, args.backend_latency_ms) as url:
            report = await measure(url)
        report["backend_latency_ms"] = args.backend_latency_ms
    else:
        report = await measure(args.url)
    emit(report, args.output, lambda r: report_text(r, args.duration))
    return 0


def _catalog(args: argparse.Namespace) -> int:
    with needs_extra("iceberg", "`tsoracle catalog serve`"):
        from tsoracle.catalog.serve import (
            CatalogConfig,
            parse_io_property,
            read_token,
            serve,
        )

    if not 0 <= args.port <= 65535:
        raise errors.ConfigError(f"--port {args.port} is not a port: give 0 to 65535")
    if args.metrics_port is not None and not 1 <= args.metrics_port <= 65535:
        raise errors.ConfigError(f"--metrics-port {args.metrics_port} is not a port: give 1 "
                                 "to 65535")
    config = CatalogConfig(url=args.url, warehouse=args.warehouse, host=args.host,
                           port=args.port, timeline=args.timeline,
                           token=read_token(args.token_file) if args.token_file else None,
                           allowed_locations=tuple(args.allow_location),
                           io_properties=tuple(parse_io_property(p) for p in args.io_property),
                           metrics_port=args.metrics_port, retention_s=args.retention,
                           key_lifetime_s=args.idempotency_key_lifetime)
    return run(_serving(serve(config, lambda url: print(f"catalog: {url}", flush=True))))


async def _serving(serving: Coroutine[Any, Any, None]) -> int:
    await serving
    return 0


@dataclass(frozen=True)
class Command:
    help: str
    flags: Callable[[argparse.ArgumentParser], None]
    # Runs the command: an async one on tsoracle's event loop (`run`), a sync one as it is.
    run: Callable[[argparse.Namespace], Coroutine[Any, Any, int]] \
        | Callable[[argparse.Namespace], int]
    backend: bool = True  # takes --url and -o


COMMANDS: dict[str, Command] = {
    "init": Command("create the schema, tables and timelines that are missing", _init_flags,
                    _init),
    "status": Command("show the deployment and every timeline", _no_flags, _status),
    "ts": Command("run one oracle operation and print the timestamp", _ts_flags, _ts),
    "flip": Command("make another implementation active (epoch bump + bootstrap)",
                    _flip_flags, _flip),
    "advance": Command("move a timeline forward after its database was restored (forward "
                       "only; docs/runbooks/timestamp-fallback.md)", _advance_flags, _advance),
    "fencing": Command("set the fencing mode of the deployment", _fencing_flags, _fencing),
    "finish-rollout": Command("end the rollout window (Rollout fencing mode)", _no_flags,
                              _finish_rollout),
    "demo": Command("the main job: Spark writers and readers on Iceberg tables through "
                    "tsoracle's catalog, on the embedded default, with a flip mid-run",
                    _demo_flags, _demo, backend=False),
    "catalog": Command("an Iceberg REST catalog whose commits the oracle orders",
                       _catalog_flags, _catalog, backend=False),
    "operator": Command("run the Kubernetes operator for TimestampOracle resources",
                        _operator_flags, _operator, backend=False),
    "bench": Command("closed-loop benchmark with physical-limit probes (in its own schema "
                     "tsoracle_bench)", _bench_flags, _bench),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tsoracle", description="Linearizable timestamp oracle.",
                                formatter_class=HelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        c = sub.add_parser(name, help=command.help, description=command.help,
                           formatter_class=HelpFormatter)
        if command.backend:
            c.add_argument("--url", metavar="URL", help=URL_HELP)
            add_output_flag(c, json_alias=True)
        command.flags(c)
        c.set_defaults(run=command.run)
    return p


def run(coro: Coroutine[Any, Any, int]) -> int:
    try:
        return eventloop.run(coro)
    except errors.OracleError as exc:
        print(f"tsoracle: error: {exc.for_cli()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # told by the command's own parser, with its usage, not the top-level one
        commands = next(a for a in parser._actions
                        if isinstance(a, argparse._SubParsersAction))
        commands.choices[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    if "url" in args:
        args.url = args.url or os.environ.get("TSORACLE_URL") or DEFAULT_URL
    try:
        done = args.run(args)
    except errors.OracleError as exc:
        print(f"tsoracle: error: {exc.for_cli()}", file=sys.stderr)
        return 1
    return run(done) if inspect.iscoroutine(done) else int(done)


def kubectl_main(argv: list[str] | None = None) -> int:
    """Entry point of `kubectl-tsoracle`: the plugin needs the operator extra."""
    try:
        with needs_extra("operator", "`kubectl tsoracle`"):
            from tsoracle.kubectl import main as plugin_main
    except errors.MissingExtra as exc:
        print(f"kubectl-tsoracle: error: {exc}", file=sys.stderr)
        return 1
    return plugin_main(argv)


def kubectl_complete_main() -> int:
    """Entry point of `kubectl_complete-tsoracle`, which kubectl runs to complete the plugin's
    arguments (tsoracle/kubectl/complete.py)."""
    from tsoracle.kubectl.complete import COMMAND

    return kubectl_main([COMMAND, *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())

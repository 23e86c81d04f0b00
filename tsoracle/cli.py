"""The `tsoracle` command: thin argument parsing over the library."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import sys
from collections.abc import Coroutine
from typing import Any

from tsoracle import errors
from tsoracle.extras import needs_extra
from tsoracle.fencing import IMPLEMENTATIONS, MODES
from tsoracle.oracle import EPOCH_MILLISECONDS, connect, finish_rollout, flip, init, set_fencing
from tsoracle.oracle import status as read_status
from tsoracle.oracle.api import WriteTimestamp
from tsoracle.oracle.operations import BY_COMMAND
from tsoracle.store import DEFAULT_URL

URL_HELP = f"backend URL (default: $TSORACLE_URL or {DEFAULT_URL})"


def _csv(kind: type) -> Any:
    def parse(text: str) -> list[Any]:
        try:
            return [kind(part) for part in text.split(",") if part]
        except ValueError:
            msg = f"expected a comma-separated list, got {text!r}"
            raise argparse.ArgumentTypeError(msg) from None
    return parse


def _version() -> str:
    try:
        return importlib.metadata.version("tsoracle")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tsoracle", description="Linearizable timestamp oracle.")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def cmd(name: str, help_text: str) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help_text, description=help_text)
        c.add_argument("--url", default=os.environ.get("TSORACLE_URL", DEFAULT_URL), help=URL_HELP)
        return c

    c = cmd("init", "create the schema, tables and timelines that are missing")
    c.add_argument("--timeline", action="append", dest="timelines", metavar="NAME",
                   help=f"timeline to create (repeatable; default {EPOCH_MILLISECONDS})")
    c.add_argument("--implementation", choices=IMPLEMENTATIONS, default="distributed",
                   help="active implementation of a new deployment (use `flip` later)")
    c.add_argument("--fencing", choices=MODES, help="set the deployment's fencing mode")
    c.add_argument("--initial-ts", type=int, default=0, help="start of new timelines")

    c = cmd("status", "show the deployment and every timeline")
    c.add_argument("--json", action="store_true", help="machine-readable output")

    c = cmd("ts", "run one oracle operation and print the timestamp")
    c.add_argument("op", choices=list(BY_COMMAND),
                   help="; ".join(f"{o.command}: {o.help}" for o in BY_COMMAND.values()))
    c.add_argument("ts", nargs="?", type=int, help="the timestamp, for `apply`")
    c.add_argument("--timeline", default=EPOCH_MILLISECONDS)
    c.add_argument("--implementation", choices=IMPLEMENTATIONS,
                   help="default: the deployment's active implementation")
    c.add_argument("--take-leadership", action="store_true",
                   help="allow a one-shot legacy command to fence the running legacy leader")

    c = cmd("flip", "make another implementation active (epoch bump + bootstrap)")
    c.add_argument("--to", required=True, choices=IMPLEMENTATIONS)
    c.add_argument("--json", action="store_true")

    c = cmd("fencing", "set the fencing mode of the deployment")
    c.add_argument("mode", choices=MODES)

    cmd("finish-rollout", "end the rollout window (Rollout fencing mode)")

    c = sub.add_parser("demo", help="the main job: Spark writers and readers on the embedded "
                       "default, with a flip mid-run",
                       description="run writers, readers and a flip on local Spark + SQLite")
    c.add_argument("--writers", type=int, default=3)
    c.add_argument("--batches", type=int, default=4, help="appends per writer")
    c.add_argument("--rows", type=int, default=50, help="rows per append")
    c.add_argument("--data-dir", help="keep the data here (default: a temporary directory)")

    c = sub.add_parser("operator", help="run the Kubernetes operator",
                       description="run the kopf operator for TimestampOracle resources")
    c.add_argument("--namespace", action="append", dest="namespaces", default=[],
                   help="watch only this namespace (repeatable; default: all namespaces)")
    c.add_argument("--liveness-port", type=int, default=8080)
    c.add_argument("--metrics-port", type=int, default=8081)
    c.add_argument("--bind", default="0.0.0.0", help="address of the liveness/metrics servers")
    c.add_argument("--lease-namespace",
                   help="hold this namespace's Lease while reconciling, so that only one "
                        "operator acts (default: $POD_NAMESPACE; none: run alone)")
    c.add_argument("--lease-name", default="tsoracle-operator", help="name of that Lease")

    c = cmd("bench", "closed-loop benchmark with physical-limit probes")
    c.add_argument("--mode", type=_csv(str), default=["read"],
                   help="read, write, mixed (comma-separated)")
    c.add_argument("--concurrency", type=_csv(int), default=[1, 8, 64, 512])
    c.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    c.add_argument("--implementation", type=_csv(str), default=["distributed"],
                   help="legacy, distributed (comma-separated)")
    c.add_argument("--raw", action="store_true", help="no read_ts batching")
    c.add_argument("--with-raw", action="store_true",
                   help="measure batched and raw in the same run, and report ratios")
    c.add_argument("--json", action="store_true")
    return p


async def _run(args: argparse.Namespace) -> int:
    if args.command == "init":
        done = await init(args.url, timelines=args.timelines or [EPOCH_MILLISECONDS],
                          initial_ts=args.initial_ts, implementation=args.implementation,
                          fencing=args.fencing)
        dep = done.deployment
        made = ", ".join(done.created) or "none (all existed)"
        print(f"initialized: {dep.implementation} at epoch {dep.epoch}, fencing {dep.fence}; "
              f"new timelines: {made}")
        return 0
    if args.command == "status":
        st = await read_status(args.url)
        if args.json:
            print(json.dumps(st.as_dict(), indent=2))
        else:
            _print_status(st)
        return 0
    if args.command == "ts":
        return await _ts(args)
    if args.command == "flip":
        r = await flip(args.url, to=args.to)
        if args.json:
            print(json.dumps(r.__dict__, indent=2))
        elif r.changed:
            print(f"flipped {r.previous} -> {r.implementation}: epoch {r.epoch}")
            for timeline, ts in sorted(r.bootstrap.items()):
                print(f"  {timeline}: bootstrapped to {ts}")
        else:
            print(f"already on {r.implementation} at epoch {r.epoch}; nothing to do")
        return 0
    if args.command == "fencing":
        dep = await set_fencing(args.url, args.mode)
        print(f"fencing is now {dep.fence} (epoch {dep.epoch})")
        return 0
    if args.command == "finish-rollout":
        dep = await finish_rollout(args.url)
        print(f"rollout finished: {dep.implementation} at epoch {dep.epoch}")
        return 0
    if args.command == "bench":
        return await _bench(args)
    raise AssertionError(args.command)


async def _ts(args: argparse.Namespace) -> int:
    op = BY_COMMAND[args.op]
    if op.takes_ts and args.ts is None:
        raise errors.ConfigError(f"`tsoracle ts {op.command}` needs the timestamp: "
                                 f"tsoracle ts {op.command} T")
    if not op.takes_ts and args.ts is not None:
        raise errors.ConfigError(f"`tsoracle ts {op.command}` takes no timestamp")
    impl = args.implementation
    if impl is None:
        impl = (await read_status(args.url)).deployment.implementation
    if impl == "legacy" and not args.take_leadership:
        hint = ("; `tsoracle status` shows the stored read_ts and write_ts without taking over"
                if not op.writes else "")
        raise errors.ConfigError(
            "the legacy implementation serves from its leader's memory: a one-shot command "
            f"would fence the running leader; pass --take-leadership if that is intended{hint}"
        )
    # A legacy oracle is its timeline's leader, so it is never read-only.
    read_only = not op.writes and impl != "legacy"
    async with connect(args.url, timeline=args.timeline, implementation=impl,
                       read_only=read_only) as oracle:
        result = await getattr(oracle, op.name)(*([args.ts] if op.takes_ts else []))
        if isinstance(result, WriteTimestamp):
            result = result.timestamp
        # An operation with no answer (apply, confirm) prints where reads stand afterwards.
        print(result if result is not None else await oracle.read_ts())
    return 0


def _print_status(st: Any) -> None:
    d = st.deployment
    print(f"implementation: {d.implementation}   epoch: {d.epoch}   fencing: {d.fence}"
          f"   rollout: {'in progress' if d.rollout else 'no'}"
          f"   incarnation: {d.incarnation or '-'}")
    rows = [("TIMELINE", "READ_TS", "WRITE_TS", "LAG_MS", "LEADER_EPOCH")]
    for t in st.timelines:
        rows.append((t.timeline, str(t.read_ts), str(t.write_ts),
                     "-" if t.lag_ms is None else str(t.lag_ms), str(t.leader_epoch)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())


async def _bench(args: argparse.Namespace) -> int:
    from tsoracle.bench import format_result, run_bench

    for mode in args.mode:
        if mode not in ("read", "write", "mixed"):
            raise errors.ConfigError(f"unknown bench mode {mode!r}; use read, write or mixed")
    for impl in args.implementation:
        if impl not in IMPLEMENTATIONS:
            raise errors.ConfigError(f"unknown implementation {impl!r}")
    batching = [True, False] if args.with_raw else [not args.raw]
    report = await run_bench(
        args.url, modes=args.mode, implementations=args.implementation,
        concurrencies=args.concurrency, seconds=args.duration, batching=batching,
        on_result=None if args.json else (lambda r: print(format_result(r), flush=True)),
    )
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        b = report["bare_select"]
        print(f"bare SELECT round trip: p50={b['p50_ms']:.3f} ms p99={b['p99_ms']:.3f} ms")
        for key, entry in report["summary"].items():
            print(f"{key}: " + "  ".join(f"{k}={v:.3f}" for k, v in entry.items()))
    return 0


def run(coro: Coroutine[Any, Any, int]) -> int:
    try:
        return asyncio.run(coro)
    except errors.OracleError as exc:
        print(f"tsoracle: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "demo":
            with needs_extra("spark", "`tsoracle demo`"):  # the demo imports Spark lazily
                from tsoracle.spark.demo import run_demo

                return run_demo(writers=args.writers, batches=args.batches, rows=args.rows,
                                data_dir=args.data_dir)
        if args.command == "operator":
            with needs_extra("operator", "`tsoracle operator`"):
                from tsoracle.operator.main import run_operator

            run_operator(namespaces=args.namespaces, liveness_port=args.liveness_port,
                         metrics_port=args.metrics_port, bind=args.bind,
                         lease_namespace=args.lease_namespace, lease_name=args.lease_name)
            return 0
    except errors.OracleError as exc:
        print(f"tsoracle: error: {exc}", file=sys.stderr)
        return 1
    return run(_run(args))


def kubectl_main() -> int:
    """Entry point of `kubectl-tsoracle`: the plugin needs the operator extra."""
    try:
        with needs_extra("operator", "`kubectl tsoracle`"):
            from tsoracle.kubectl import main as plugin_main
    except errors.MissingExtra as exc:
        print(f"kubectl-tsoracle: error: {exc}", file=sys.stderr)
        return 1
    return plugin_main()


if __name__ == "__main__":
    sys.exit(main())

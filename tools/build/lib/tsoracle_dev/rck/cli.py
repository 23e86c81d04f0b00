"""`tsoracle-rck`: fetch the kit, run it against a catalog or against Iceberg's reference server.

Exit status: 0 when no test failed, 1 when some did, 2 when the kit could not run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from tsoracle_dev.rck import (
    CATALOG_TESTS,
    ICEBERG_VERSION,
    KIT_CLASSES,
    KIT_TIMEOUT,
    VIEW_TESTS,
    KitResult,
    RckError,
    fetch_jars,
    fetch_spec,
    reference_server,
    run_kit,
)

ASSUMPTION = "org.junit.AssumptionViolatedException: assumption was not met due to:"
ONLY = {"tables": (CATALOG_TESTS,), "views": (VIEW_TESTS,)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tsoracle-rck",
        description=f"Apache Iceberg {ICEBERG_VERSION}'s REST Compatibility Kit.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    fetch = sub.add_parser(
        "fetch", help="fetch the kit's jars from Maven (once) and print their folder; cache "
        "Iceberg's REST catalog OpenAPI document too when a copy is named")
    fetch.add_argument("--spec", metavar="PATH",
                       help="a copy of rest-catalog-open-api.yaml (or an Iceberg checkout or "
                       "source release) of the kit's Iceberg version; default: "
                       "$TSORACLE_ICEBERG_SPEC")
    run = sub.add_parser(
        "run", help="run the kit against a REST catalog",
        description="Run the kit against a REST catalog. This process's CATALOG_* variables "
        "(for example CATALOG_TOKEN) reach the kit's client as catalog properties.")
    run.add_argument("--uri", required=True, help="the catalog's base URL (http://host:port)")
    run.add_argument("--warehouse", required=True, help="the warehouse the client asks for")
    ref = sub.add_parser("reference", help="run the kit against Iceberg's reference server")
    ref.add_argument("--warehouse-dir", type=Path,
                     help="the server's warehouse folder (default: a temporary one)")
    for command in (run, ref):
        command.add_argument("--report-dir", type=Path,
                             help="keep JUnit's XML reports and the kit's output here")
        command.add_argument("--only", choices=sorted(ONLY),
                             help="run one of the kit's two classes")
        command.add_argument("--timeout", type=float, default=KIT_TIMEOUT,
                             help="seconds the whole kit may take (default: %(default).0f)")
    return p


def report(result: KitResult) -> None:
    """The counts, then each failed and aborted test with its message on one line."""
    print(result.summary())
    for title, entries in (("failed", result.failures), ("aborted", result.aborts)):
        if entries:
            print(f"{title}:")
        for name, message in entries:
            # AssertJ's assumptions all start with the same words; the rest is the reason.
            text = " ".join(message.removeprefix(ASSUMPTION).split())
            print(f"  {name}: {text[:300]}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "fetch":
            print(fetch_jars())
            try:
                print(fetch_spec(args.spec))
            except RckError as exc:
                if args.spec:
                    raise
                # Only the fuzz test needs it, and it says so when it is missing.
                print(f"tsoracle-rck: not cached: {exc}", file=sys.stderr)
            return 0
        classes = ONLY[args.only] if args.only else KIT_CLASSES
        if args.command == "run":
            env = {k: v for k, v in os.environ.items()
                   if k.startswith("CATALOG_") and k not in ("CATALOG_URI", "CATALOG_WAREHOUSE")}
            result = run_kit(args.uri, args.warehouse, env=env, report_dir=args.report_dir,
                             classes=classes, timeout=args.timeout)
        else:
            with tempfile.TemporaryDirectory(prefix="rck-reference-") as tmp:
                warehouse = args.warehouse_dir or Path(tmp) / "warehouse"
                with reference_server(warehouse) as url:
                    print(f"reference server: {url}", file=sys.stderr)
                    result = run_kit(url, Path(warehouse).resolve().as_uri(),
                                     report_dir=args.report_dir, classes=classes,
                                     timeout=args.timeout)
    except (RckError, ValueError) as exc:
        print(f"tsoracle-rck: {exc}", file=sys.stderr)
        return 2
    report(result)
    return 1 if result.failed else 0

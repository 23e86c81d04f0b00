"""`kubectl tsoracle`: day-2 commands for TimestampOracle resources (a kubectl plugin).

    kubectl tsoracle status [NAME] [-n NS | -A]      the namespace's oracles, or one in detail
    kubectl tsoracle flip NAME --to legacy|distributed [--timeout 120]
    kubectl tsoracle fencing NAME Always|Rollout|Disabled   (on = Always, off = Disabled)
    kubectl tsoracle report NAME [-f FILE.zip] [--operator-log FILE]

Every command takes -o text|json|yaml.
"""

# One module per command, each with its HELP, its `flags` and its `run`; `api.py` talks to the
# API server and `printer.py` prints every result.

from __future__ import annotations

import argparse
import sys

from tsoracle.kubectl import fencing, flip, printer, report, status
from tsoracle.kubectl.api import Api, PluginError

COMMANDS = {"status": status, "flip": flip, "fencing": fencing, "report": report}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubectl tsoracle", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        c = sub.add_parser(name, help=command.HELP, description=command.HELP)
        # -n after the command too, where kubectl users put it.
        c.add_argument("-n", "--namespace", dest="ns_sub", help="namespace")
        printer.add_output_flag(c)
        command.flags(c)
        c.set_defaults(run=command.run)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        api = Api(args.kubeconfig, args.ns_sub or args.namespace)
        return args.run(api, args)
    except PluginError as exc:
        print(f"kubectl-tsoracle: error: {exc}", file=sys.stderr)
        return 1

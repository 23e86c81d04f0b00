"""`kubectl tsoracle`: day-2 commands for TimestampOracle resources (a kubectl plugin).

    kubectl tsoracle status [NAME] [-n NS | -A]      the namespace's oracles, or one in detail
    kubectl tsoracle flip NAME --to legacy|distributed [--timeout 120]
    kubectl tsoracle fencing NAME Always|Rollout|Disabled   (on = Always, off = Disabled)
    kubectl tsoracle report NAME [-f FILE.zip] [--operator-log FILE]

Every command takes -o text|json|yaml and kubectl's --kubeconfig, --context, --cluster, --user
and -n/--namespace, before or after the command.
"""

# One module per command, each with its HELP, its `flags` and its `run`; `api.py` talks to the
# API server and `printer.py` prints every result.

from __future__ import annotations

import argparse
import sys

import urllib3
from kubernetes.client.exceptions import ApiException

from tsoracle.kubectl import complete, fencing, flip, printer, report, status
from tsoracle.kubectl.api import Api, PluginError
from tsoracle.kubectl.connection import add_connection_flags, connection_of

COMMANDS = {"status": status, "flip": flip, "fencing": fencing, "report": report}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubectl tsoracle", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_connection_flags(p, after_command=False)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        c = sub.add_parser(name, help=command.HELP, description=command.HELP)
        add_connection_flags(c, after_command=True)  # where kubectl users put them too
        printer.add_output_flag(c)
        command.flags(c)
        c.set_defaults(run=command.run)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [complete.COMMAND]:  # kubectl's completion asks (kubectl_complete-tsoracle)
        return complete.run(build_parser(), argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.run(Api(None, None, connection=connection_of(args)), args)
    except PluginError as exc:
        print(f"kubectl-tsoracle: error: {exc}", file=sys.stderr)
    except urllib3.exceptions.HTTPError as exc:
        print(f"kubectl-tsoracle: error: cannot reach the Kubernetes API server "
              f"({unreachable(exc)}); check the kubeconfig's context (--context, "
              "--kubeconfig) and that the cluster is up", file=sys.stderr)
    except ApiException as exc:
        print(f"kubectl-tsoracle: error: the API server refused: {exc.status} {exc.reason}",
              file=sys.stderr)
    return 1


def unreachable(exc: urllib3.exceptions.HTTPError) -> str:
    """What went wrong on the way, in a phrase: urllib3's own text repeats the whole URL and
    the pool's internals."""
    reason = getattr(exc, "reason", None) or exc
    text = str(reason)
    for known in ("Connection refused", "timed out", "Name or service not known",
                  "No route to host", "certificate verify failed"):
        if known.lower() in text.lower():
            return known.lower()
    return type(reason).__name__

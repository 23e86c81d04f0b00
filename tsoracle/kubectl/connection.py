"""kubectl's connection flags (`--kubeconfig`, `--context`, `--cluster`, `--user`,
`-n/--namespace`), before or after the command (`api.load` chooses the client from them)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Connection:
    kubeconfig: str | None = None
    context: str | None = None
    cluster: str | None = None
    user: str | None = None
    namespace: str | None = None


FLAGS = {
    "kubeconfig": ("--kubeconfig", "kubeconfig file(s) (default: $KUBECONFIG, ~/.kube/config)"),
    "context": ("--context", "the kubeconfig context to use (default: its current context)"),
    "cluster": ("--cluster", "the kubeconfig cluster to use (default: the context's)"),
    "user": ("--user", "the kubeconfig user to use (default: the context's)"),
}


def add_connection_flags(parser: argparse.ArgumentParser, *, after_command: bool) -> None:
    """kubectl users put these before the command or after it: both parse, the later wins.
    After the command they default to "not given", so they never undo one given before."""
    default = argparse.SUPPRESS if after_command else None
    for dest, (flag, help_text) in FLAGS.items():
        parser.add_argument(flag, dest=dest, metavar=dest.upper(), default=default,
                            help=help_text)
    parser.add_argument("-n", "--namespace", dest="namespace", default=default,
                        help="namespace (default: the context's, else default)")


def connection_of(args: argparse.Namespace) -> Connection:
    return Connection(**{f.name: getattr(args, f.name, None) for f in fields(Connection)})

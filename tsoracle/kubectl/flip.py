"""`kubectl tsoracle flip NAME --to legacy|distributed`: switch the implementation and wait
until the operator has flipped it."""

from __future__ import annotations

import argparse
import time
from typing import Any

from tsoracle.fencing import IMPLEMENTATIONS
from tsoracle.kubectl.api import Api, PluginError, condition
from tsoracle.kubectl.printer import print_, progress

HELP = "switch the implementation and wait for the operator"
POLL = 0.5  # seconds between two looks at the resource


def flags(c: argparse.ArgumentParser) -> None:
    c.add_argument("name")
    c.add_argument("--to", required=True, choices=IMPLEMENTATIONS)
    c.add_argument("--timeout", type=float, default=120, help="seconds (default: 120)")


def run(api: Api, args: argparse.Namespace) -> int:
    return flip(api, args.name, args.to, args.timeout, args.output)


def flip(api: Api, name: str, to: str, timeout: float, output: str) -> int:
    obj = api.get(name)
    st = obj.get("status") or {}
    if st.get("activeImplementation") == to and obj["spec"].get("implementation") == to:
        print_({"name": name, "namespace": api.namespace, "implementation": to,
                "epoch": st.get("epoch"), "changed": False}, output,
               lambda d: f"{name} already runs {to} at epoch {d['epoch']}; nothing to do")
        return 0
    before = int(st.get("epoch") or 0)
    api.patch_spec(name, {"implementation": to})
    say = progress(output)
    print(f"spec.implementation set to {to}; waiting for the operator (epoch {before})...",
          file=say, flush=True)
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        obj = api.get(name)
        st = obj.get("status") or {}
        ready = condition(obj, "Ready")
        line = (f"  epoch {st.get('epoch')}  implementation {st.get('activeImplementation')}  "
                f"Ready={ready.get('status')} {ready.get('reason', '')}")
        if line != last:
            print(line, file=say, flush=True)
            last = line
        if (st.get("activeImplementation") == to and int(st.get("epoch") or 0) > before
                and ready.get("status") == "True"):
            print_({"name": name, "namespace": api.namespace, "implementation": to,
                    "epoch": st["epoch"], "changed": True,
                    "bootstrapTimestamp": st.get("bootstrapTimestamp") or {}}, output, _done)
            return 0
        time.sleep(POLL)
    raise PluginError(f"the flip did not complete within {timeout:.0f}s; see "
                      f"`kubectl tsoracle status {name}` and the operator's logs")


def _done(d: dict[str, Any]) -> str:
    boot = ", ".join(f"{k}={v}" for k, v in sorted(d["bootstrapTimestamp"].items()))
    return f"flipped to {d['implementation']} at epoch {d['epoch']}; bootstrap {boot}"

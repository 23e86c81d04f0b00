"""Legacy leader failover on a real node: from deleting the leader's pod to the first write
served by the pod that replaces it (issue 26's failover figure).

The leader is a writer process in a pod: a Deployment of one replica running the operator
image's Python with W writer tasks that call write_ts in a loop on one legacy oracle. Opening
the legacy timeline takes it over (the storage bumps the leader epoch, fencing any previous
leader); a leader that loses the timeline stops writing and waits for its end. On SIGTERM it
stops writing and exits, as a service would. Each run deletes the pod with `kubectl delete pod`
(the default grace period, or `--grace-period=0 --force`) and measures from just before kubectl
starts to the first write the new pod served, as the new pod logged it: the node runs on this
host, so both times are on one clock. The new pod's log also gives the breakdown: process
started, tsoracle imported, timeline taken over, first write.

    python bench/legacy_failover.py --writers 512 --runs 3

Starts its own node (tsoracle_dev.controlplane, as root) and imports the operator image (the
one `make images` builds from this checkout). Goal: a failover of at most 5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import tsoracle
from tsoracle_dev import images
from tsoracle_dev.controlplane.cluster import ControlPlane
from tsoracle_dev.kube import Kube
from tsoracle_dev.kubetools import tools_dir

TIMELINE = "counter:failover"
APP = "legacy-writer"
GOAL_S = 5.0
MODES = {"default grace": (), "grace 0 --force": ("--grace-period=0", "--force")}

# The leader, run as `python -c` in the pod. Every line starts with a phase and the wall-clock
# time; writes are summarised every 0.5 s (a line per write of 512 busy tasks would make the
# logging the workload), except the first, which is the figure.
WRITER = r'''
import time
print(f"start {time.time():.6f}", flush=True)
import asyncio, os, signal
import tsoracle

async def main():
    url, timeline, tasks = os.environ["URL"], os.environ["TIMELINE"], int(os.environ["WRITERS"])
    print(f"imported {time.time():.6f}", flush=True)
    stop, lost = asyncio.Event(), asyncio.Event()
    def term():
        print(f"sigterm {time.time():.6f}", flush=True)
        stop.set()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, term)
    oracle = await tsoracle.open_oracle(url, timeline=timeline, implementation="legacy")
    print(f"leader {time.time():.6f}", flush=True)
    seen = {"first": None, "writes": 0, "max": 0}

    async def write():
        while not (stop.is_set() or lost.is_set()):
            try:
                ts = (await oracle.write_ts()).timestamp
            except tsoracle.OracleError as exc:
                if not lost.is_set():
                    lost.set()
                    print(f"lost {time.time():.6f} {type(exc).__name__}", flush=True)
                return
            if seen["first"] is None:
                seen["first"] = ts
                print(f"first {time.time():.6f} {ts}", flush=True)
            seen["writes"] += 1
            seen["max"] = max(seen["max"], ts)

    async def report():
        while not stop.is_set():
            print(f"writes {time.time():.6f} {seen['writes']} {seen['max']}", flush=True)
            await asyncio.sleep(0.5)

    reporter = asyncio.create_task(report())
    await asyncio.gather(*(write() for _ in range(tasks)))
    print(f"stopped {time.time():.6f} {seen['writes']} {seen['max']}", flush=True)
    await stop.wait()  # a leader that lost waits for its end rather than exit and be restarted
    reporter.cancel()
    await oracle.close()
    print(f"exit {time.time():.6f}", flush=True)

asyncio.run(main())
'''


def deployment(writers: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": APP},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": APP}},
                 "template": {"metadata": {"labels": {"app": APP}}, "spec": {"containers": [{
                     "name": "writer", "image": images.OPERATOR_IMAGE,
                     "imagePullPolicy": "IfNotPresent", "command": ["python", "-c", WRITER],
                     "env": [{"name": "URL", "valueFrom": {"secretKeyRef": {
                                 "name": "oracle-db", "key": "url"}}},
                             {"name": "TIMELINE", "value": TIMELINE},
                             {"name": "WRITERS", "value": str(writers)}]}]}}}}


def phases(log: str) -> dict[str, list[list[str]]]:
    """Log lines by phase: `first 1763.5 42` -> {"first": [["1763.5", "42"]]}."""
    out: dict[str, list[list[str]]] = {}
    for line in log.splitlines():
        words = line.split()
        if words:
            out.setdefault(words[0], []).append(words[1:])
    return out


def pods(kube: Kube, ns: str) -> list[dict[str, Any]]:
    return json.loads(kube.kubectl("-n", ns, "get", "pods", "-l", f"app={APP}", "-o",
                                   "json").stdout)["items"]


def wait_for(what: str, probe: Any, timeout: float = 120, every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := probe():
            return result
        time.sleep(every)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def serving(kube: Kube, ns: str, other_than: str = "") -> tuple[str, dict[str, Any]] | None:
    """A live pod other than `other_than` whose log has its first write, and its phases."""
    for pod in pods(kube, ns):
        name = pod["metadata"]["name"]
        if name == other_than or "deletionTimestamp" in pod["metadata"] \
                or pod["status"].get("phase") != "Running":
            continue
        log = kube.kubectl("-n", ns, "logs", name, check=False).stdout
        if "first" in (seen := phases(log)):
            return name, seen
    return None


def one_failover(kube: Kube, ns: str, mode: str, steady_s: float, work: Path) -> dict[str, Any]:
    old, _ = wait_for("a serving leader", lambda: serving(kube, ns), timeout=180)
    old_log = work / f"{old}.log"
    with open(old_log, "w") as out:  # the old pod's log as it goes (gone with a forced delete)
        follow = subprocess.Popen([str(kube.tools / "kubectl"), "-n", ns, "logs", "-f", old],
                                  stdout=out, stderr=subprocess.DEVNULL, env=kube.env())
    try:
        time.sleep(steady_s)
        began = time.time()
        kube.kubectl("-n", ns, "delete", "pod", old, "--wait=false", *MODES[mode])
        returned = time.time() - began
        new, seen = wait_for("the new leader's first write",
                             lambda: serving(kube, ns, other_than=old), timeout=180)
        wait_for("the old pod gone", lambda: all(p["metadata"]["name"] != old
                                                  for p in pods(kube, ns)), timeout=120)
    finally:
        follow.terminate()
        follow.wait()
    before = phases(old_log.read_text())
    first_at, first_ts = float(seen["first"][0][0]), int(seen["first"][0][1])
    old_max = max((int(w[2]) for key in ("writes", "stopped") for w in before.get(key, [])),
                  default=0)
    old_end = [float(w[0]) for key in ("stopped", "lost") for w in before.get(key, [])]
    return {
        "mode": mode, "old": old, "new": new,
        "failover_s": round(first_at - began, 3),
        "kubectl_returned_s": round(returned, 3),
        # The new pod's phases, from the delete.
        "process_started_s": round(float(seen["start"][0][0]) - began, 3),
        "imported_s": round(float(seen["imported"][0][0]) - began, 3),
        "took_over_s": round(float(seen["leader"][0][0]) - began, 3),
        "old_stopped_writing_s": round(min(old_end) - began, 3) if old_end else None,
        "old_end": sorted({k for k in before if k in ("stopped", "lost", "sigterm", "exit")}),
        # The new leader's first timestamp is above any the old one logged.
        "first_above_old": first_ts > old_max, "first_ts": first_ts, "old_max_logged": old_max,
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    figures = [r["failover_s"] for r in runs]
    return {"runs": len(runs), "min_s": min(figures), "median_s": statistics.median(figures),
            "max_s": max(figures),
            "median_took_over_s": statistics.median(r["took_over_s"] for r in runs),
            "median_process_started_s": statistics.median(r["process_started_s"] for r in runs)}


def run(kube: Kube, pg_url: str, writers: int, runs: int, steady_s: float,
        work: Path) -> dict[str, Any]:
    url = f"{pg_url}?schema=s_failover_{uuid.uuid4().hex[:8]}"
    asyncio.run(tsoracle.init(url, timelines=[TIMELINE], implementation="legacy"))
    ns = kube.new_namespace("failover")
    kube.backend_secret(ns, "oracle-db", url)
    kube.kubectl("-n", ns, "apply", "-f", "-", stdin=json.dumps(deployment(writers)))
    results: list[dict[str, Any]] = []
    for _ in range(runs):
        for mode in MODES:
            results.append(one_failover(kube, ns, mode, steady_s, work))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    by_mode = {mode: summary([r for r in results if r["mode"] == mode]) for mode in MODES}
    worst = max(r["failover_s"] for r in results)
    return {"writers": writers, "by_mode": by_mode, "runs": results,
            "all_first_above_old": all(r["first_above_old"] for r in results),
            "goal_s": GOAL_S, "goal_met": worst <= GOAL_S}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--writers", type=int, default=512, help="writer tasks in the leader")
    p.add_argument("--runs", type=int, default=3, help="failovers per kind of delete")
    p.add_argument("--steady", type=float, default=3.0,
                   help="seconds the leader writes before its pod is deleted")
    p.add_argument("--json", help="also write the result here")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="tsoracle-failover-") as tmp:
        plane = ControlPlane(Path(tmp) / "state", node=True)
        plane.purge_when_this_process_exits()
        kubeconfig = plane.up()
        try:
            address = str(plane.info()["containerd_address"])
            for archive in (images.build_pause(), images.build_operator()):
                images.import_archive(archive, address)
            kube = Kube(kubeconfig, tools_dir(), plane=plane)
            result = run(kube, str(plane.info()["postgres_url"]), a.writers, a.runs, a.steady,
                         Path(tmp))
        finally:
            plane.down(purge=True)
    print(json.dumps(result, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))
    return 0 if result["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""The operator at N resources: steady-state load, then flip latency.

Steady state: for `--steady` seconds after every resource is Ready, the operator's database
sessions (sampled from pg_stat_activity every 0.2 s: every client session except the sampler's
own) and its reconcile passes per second (its /metrics). Flip latency: from patching
spec.implementation to status showing the new epoch with Ready=True, for N resources flipped at
once.

    python bench/operator_flip.py --count 1 --count 50 --count 100

Starts its own local control plane (tsoracle_dev.controlplane) and PostgreSQL (localpg); the
operator runs as a local process with the admin kubeconfig.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from kubernetes import client, config, watch

from tsoracle_dev import CHECKOUT
from tsoracle_dev.controlplane.cluster import ControlPlane
from tsoracle_dev.kube import Kube, Operator, is_ready
from tsoracle_dev.kubetools import tools_dir
from tsoracle_dev.localpg import LocalPostgres

GROUP, VERSION, PLURAL = "tsoracle.io", "v1alpha1", "timestamporacles"


def sessions(pg: LocalPostgres) -> int:
    rows = pg.sql("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
                  " AND pid <> pg_backend_pid()", "postgres")
    return int(rows[0][0])  # type: ignore[call-overload]


def run(kube: Kube, pg: LocalPostgres, count: int, workdir: Path,
        steady_s: float) -> dict[str, float]:
    ns = kube.new_namespace("bench")
    db = "bench_" + uuid.uuid4().hex[:8]
    pg.sql(f"CREATE DATABASE {db} OWNER tsoracle", "postgres")
    kube.backend_secret(ns, "oracle-db", pg.url(database=db))
    op = Operator(kube.kubeconfig, ns, workdir / f"op-{count}.log").start()
    api = client.CustomObjectsApi(config.new_client_from_config(str(kube.kubeconfig)))
    try:
        for i in range(count):
            api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "TimestampOracle",
                "metadata": {"name": f"o{i}"},
                "spec": {"backend": {"urlSecretRef": {"name": "oracle-db"}, "schema": f"s{i}"},
                         "timelines": ["EpochMilliseconds", "counter:c"]}})
        deadline = time.monotonic() + 300
        while True:
            items = api.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
            if len(items) == count and all(is_ready(o) for o in items):
                break
            if time.monotonic() > deadline:
                raise SystemExit("resources did not become Ready")
            time.sleep(0.5)
        passes0, samples = op.reconciles(), []
        t0 = time.monotonic()
        while time.monotonic() - t0 < steady_s:
            samples.append(sessions(pg))
            time.sleep(0.2)
        passes_per_s = (op.reconciles() - passes0) / (time.monotonic() - t0)
        version = api.list_namespaced_custom_object(GROUP, VERSION, ns,
                                                    PLURAL)["metadata"]["resourceVersion"]
        patched: dict[str, float] = {}
        for i in range(count):
            api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, f"o{i}",
                                               {"spec": {"implementation": "legacy"}})
            patched[f"o{i}"] = time.monotonic()
        done: dict[str, float] = {}
        stream = watch.Watch()
        for event in stream.stream(api.list_namespaced_custom_object, GROUP, VERSION, ns,
                                   PLURAL, resource_version=version, timeout_seconds=300):
            obj = event["object"]
            name = obj["metadata"]["name"]
            if name in done or name not in patched:
                continue
            if (obj.get("status") or {}).get("epoch") == 2 and is_ready(obj):
                done[name] = time.monotonic() - patched[name]
                if len(done) == count:
                    stream.stop()
        lat = sorted(done.values())
        total = max(patched[n] + d for n, d in done.items()) - min(patched.values())
        return {"count": count, "steady_sessions_max": max(samples),
                "steady_sessions_mean": round(statistics.mean(samples), 1),
                "steady_passes_per_s": round(passes_per_s, 1),
                "flip_p50_s": round(statistics.median(lat), 2), "flip_max_s": round(lat[-1], 2),
                "all_done_s": round(total, 2)}
    finally:
        op.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--count", type=int, action="append", default=[],
                   help="resources (repeatable; default 1 and 50)")
    p.add_argument("--steady", type=float, default=20.0,
                   help="seconds of steady state measured before the flips")
    a = p.parse_args()
    counts = a.count or [1, 50]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        plane = ControlPlane(work / "cp", postgres=False)
        kube = Kube(plane.up(), tools_dir())
        kube.kubectl("apply", "-f", str(CHECKOUT / "crds"))
        kube.kubectl("wait", "--for=condition=established", "crd/" + PLURAL + "." + GROUP)
        pg = LocalPostgres(work / "pg")
        pg.start()
        try:
            for n in counts:
                print(json.dumps(run(kube, pg, n, work, a.steady)), flush=True)
        finally:
            pg.destroy()
            plane.down()


if __name__ == "__main__":
    main()

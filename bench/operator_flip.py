"""Flip latency through the operator: from patching spec.implementation to status showing the
new epoch with Ready=True, for N TimestampOracle resources flipped at once.

    python bench/operator_flip.py --count 1 --count 50

Starts its own local control plane (tools/controlplane) and PostgreSQL (tools/localpg.py); the
operator runs as a local process with the admin kubeconfig.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from kubernetes import client, config, watch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tools"), str(ROOT / "tools" / "controlplane"), str(ROOT / "tests")]

from cluster import ControlPlane  # noqa: E402
from kubetools import tools_dir  # noqa: E402
from localpg import LocalPostgres  # noqa: E402
from support.kube import Kube, Operator, is_ready  # noqa: E402

GROUP, VERSION, PLURAL = "tsoracle.io", "v1alpha1", "timestamporacles"


def run(kube: Kube, pg: LocalPostgres, count: int, workdir: Path) -> dict[str, float]:
    ns = kube.new_namespace("bench")
    db = "bench_" + uuid.uuid4().hex[:8]
    pg.sql(f"CREATE DATABASE {db} OWNER tsoracle", "postgres")
    kube.kubectl("-n", ns, "create", "secret", "generic", "oracle-db",
                 f"--from-literal=url={pg.url(database=db)}")
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
        return {"count": count, "p50_s": statistics.median(lat), "max_s": lat[-1],
                "all_done_s": total}
    finally:
        op.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--count", type=int, action="append", default=[])
    a = p.parse_args()
    counts = a.count or [1, 50]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        plane = ControlPlane(work / "cp", postgres=False)
        kube = Kube(plane.up(), tools_dir())
        kube.kubectl("apply", "-f", str(ROOT / "crds"))
        kube.kubectl("wait", "--for=condition=established", "crd/" + PLURAL + "." + GROUP)
        pg = LocalPostgres(work / "pg")
        pg.start()
        try:
            for n in counts:
                print(json.dumps(run(kube, pg, n, work)), flush=True)
        finally:
            pg.destroy()
            plane.down()


if __name__ == "__main__":
    main()

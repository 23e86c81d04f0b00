"""`spark-submit --deploy-mode cluster` of examples/spark/pipeline.py onto the dev node, writing
Iceberg tables through the catalog the operator runs for the TimestampOracle (spec.catalog).

One place for the Spark configuration the tests, the demo and docs/spark.md use: the image, the
drivers' ServiceAccount, requests small enough for one 2-core node, the catalog's bearer token
as the driver's environment, and the hostPath folder the catalog, the driver and its executors
share: the warehouse (Iceberg's data and metadata files, at the same path everywhere, since
table locations are file:// paths) and the drivers' progress notes.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tsoracle_dev import CHECKOUT, jvm
from tsoracle_dev.controlplane.cluster import DEFAULT_STATE, ControlPlane
from tsoracle_dev.kubetools import tools_dir

SPARK_IMAGE = "tsoracle-spark:0.1.0"
JOB = "local:///opt/tsoracle-spark/examples/pipeline.py"
REPORT = "TSORACLE_PIPELINE_REPORT "
TOKEN_ENV = "TSORACLE_CATALOG_TOKEN"  # what pipeline.py reads


def submit_argv(api_server: str, writer: str, *, namespace: str, resource: str, data: Path,
                token_secret: str, image: str = SPARK_IMAGE, service_account: str = "spark",
                executors: int = 2, job_args: tuple[str, ...] = ()) -> list[str]:
    """`data`: the shared folder on the node (prepare_data_dir), mounted at its own path."""
    volume = {"mount.path": str(data), "options.path": str(data)}
    conf = {
        "spark.kubernetes.namespace": namespace,
        "spark.kubernetes.container.image": image,
        "spark.kubernetes.container.image.pullPolicy": "IfNotPresent",
        "spark.kubernetes.authenticate.driver.serviceAccountName": service_account,
        "spark.executor.instances": str(executors),
        # One node with 2 cores runs two drivers, four executors and the catalog: small CPU
        # requests (the task slots stay spark.executor.cores = 1), half a GiB of heap each.
        "spark.kubernetes.driver.request.cores": "0.1",
        "spark.kubernetes.executor.request.cores": "0.1",
        "spark.driver.memory": "512m",
        "spark.executor.memory": "512m",
        # Jobs of seconds on a small node: C1 only, the serial collector (tsoracle_dev.jvm).
        "spark.driver.extraJavaOptions": " ".join(jvm.SHORT_LIVED),
        "spark.executor.extraJavaOptions": " ".join(jvm.SHORT_LIVED),
        **{f"spark.kubernetes.{role}.volumes.hostPath.data.{key}": value
           for role in ("driver", "executor") for key, value in volume.items()},
        # The kubelet puts the token in the driver's environment: it is in no argument, no
        # pod spec, and the driver's ServiceAccount needs no right on the Secret.
        f"spark.kubernetes.driver.secretKeyRef.{TOKEN_ENV}": f"{token_secret}:token",
        "spark.kubernetes.submission.waitAppCompletion": "true",
    }
    argv = ["spark-submit", "--master", f"k8s://{api_server}", "--deploy-mode", "cluster",
            "--name", f"pipeline-{writer}"]
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    return [*argv, JOB, "--resource", resource, "--namespace", namespace, "--writer", writer,
            "--progress", str(data / "progress"), *job_args]


def driver_pod(submit_output: str) -> str:
    """The driver pod's name, from spark-submit's own output."""
    found = re.search(r"submission ID [\w-]+:([\w.-]+-driver)", submit_output)
    if not found:
        raise ValueError("spark-submit printed no submission ID")
    return found.group(1)


def report(driver_log: str) -> dict[str, object]:
    """The job's report line from its driver's log."""
    for line in driver_log.splitlines():
        if line.startswith(REPORT):
            return dict(json.loads(line[len(REPORT):]))
    raise ValueError("the driver printed no report")


def prepare_data_dir(path: Path, uid: int = 65532) -> None:
    """The hostPath folder: the warehouse and the progress notes, writable by the images'
    user (the catalog's pods and Spark's)."""
    for sub in ("warehouse", "progress"):
        (path / sub).mkdir(parents=True, exist_ok=True)
    subprocess.run(["chown", "-R", f"{uid}:{uid}", str(path)], check=True)


def catalog_spec(data: Path, token_secret: str) -> dict[str, object]:
    """spec.catalog for a resource whose catalog writes into `data`'s warehouse."""
    return {"enabled": True, "warehouse": f"file://{data / 'warehouse'}",
            "volume": {"hostPath": str(data / "warehouse")},
            "tokenSecretRef": {"name": token_secret}}


def catalog_token_secret(name: str) -> str:
    """A Secret (JSON, for `kubectl apply -f -`) with a fresh bearer token under key `token`."""
    return json.dumps({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
                       "stringData": {"token": secrets.token_hex(24)}})


# --- `make spark-k8s-demo`: two drivers on the dev node, a flip between them ----------------

def _later(rep: dict, key: str) -> int:  # type: ignore[type-arg]
    """The median of a driver's appends or reads after its first (which warms Spark up)."""
    return round(statistics.median(a[key] for a in rep["appends"][1:]))


DEMO_SCHEMA = "tsoracle_etl_orders"
DEMO_BATCHES, DEMO_ROWS = 6, 100


def demo_checks(reports: dict[str, dict[str, Any]], bootstrap: int,
                y_ran_through_flip: bool) -> list[tuple[str, bool]]:
    """The demo's invariants as (what, held): x committed first on legacy, y was submitted as
    the resource flipped back to distributed, and both finished."""
    stamps = {w: [a["ts"] for a in r["appends"]] for w, r in reports.items()}
    every = [ts for s in stamps.values() for ts in s]
    x, y = stamps["x"], stamps["y"]
    last = max(reports.values(), key=lambda r: r["final"]["read_ts"])
    rows = 2 * DEMO_BATCHES * DEMO_ROWS
    return [
        ("every driver's own checks passed, each appending its batches in order at growing "
         "timestamps", all(not r["failures"] and [a["batch"] for a in r["appends"]]
                           == list(range(DEMO_BATCHES)) and stamps[w] == sorted(set(stamps[w]))
                           for w, r in reports.items())),
        ("one timestamp per append, none reused", len(set(every)) == len(every)
         == 2 * DEMO_BATCHES),
        ("x committed on legacy and then on distributed (the flip between: legacy's timestamps "
         "at or below its bootstrap, distributed's above)", bool(x) and min(x) <= bootstrap
         < max(x)),
        ("y still ran when the flip ended, and committed on distributed after it",
         y_ran_through_flip and bool(y) and max(y) > bootstrap),
        (f"the last read sees all {rows} rows, each once",
         last["final"]["rows"] == last["final"]["distinct"] == rows),
    ]
WAIT_SAY_EVERY_S = 10.0


def wait_condition(status: Callable[[], dict[str, Any]], kind: str, timeout_s: float) -> bool:
    """Wait for etl/orders' condition `kind` to be True, saying what it waits for every
    WAIT_SAY_EVERY_S; a Degraded resource ends the wait at once with its reason and message
    (the operator will not get there by itself)."""
    began = said = time.monotonic()
    print(f"[demo] waiting for etl/orders to be {kind} (up to {timeout_s:.0f} s)", flush=True)
    while True:
        conditions = {c.get("type"): c for c in status().get("conditions") or []}
        if (conditions.get(kind) or {}).get("status") == "True":
            return True
        degraded = conditions.get("Degraded") or {}
        if degraded.get("status") == "True":
            print(f"error: etl/orders is Degraded ({degraded.get('reason')}): "
                  f"{degraded.get('message')}", file=sys.stderr)
            return False
        waited = time.monotonic() - began
        if waited > timeout_s:
            now = conditions.get(kind) or {}
            print(f"error: etl/orders not {kind} after {timeout_s:.0f} s: "
                  f"{now.get('reason', 'no status yet')}: {now.get('message', '')}",
                  file=sys.stderr)
            return False
        if time.monotonic() - said >= WAIT_SAY_EVERY_S:
            now = conditions.get(kind) or {}
            print(f"[demo] still waiting for {kind} ({waited:.0f} s): "
                  f"{now.get('reason', 'no status yet')} {now.get('message', '')}".rstrip(),
                  flush=True)
            said = time.monotonic()
        time.sleep(1)


def _demo(state: Path) -> int:
    plane = ControlPlane(state, node=True)
    info = plane.info()
    if not plane.healthy():
        print("error: no dev cluster with a node is running; run `make dev-cluster` first",
              file=sys.stderr)
        return 1
    env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), str(tools_dir()),
                                    os.environ["PATH"]])}

    def sh(*argv: str, check: bool = True, stdin: str | None = None) -> str:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=CHECKOUT,
                              input=stdin)
        if check and proc.returncode:
            raise SystemExit(f"error: {' '.join(argv[:4])} … failed:\n{proc.stderr[-2000:]}")
        return proc.stdout

    def status() -> dict:  # type: ignore[type-arg]
        return dict(json.loads(sh("kubectl", "-n", "etl", "get", "tso", "orders", "-o",
                                  "json")).get("status") or {})

    began = time.monotonic()
    print("[demo] building and importing the operator and Spark images (minutes the first time)")
    sh(sys.executable, "-m", "tsoracle_dev.images", "--spark", "--import")
    sh("kubectl", "create", "namespace", "etl", check=False)
    sh("kubectl", "-n", "etl", "create", "serviceaccount", "spark", check=False)
    sh("helm", "upgrade", "--install", "tsoracle", "charts/tsoracle", "-n", "tsoracle-system",
       "--create-namespace", "--reuse-values", "--wait", "--set", "sparkDrivers.enabled=true",
       "--set", "sparkDrivers.namespace=etl", "--set", "sparkDrivers.serviceAccount=spark",
       "--set", "sparkDrivers.executorPods=true")
    secret = sh("kubectl", "-n", "etl", "create", "secret", "generic", "oracle-db",
                f"--from-literal=url={info['postgres_url']}", "--dry-run=client", "-o", "yaml")
    sh("kubectl", "-n", "etl", "apply", "-f", "-", stdin=secret)
    sh("kubectl", "-n", "etl", "label", "--overwrite", "secret", "oracle-db",
       "tsoracle.io/backend=true")
    if sh("kubectl", "-n", "etl", "get", "secret", "orders-catalog-token", check=False) == "":
        sh("kubectl", "-n", "etl", "apply", "-f", "-",
           stdin=catalog_token_secret("orders-catalog-token"))
    # One warehouse for every run (the catalog's tables live there); each run a table and
    # progress notes of its own, so the demo can run again on the same cluster.
    data = state / "spark-demo"
    prepare_data_dir(data)
    run = time.strftime("%Y%m%d_%H%M%S")
    (data / "progress" / run).mkdir()
    os.chown(data / "progress" / run, 65532, 65532)
    # The example, on a schema of its own: docs/operator.md's default/orders already owns
    # tsoracle_orders in the same database, and two resources never share a schema.
    example = yaml.safe_load((CHECKOUT / "examples" / "timestamporacle.yaml").read_text())
    example["spec"]["backend"]["schema"] = DEMO_SCHEMA
    sh("kubectl", "-n", "etl", "apply", "-f", "-", stdin=json.dumps(example))
    sh("kubectl", "-n", "etl", "patch", "tso", "orders", "--type", "merge", "-p",
       json.dumps({"spec": {"catalog": catalog_spec(data, "orders-catalog-token")}}))
    if not wait_condition(status, "CatalogReady", 180):
        return 1
    api = f"https://{info['host']}:{info['apiserver_port']}"
    print("[demo] flipping orders to legacy: the catalog's commits take legacy's timestamps")
    sh("kubectl", "tsoracle", "flip", "orders", "--to", "legacy", "-n", "etl")

    def submit(writer: str) -> subprocess.Popen[str]:
        argv = submit_argv(api, writer, namespace="etl", resource="orders", data=data,
                           token_secret="orders-catalog-token",
                           job_args=("--table", f"etl.events_{run}", "--batches",
                                     str(DEMO_BATCHES), "--rows", str(DEMO_ROWS),
                                     "--pause", "2", "--measure", "50"))
        argv[argv.index("--progress") + 1] = str(data / "progress" / run)
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env)

    done = data / "progress" / run / "x.done"
    first = submit("x")
    print("[demo] spark-submit x (driver and 2 executor pods)")
    while not done.exists() and first.poll() is None:
        time.sleep(0.5)
    second = submit("y")
    print("[demo] spark-submit y; flipping orders to distributed while both run")
    sh("kubectl", "tsoracle", "flip", "orders", "--to", "distributed", "-n", "etl")
    y_ran_through_flip = second.poll() is None
    bootstrap = int(status()["bootstrapTimestamp"]["EpochMilliseconds"])
    reports = {}
    for writer, proc in (("x", first), ("y", second)):
        out, _ = proc.communicate()
        try:
            pod = driver_pod(out)
            reports[writer] = {**report(sh("kubectl", "-n", "etl", "logs", pod)), "pod": pod}
        except ValueError as exc:
            print(f"[demo] {writer}: {exc}\n{out[-2000:]}", file=sys.stderr)
            return 1
    checks = demo_checks(reports, bootstrap, y_ran_through_flip)
    pods = sh("kubectl", "-n", "etl", "get", "pods", "-o", "name").split()
    print(f"\ntsoracle Spark-on-Kubernetes demo ({time.monotonic() - began:.0f} s)")
    for r in reports.values():
        print(f"  driver {r['pod']}: {DEMO_BATCHES} appends x {DEMO_ROWS} rows at "
              f"{[a['ts'] for a in r['appends']]} (the flip's bootstrap: {bootstrap})")
        print(f"    median append {_later(r, 'append_ms')} ms, median linearized read "
              f"{_later(r, 'read_ms')} ms, of which read_ts through the catalog "
              f"{r['read_ts_ms']} ms")
    print(f"  pods in etl: {len([p for p in pods if p.endswith('-driver')])} drivers, "
          f"{len([p for p in pods if '-exec-' in p])} executors still listed, "
          f"{len([p for p in pods if 'orders-catalog' in p])} catalog")
    for name, ok in checks:
        print(f"    [{'ok' if ok else 'FAIL'}] {name}")
    return 0 if all(ok for _, ok in checks) else 1


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv) != ["demo"]:
        print("usage: python -m tsoracle_dev.spark_k8s demo   (after make dev-cluster)",
              file=sys.stderr)
        return 2
    return _demo(DEFAULT_STATE)


if __name__ == "__main__":
    sys.exit(main())

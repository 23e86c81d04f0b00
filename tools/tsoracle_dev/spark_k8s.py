"""`spark-submit --deploy-mode cluster` of examples/spark/pipeline.py onto the dev node.

One place for the Spark configuration the tests, the demo and docs/spark.md use: the image, the
drivers' ServiceAccount, requests small enough for one 2-core node, and the hostPath volume the
driver and its executors share for the Parquet files.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tsoracle_dev import CHECKOUT
from tsoracle_dev.controlplane.cluster import DEFAULT_STATE, ControlPlane
from tsoracle_dev.kubetools import tools_dir

SPARK_IMAGE = "tsoracle-spark:0.1.0"
JOB = "local:///opt/tsoracle-spark/examples/pipeline.py"
REPORT = "TSORACLE_PIPELINE_REPORT "


def submit_argv(api_server: str, writer: str, *, namespace: str, resource: str, data: Path,
                image: str = SPARK_IMAGE, service_account: str = "spark",
                executors: int = 2, job_args: tuple[str, ...] = ()) -> list[str]:
    volume = {"mount.path": "/data", "options.path": str(data)}
    conf = {
        "spark.kubernetes.namespace": namespace,
        "spark.kubernetes.container.image": image,
        "spark.kubernetes.container.image.pullPolicy": "IfNotPresent",
        "spark.kubernetes.authenticate.driver.serviceAccountName": service_account,
        "spark.executor.instances": str(executors),
        # One node with 2 cores runs two drivers and four executors: small CPU requests (the
        # task slots stay spark.executor.cores = 1) and half a GiB of heap each.
        "spark.kubernetes.driver.request.cores": "0.1",
        "spark.kubernetes.executor.request.cores": "0.1",
        "spark.driver.memory": "512m",
        "spark.executor.memory": "512m",
        **{f"spark.kubernetes.{role}.volumes.hostPath.data.{key}": value
           for role in ("driver", "executor") for key, value in volume.items()},
        "spark.kubernetes.submission.waitAppCompletion": "true",
    }
    argv = ["spark-submit", "--master", f"k8s://{api_server}", "--deploy-mode", "cluster",
            "--name", f"pipeline-{writer}"]
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    return [*argv, JOB, "--resource", resource, "--namespace", namespace, "--writer", writer,
            "--data", "/data/tables", *job_args]


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
    """The hostPath folder, writable by the image's user."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["chown", "-R", f"{uid}:{uid}", str(path)], check=True)


# --- `make spark-k8s-demo`: two drivers on the dev node, a flip between them ----------------

def _later(rep: dict, key: str) -> int:  # type: ignore[type-arg]
    """The median of a driver's appends or reads after its first (which warms Spark up)."""
    return round(statistics.median(a[key] for a in rep["appends"][1:]))


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

    def sh(*argv: str, check: bool = True) -> str:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=CHECKOUT)
        if check and proc.returncode:
            raise SystemExit(f"error: {' '.join(argv[:4])} … failed:\n{proc.stderr[-2000:]}")
        return proc.stdout

    began = time.monotonic()
    print("[demo] building and importing the Spark image (minutes the first time)")
    sh(sys.executable, "-m", "tsoracle_dev.images", "--spark", "--import")
    sh("kubectl", "create", "namespace", "etl", check=False)
    sh("kubectl", "-n", "etl", "create", "serviceaccount", "spark", check=False)
    sh("helm", "upgrade", "--install", "tsoracle", "charts/tsoracle", "-n", "tsoracle-system",
       "--create-namespace", "--reuse-values", "--wait", "--set", "sparkDrivers.enabled=true",
       "--set", "sparkDrivers.namespace=etl", "--set", "sparkDrivers.serviceAccount=spark",
       "--set", "sparkDrivers.secretNames={oracle-db}", "--set", "sparkDrivers.executorPods=true")
    secret = sh("kubectl", "-n", "etl", "create", "secret", "generic", "oracle-db",
                f"--from-literal=url={info['postgres_url']}", "--dry-run=client", "-o", "yaml")
    subprocess.run(["kubectl", "apply", "-f", "-"], input=secret, env=env, check=True,
                   capture_output=True, text=True)
    sh("kubectl", "-n", "etl", "label", "--overwrite", "secret", "oracle-db",
       "tsoracle.io/backend=true")
    sh("kubectl", "-n", "etl", "apply", "-f", "examples/timestamporacle.yaml")
    sh("kubectl", "-n", "etl", "wait", "tso/orders", "--for=condition=Ready", "--timeout=120s")
    # Each run its own folder and so its own table: the catalog, in the cluster's PostgreSQL,
    # outlives a run, and a table must keep the folder it was written to.
    run = time.strftime("%Y%m%d_%H%M%S")
    data = state / "spark-demo" / run
    prepare_data_dir(data)
    api = f"https://{info['host']}:{info['apiserver_port']}"
    print("[demo] flipping orders to legacy: the first driver writes there alone")
    sh("kubectl", "tsoracle", "flip", "orders", "--to", "legacy", "-n", "etl")
    epoch0 = int(json.loads(sh("kubectl", "-n", "etl", "get", "tso", "orders", "-o",
                               "json"))["status"]["epoch"])

    def submit(writer: str) -> subprocess.Popen[str]:
        argv = submit_argv(api, writer, namespace="etl", resource="orders", data=data,
                           job_args=("--table", f"events_{run}", "--batches", "6", "--rows",
                                     "100", "--pause", "2", "--measure", "50"))
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env)

    done = data / "tables" / "_progress" / "x.done"
    first = submit("x")
    print("[demo] spark-submit x (driver and 2 executor pods)")
    while not done.exists() and first.poll() is None:
        time.sleep(0.5)
    second = submit("y")
    print("[demo] spark-submit y; flipping orders to distributed while both run")
    sh("kubectl", "tsoracle", "flip", "orders", "--to", "distributed", "-n", "etl")
    reports = {}
    for writer, proc in (("x", first), ("y", second)):
        out, _ = proc.communicate()
        try:
            pod = driver_pod(out)
            reports[writer] = {**report(sh("kubectl", "-n", "etl", "logs", pod)), "pod": pod}
        except ValueError as exc:
            print(f"[demo] {writer}: {exc}\n{out[-2000:]}", file=sys.stderr)
            return 1
    checks = []
    stamps = [a["ts"] for r in reports.values() for a in r["appends"]]
    checks.append(("every driver's own checks passed",
                   all(not r["failures"] for r in reports.values())))
    checks.append(("one timestamp per group commit, none reused",
                   len(set(stamps)) == len(stamps) == 12))
    checks.append(("nothing served by the superseded implementation", all(
        (a["epoch"], a["implementation"]) in ((epoch0, "legacy"), (epoch0 + 1, "distributed"))
        for r in reports.values() for a in r["appends"])))
    checks.append(("x wrote before and after the flip",
                   {a["epoch"] for a in reports["x"]["appends"]} == {epoch0, epoch0 + 1}))
    last = max(reports.values(), key=lambda r: r["final"]["read_ts"])
    checks.append(("the last read sees all 1200 rows, each once",
                   last["final"]["rows"] == last["final"]["distinct"] == 1200))
    pods = sh("kubectl", "-n", "etl", "get", "pods", "-o", "name").split()
    print(f"\ntsoracle Spark-on-Kubernetes demo ({time.monotonic() - began:.0f} s)")
    for r in reports.values():
        epochs = [a["epoch"] for a in r["appends"]]
        print(f"  driver {r['pod']}: 6 appends x 100 rows, epochs {epochs}, "
              f"reopens {r['reopens']}")
        share = r["oracle_ms"]
        print(f"    oracle per append group {share['append_group']} ms (write_ts "
              f"{share['write_ts']}, commit {share['commit']}, apply_write "
              f"{share['apply_write']}) of a median append of {_later(r, 'append_ms')} ms; "
              f"per linearized read {share['linearized_read']} ms of a median read of "
              f"{_later(r, 'read_ms')} ms")
    print(f"  pods in etl: {len([p for p in pods if p.endswith('-driver')])} drivers, "
          f"{len([p for p in pods if '-exec-' in p])} executors still listed")
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

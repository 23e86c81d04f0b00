"""Spark on Kubernetes on the dev node: driver and executor pods from `spark-submit
--deploy-mode cluster` writing Iceberg tables through the catalog the operator runs for the
TimestampOracle (spec.catalog), found through the resource's status.

The module fixture starts its own one-node cluster (tsoracle_dev.controlplane), imports the
operator and Spark images, installs the chart with `sparkDrivers` (the drivers' Role, and the
Role for Spark's executor pods), the backend Secret, the catalog's token Secret and the example
resource with its catalog, in the `etl` namespace.

Two drivers across a flip back to distributed are `make spark-k8s-demo`'s scenario: the guides
chain (tests/test_docs.py) runs it on its dev cluster, and its checks (`demo_checks`, unit-tested
in tests/test_dev_cluster.py) make the run fail. The drivers that follow a killed one are the
two that append across a flip to legacy: one test, so Spark starts three drivers here, not four.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.support.node import own_node
from tsoracle_dev import spark_k8s
from tsoracle_dev.kube import Kube, condition, is_ready

ROOT = Path(__file__).resolve().parents[1]

# The module's own cluster, and spark-submit (a JVM) on this host.
pytestmark = [pytest.mark.node, pytest.mark.kube, pytest.mark.pg, pytest.mark.spark]

NS, SA = "etl", "spark"
DRIVER_SA = f"system:serviceaccount:{NS}:{SA}"
EXAMPLE = ROOT / "examples" / "timestamporacle.yaml"
TOKEN_SECRET = "orders-catalog-token"
TABLE = "etl.events"
BATCHES, ROWS = 6, 100
# One executor pod per driver: the executors' Role, pods and writes are the same with one, and
# each JVM costs the 2-core node seconds (`make spark-k8s-demo` runs two each).
EXECUTORS = 1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with own_node(tmp_path_factory, "spark-node") as node:
        yield prepared(node, tmp_path_factory)


def prepared(node: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """The chart with sparkDrivers, the images, the Secrets and the resource with its catalog."""
    kube, env, plane = node.kube, node.env, node.plane
    subprocess.run([sys.executable, "-m", "tsoracle_dev.images", "--spark",
                    "--import"], env=env, check=True, capture_output=True, timeout=1800)
    kube.kubectl("create", "namespace", NS)
    kube.kubectl("-n", NS, "create", "serviceaccount", SA)
    # No sparkDrivers.secretNames: the drivers reach the oracle through the catalog only, and
    # need no database credentials.
    kube.helm("install", "tsoracle", str(ROOT / "charts/tsoracle"), "-n", "tsoracle-system",
              "--create-namespace", "--wait", "--set", "sparkDrivers.enabled=true",
              "--set", f"sparkDrivers.namespace={NS}", "--set",
              f"sparkDrivers.serviceAccount={SA}", "--set", "sparkDrivers.executorPods=true")
    kube.backend_secret(NS, "oracle-db", node.pg_url)
    kube.backend_secret(NS, "other-db", "postgresql://x:not-for-spark@10.244.0.1:1/x")
    kube.kubectl("-n", NS, "apply", "-f", "-", stdin=spark_k8s.catalog_token_secret(TOKEN_SECRET))
    data = tmp_path_factory.mktemp("spark-data")
    spark_k8s.prepare_data_dir(data)
    kube.kubectl("-n", NS, "apply", "-f", str(EXAMPLE))
    kube.kubectl("-n", NS, "patch", "tso", "orders", "--type", "merge", "-p", json.dumps(
        {"spec": {"catalog": spark_k8s.catalog_spec(data, TOKEN_SECRET)}}))
    kube.wait_tso(NS, "orders", lambda o: is_ready(o) and condition(o, "CatalogReady").get(
        "status") == "True", timeout=240, what="Ready and CatalogReady")
    api = json.loads(kube.kubectl("config", "view", "--minify", "-o", "json").stdout)[
        "clusters"][0]["cluster"]["server"]
    return SimpleNamespace(kube=kube, env=env, data=data, api=api, plane=plane, submitted=[])


@pytest.fixture(autouse=True)
def no_submission_outlives_its_test(cluster):
    yield
    for proc in cluster.submitted:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def submit(cluster: SimpleNamespace, writer: str, *job_args: str) -> subprocess.Popen[str]:
    argv = spark_k8s.submit_argv(cluster.api, writer, namespace=NS, resource="orders",
                                 data=cluster.data, token_secret=TOKEN_SECRET,
                                 executors=EXECUTORS, job_args=("--table", TABLE, *job_args))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=cluster.env)
    cluster.submitted.append(proc)
    return proc


def finished(cluster: SimpleNamespace, proc: subprocess.Popen[str]) -> dict[str, object]:
    try:
        out, _ = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            seen = activity(cluster)
        except Exception as exc:  # noqa: BLE001 - the hang is the failure to report
            seen = f"(what the database and pods were doing is unknown: {exc})"
        raise AssertionError(f"the submission never ended; {seen}") from None
    assert proc.returncode == 0, out[-4000:]
    pod = spark_k8s.driver_pod(out)
    log = cluster.kube.kubectl("-n", NS, "logs", pod).stdout
    try:
        result = spark_k8s.report(log)
    except ValueError:
        # Python's traceback and the Java exceptions' messages, not their frames.
        tail = "\n".join(line for line in log.splitlines()
                         if " INFO " not in line and " WARN " not in line
                         and not line.lstrip().startswith(("at ", "...")))[-6000:]
        raise AssertionError(f"{pod} printed no report:\n{tail}") from None
    result["pod"] = pod
    return result


def activity(cluster: SimpleNamespace) -> str:
    """What the database's sessions and the namespace's pods are doing, for a failure."""
    with psycopg.connect(cluster.plane.info()["postgres_url"], autocommit=True) as conn:
        sessions = conn.execute(
            "SELECT client_addr::text, application_name, state, wait_event_type, wait_event,"
            " now() - xact_start, left(query, 120) FROM pg_stat_activity"
            " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()").fetchall()
    pods = cluster.kube.kubectl("-n", NS, "get", "pods", "-o", "wide").stdout
    return "sessions:\n" + "\n".join(map(str, sessions)) + "\npods:\n" + pods


def wait_appended(cluster: SimpleNamespace, writer: str, proc: subprocess.Popen[str],
                  appends: int) -> None:
    """Until the running driver has finished `appends` appends."""
    deadline = time.monotonic() + 600
    while progress(cluster, writer) < appends:
        assert time.monotonic() < deadline, f"driver {writer} never appended"
        assert proc.poll() is None, f"driver {writer} ended early"
        time.sleep(0.5)


def flip(cluster: SimpleNamespace, to: str) -> int:
    """Flip the resource; returns where the new implementation started on EpochMilliseconds
    (the flip's bootstrap: the old one handed out nothing above it, the new one nothing at or
    below it)."""
    done = subprocess.run(["kubectl", "tsoracle", "flip", "orders", "--to", to, "-n", NS],
                          env=cluster.env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    status = cluster.kube.tso(NS, "orders")["status"]
    assert status["activeImplementation"] == to
    return int(status["bootstrapTimestamp"]["EpochMilliseconds"])


def progress(cluster: SimpleNamespace, writer: str) -> int:
    done = cluster.data / "progress" / f"{writer}.done"
    return int(done.read_text() or 0) if done.exists() else 0


def check(rep: dict[str, object]) -> list[int]:
    """The driver's own checks passed (reads saw what had finished; each append visible exactly
    from its timestamp); returns its commit timestamps, which only grow."""
    assert rep["failures"] == [], rep["failures"]
    appends = rep["appends"]
    assert [a["batch"] for a in appends] == list(range(BATCHES))
    stamps = [a["ts"] for a in appends]
    assert stamps == sorted(set(stamps)), stamps
    return stamps


def scheduled_pods(kube: Kube) -> set[str]:
    events = json.loads(kube.kubectl("-n", NS, "get", "events", "-o", "json").stdout)["items"]
    return {e["involvedObject"]["name"] for e in events if e["reason"] == "Scheduled"}


def test_the_drivers_service_account_reads_the_resource_and_no_secret(cluster):
    kube = cluster.kube

    def can(*args: str) -> str:
        return kube.kubectl("auth", "can-i", *args, "-n", NS, "--as", DRIVER_SA,
                            check=False).stdout.strip()
    assert can("get", "timestamporacles.tsoracle.io/orders") == "yes"
    for denied in ("secret/oracle-db", "secret/other-db", f"secret/{TOKEN_SECRET}"):
        assert can("get", denied) == "no", denied
    assert can("list", "secrets") == "no"
    assert can("patch", "timestamporacles.tsoracle.io/orders") == "no"
    # A real request with the drivers' own token, as a driver pod would send it.
    token = kube.kubectl("-n", NS, "create", "token", SA).stdout.strip()
    denied = kube.kubectl("-n", NS, "get", "secret", "oracle-db", "--token", token, check=False)
    assert denied.returncode != 0 and "Forbidden" in denied.stderr, denied.stderr
    patched = kube.kubectl("-n", NS, "patch", "tso", "orders", "--type", "merge", "-p",
                           '{"spec":{"implementation":"distributed"}}', "--token", token,
                           check=False)
    assert patched.returncode != 0 and "Forbidden" in patched.stderr, patched.stderr
    found = json.loads(kube.kubectl("-n", NS, "get", "tso", "orders", "--token", token, "-o",
                                    "json").stdout)
    assert found["status"]["catalog"]["url"] == f"http://orders-catalog.{NS}.svc:8181"
    print(f"\ndenied: {denied.stderr.strip()}\ndenied: {patched.stderr.strip()}")


def test_a_killed_driver_leaves_no_partial_append_and_two_drivers_then_append_across_a_flip(
        cluster):
    """A driver pod is killed while its commit waits in the catalog (on a lock the test holds):
    the commit was the catalog's to finish, so its batch is there whole or not at all. Then two
    spark-submits append to the same table at once, and the resource flips to legacy while
    they run: one timestamp per commit, each driver's stamps only grow, and the first driver
    committed on distributed before the flip and on legacy after it."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    # The table first (as the pipeline declares it), so the killed driver's first write to the
    # catalog is its append's commit, not the table's creation.
    catalog = host_catalog(cluster)
    catalog.create_namespace_if_not_exists(TABLE.split(".")[0])
    catalog.create_table(TABLE, Schema(*(
        NestedField(i, name, kind, required=False) for i, (name, kind) in enumerate(
            [("writer", StringType()), ("batch", LongType()), ("seq", LongType())], start=1))))
    kill_a_driver_mid_commit(cluster, "d")
    assert progress(cluster, "d") == 0  # it never finished an append

    kube = cluster.kube
    assert kube.tso(NS, "orders")["status"]["activeImplementation"] == "distributed"
    started = time.monotonic()
    # The pause leaves the first driver at least 3 appends after its second, 4 s apart: the
    # flip (seconds) comes before the last of them.
    procs = {w: submit(cluster, w, "--batches", str(BATCHES), "--rows", str(ROWS),
                       "--pause", "4", "--measure", "30") for w in ("a", "b")}
    wait_appended(cluster, "a", procs["a"], 2)
    bootstrap = flip(cluster, "legacy")
    reports = {w: finished(cluster, p) for w, p in procs.items()}
    elapsed = time.monotonic() - started
    stamps = {w: check(rep) for w, rep in reports.items()}
    every = [ts for s in stamps.values() for ts in s]
    assert len(set(every)) == len(every) == 2 * BATCHES  # one timestamp per commit
    for w, rep in reports.items():
        assert sorted(rep["final"]["stamps"]) == [f"{w}/{b}" for b in range(BATCHES)]
    # Stamped by distributed before the flip, by legacy after it, nothing out of order.
    assert stamps["a"][1] <= bootstrap < stamps["a"][-1], (stamps, bootstrap)
    # The appends overlapped in time (else this proves nothing about concurrency).
    spans = [(s[0], s[-1]) for s in stamps.values()]
    assert max(lo for lo, _ in spans) < min(hi for _, hi in spans), spans

    # What the killed driver left, read by a second engine (pyiceberg on this host, through
    # the Service): its first batch whole or not at all, nothing of the batches it never sent.
    found = catalog.load_table(TABLE).scan(row_filter="writer == 'd'").to_arrow()
    left = dict(Counter(found["batch"].to_pylist()))
    assert left in ({}, {0: ROWS}), left
    last = max(reports.values(), key=lambda r: r["final"]["read_ts"])
    # The later final read sees every row of both drivers and what the killed one left, once.
    rows = 2 * BATCHES * ROWS + sum(left.values())
    assert last["final"]["rows"] == last["final"]["distinct"] == rows, (last["final"], left)
    scheduled = scheduled_pods(kube)
    drivers = sorted(p for p in scheduled if p.endswith("-driver"))
    executors = sorted(p for p in scheduled if "-exec-" in p)
    # The killed driver's pod and the two drivers', with their executor pods.
    assert len(drivers) == 3 and len(executors) >= 3 * EXECUTORS, scheduled
    assert all(r["read_ts_ms"] > 0 for r in reports.values())
    print(f"\nthe killed driver's commit: {'landed whole' if left else 'did not land'}"
          f"\nspark on k8s: drivers {drivers}, {len(executors)} executor pods, "
          f"{2 * BATCHES} commits, {2 * BATCHES * ROWS} rows, {elapsed:.0f} s; "
          f"stamps {stamps}, flipped to legacy at {bootstrap}; "
          f"append ms {[a['append_ms'] for r in reports.values() for a in r['appends']]}; "
          f"read ms {[a['read_ms'] for r in reports.values() for a in r['appends']]}; "
          f"read_ts through the catalog, median ms {[r['read_ts_ms'] for r in reports.values()]}")


def kill_a_driver_mid_commit(cluster: SimpleNamespace, writer: str) -> None:
    """The catalog's pointer swap waits on a lock this holds; the driver pod is killed while
    it waits, and the lock released once its container is gone."""
    kube = cluster.kube
    url = cluster.plane.info()["postgres_url"]
    holder = psycopg.connect(url)
    objects = holder.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s"
        " AND table_name LIKE %s", ("tsoracle_orders", "%iceberg_objects%")).fetchone()[0]
    holder.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(
        sql.Identifier("tsoracle_orders", objects)))
    proc = submit(cluster, writer, "--batches", "3", "--rows", str(ROWS))
    try:
        with psycopg.connect(url, autocommit=True) as admin:
            deadline = time.monotonic() + 600
            while not admin.execute("SELECT count(*) FROM pg_stat_activity WHERE"
                                    " wait_event_type = 'Lock' AND pid <> %s",
                                    (holder.info.backend_pid,)).fetchone()[0]:
                assert time.monotonic() < deadline, "the commit never reached the catalog"
                assert proc.poll() is None, "the driver ended early"
                time.sleep(0.5)
        [driver] = [p for p in json.loads(kube.kubectl(
            "-n", NS, "get", "pods", "-l", "spark-role=driver", "-o", "json").stdout)["items"]
            if p["status"].get("phase") == "Running"]
        container = driver["status"]["containerStatuses"][0]["containerID"].split("//")[1]
        kube.kubectl("-n", NS, "delete", "pod", driver["metadata"]["name"],
                     "--grace-period=0", "--force")
        tasks = ["ctr", "--address", cluster.plane.info()["containerd_address"], "-n", "k8s.io",
                 "tasks", "ls", "-q"]
        deadline = time.monotonic() + 60
        while container in subprocess.run(tasks, capture_output=True, text=True).stdout:
            assert time.monotonic() < deadline, "the driver's container did not stop"
            time.sleep(0.5)
    finally:
        holder.rollback()
        holder.close()
    proc.communicate(timeout=300)  # spark-submit ends with its driver, however it ended


def host_catalog(cluster: SimpleNamespace) -> Any:
    """pyiceberg on this host, a second engine, through the catalog's Service (a RestCatalog;
    imported here, as the module is collected in every tier)."""
    from pyiceberg.catalog.rest import RestCatalog

    kube = cluster.kube
    svc = kube.get(NS, "service", "orders-catalog")
    token = kube.kubectl("-n", NS, "get", "secret", TOKEN_SECRET, "-o",
                         "jsonpath={.data.token}").stdout
    return RestCatalog("host", uri=f"http://{svc['spec']['clusterIP']}:8181",
                       token=base64.b64decode(token).decode())

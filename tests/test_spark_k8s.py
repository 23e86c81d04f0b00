"""Spark on Kubernetes on the dev node: driver and executor pods from `spark-submit
--deploy-mode cluster`, finding the oracle only through the TimestampOracle resource.

The module fixture starts its own one-node cluster (tsoracle_dev.controlplane), imports the
operator and Spark images, installs the chart with `sparkDrivers` (the drivers' Role, and the
Role for Spark's executor pods), a Secret and the example resource, in the `etl` namespace.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psycopg
import pytest
from psycopg import sql

from tests.support.node import own_node
from tsoracle.spark.client import OracleClient
from tsoracle_dev import spark_k8s
from tsoracle_dev.kube import Kube, is_ready

ROOT = Path(__file__).resolve().parents[1]

# The module's own cluster, and spark-submit (a JVM) on this host.
pytestmark = [pytest.mark.node, pytest.mark.kube, pytest.mark.pg, pytest.mark.spark]

NS, SA = "etl", "spark"
DRIVER_SA = f"system:serviceaccount:{NS}:{SA}"
EXAMPLE = ROOT / "examples" / "timestamporacle.yaml"
BATCHES, ROWS = 6, 100


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with own_node(tmp_path_factory, "spark-node") as node:
        yield prepared(node, tmp_path_factory)


def prepared(node: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """The chart with sparkDrivers, the Spark image, a Secret and the example resource."""
    kube, env, plane = node.kube, node.env, node.plane
    subprocess.run([sys.executable, "-m", "tsoracle_dev.images", "--spark",
                    "--import"], env=env, check=True, capture_output=True, timeout=1800)
    kube.kubectl("create", "namespace", NS)
    kube.kubectl("-n", NS, "create", "serviceaccount", SA)
    kube.helm("install", "tsoracle", str(ROOT / "charts/tsoracle"), "-n", "tsoracle-system",
              "--create-namespace", "--wait", "--set", "sparkDrivers.enabled=true",
              "--set", f"sparkDrivers.namespace={NS}", "--set",
              f"sparkDrivers.serviceAccount={SA}", "--set",
              "sparkDrivers.secretNames={oracle-db}", "--set", "sparkDrivers.executorPods=true")
    kube.backend_secret(NS, "oracle-db", node.pg_url)
    kube.backend_secret(NS, "other-db", "postgresql://x:not-for-spark@10.244.0.1:1/x")
    kube.kubectl("-n", NS, "apply", "-f", str(EXAMPLE))
    kube.wait_tso(NS, "orders", is_ready, timeout=120, what="Ready")
    data = tmp_path_factory.mktemp("spark-data")
    spark_k8s.prepare_data_dir(data)
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
                                 data=cluster.data, job_args=job_args)
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
        tail = "\n".join(line for line in log.splitlines()
                         if " INFO " not in line and " WARN " not in line)[-6000:]
        raise AssertionError(f"{pod} printed no report:\n{tail}") from None
    result["pod"] = pod
    return result


def activity(cluster: SimpleNamespace) -> str:
    """What the database's sessions and the namespace's pods are doing, for a failure."""
    with psycopg.connect(cluster.plane.info()["postgres_url"], autocommit=True) as conn:
        sessions = conn.execute(
            "SELECT client_addr::text, state, wait_event_type, wait_event,"
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


def flip(cluster: SimpleNamespace, to: str) -> None:
    done = subprocess.run(["kubectl", "tsoracle", "flip", "orders", "--to", to, "-n", NS],
                          env=cluster.env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def progress(cluster: SimpleNamespace, writer: str) -> int:
    done = cluster.data / "tables" / "_progress" / f"{writer}.done"
    return int(done.read_text() or 0) if done.exists() else 0


def check(rep: dict[str, object], epochs: set[int]) -> list[int]:
    """The driver's own checks passed, every batch committed once, nothing served by an
    implementation the epoch had superseded; returns its commit timestamps."""
    assert rep["failures"] == [], rep["failures"]
    appends = rep["appends"]
    assert [a["batch"] for a in appends] == list(range(BATCHES))
    for a in appends:  # epoch 1 is distributed, 2 legacy (the example starts distributed)
        assert (a["epoch"], a["implementation"]) in ((1, "distributed"), (2, "legacy")), a
    assert {a["epoch"] for a in appends} == epochs, appends
    return [a["ts"] for a in appends]


def scheduled_pods(kube: Kube) -> set[str]:
    events = json.loads(kube.kubectl("-n", NS, "get", "events", "-o", "json").stdout)["items"]
    return {e["involvedObject"]["name"] for e in events if e["reason"] == "Scheduled"}


def test_two_drivers_append_concurrently_to_one_table(cluster):
    kube = cluster.kube
    started = time.monotonic()
    procs = {w: submit(cluster, w, "--batches", str(BATCHES), "--rows", str(ROWS),
                       "--measure", "30") for w in ("a", "b")}
    reports = {w: finished(cluster, p) for w, p in procs.items()}
    elapsed = time.monotonic() - started
    stamps = [ts for rep in reports.values() for ts in check(rep, {1})]
    assert len(set(stamps)) == len(stamps) == 2 * BATCHES  # one timestamp per group commit
    # The appends overlapped in time (else this proves nothing about concurrency).
    spans = [(r["appends"][0]["ts"], r["appends"][-1]["ts"]) for r in reports.values()]
    assert max(lo for lo, _ in spans) < min(hi for _, hi in spans), spans
    last = max(reports.values(), key=lambda r: r["final"]["read_ts"])
    # The later final read sees every row of both drivers, each once.
    assert last["final"]["rows"] == last["final"]["distinct"] == 2 * BATCHES * ROWS
    scheduled = scheduled_pods(kube)
    drivers = sorted(p for p in scheduled if p.endswith("-driver"))
    executors = sorted(p for p in scheduled if "-exec-" in p)
    assert len(drivers) == 2 and len(executors) >= 4, scheduled
    # The oracle's own share, timed in each driver pod (docs/spark.md reports the figures).
    for rep in reports.values():
        share = rep["oracle_ms"]
        assert all(share[k] > 0 for k in ("write_ts", "apply_write", "commit",
                                          "linearized_read")), share
        assert share["append_group"] == pytest.approx(
            share["write_ts"] + share["commit"] + share["apply_write"], abs=0.02)
    print(f"\nspark on k8s: drivers {drivers}, {len(executors)} executor pods, "
          f"{2 * BATCHES} group commits, {2 * BATCHES * ROWS} rows, {elapsed:.0f} s; "
          f"append ms {[a['append_ms'] for r in reports.values() for a in r['appends']]}; "
          f"read ms {[a['read_ms'] for r in reports.values() for a in r['appends']]}; "
          f"oracle ms {[r['oracle_ms'] for r in reports.values()]}")


def test_a_flip_while_a_driver_runs(cluster):
    """One driver: two would fence each other on legacy, which has one leader per timeline."""
    kube = cluster.kube
    proc = submit(cluster, "c", "--batches", str(BATCHES), "--rows", str(ROWS), "--pause", "2")
    wait_appended(cluster, "c", proc, 2)
    flip(cluster, "legacy")
    rep = finished(cluster, proc)
    stamps = check(rep, {1, 2})
    assert len(set(stamps)) == BATCHES and stamps == sorted(stamps)  # none reused, none behind
    assert kube.tso(NS, "orders")["status"]["epoch"] == 2
    assert rep["final"]["rows"] == rep["final"]["distinct"] == 3 * BATCHES * ROWS
    print(f"\nflip during a driver: epochs {[a['epoch'] for a in rep['appends']]}, "
          f"reopens {rep['reopens']}")


def test_two_drivers_run_across_a_flip_back_to_distributed(cluster):
    """Both spark-submits run while the flip happens: the first driver writes on legacy (alone:
    legacy has one leader per timeline), the second starts as the flip lands; both finish on
    distributed with no timestamp reused and nothing served by the superseded legacy."""
    kube = cluster.kube
    assert kube.tso(NS, "orders")["status"]["activeImplementation"] == "legacy"
    first = submit(cluster, "e", "--batches", str(BATCHES), "--rows", str(ROWS), "--pause", "2")
    wait_appended(cluster, "e", first, 1)
    second = submit(cluster, "f", "--batches", str(BATCHES), "--rows", str(ROWS))
    flip(cluster, "distributed")
    assert second.poll() is None, "the second spark-submit must still run during the flip"
    reports = {"e": finished(cluster, first), "f": finished(cluster, second)}
    for writer, rep in reports.items():
        assert rep["failures"] == [], (writer, rep["failures"])
        for a in rep["appends"]:
            assert (a["epoch"], a["implementation"]) in ((2, "legacy"), (3, "distributed")), a
    assert {a["epoch"] for a in reports["e"]["appends"]} == {2, 3}
    assert {a["epoch"] for a in reports["f"]["appends"]} == {3}
    stamps = [a["ts"] for r in reports.values() for a in r["appends"]]
    assert len(set(stamps)) == len(stamps) == 2 * BATCHES
    last = max(reports.values(), key=lambda r: r["final"]["read_ts"])
    assert last["final"]["rows"] == last["final"]["distinct"] == 5 * BATCHES * ROWS
    print(f"\nacross a flip: e epochs {[a['epoch'] for a in reports['e']['appends']]}, "
          f"f epochs {[a['epoch'] for a in reports['f']['appends']]}")


def test_the_drivers_service_account_is_refused_other_secrets_and_changes(cluster):
    kube = cluster.kube

    def can(*args: str) -> str:
        return kube.kubectl("auth", "can-i", *args, "-n", NS, "--as", DRIVER_SA,
                            check=False).stdout.strip()
    assert can("get", "timestamporacles.tsoracle.io/orders") == "yes"
    assert can("get", "secret/oracle-db") == "yes"
    assert can("get", "secret/other-db") == "no"
    assert can("list", "secrets") == "no"
    assert can("patch", "timestamporacles.tsoracle.io/orders") == "no"
    # A real request with the drivers' own token, as a driver pod would send it.
    token = kube.kubectl("-n", NS, "create", "token", SA).stdout.strip()
    denied = kube.kubectl("-n", NS, "get", "secret", "other-db", "--token", token, check=False)
    assert denied.returncode != 0 and "Forbidden" in denied.stderr, denied.stderr
    assert "not-for-spark" not in denied.stdout + denied.stderr
    patched = kube.kubectl("-n", NS, "patch", "tso", "orders", "--type", "merge", "-p",
                           '{"spec":{"implementation":"distributed"}}', "--token", token,
                           check=False)
    assert patched.returncode != 0 and "Forbidden" in patched.stderr, patched.stderr
    print(f"\ndenied: {denied.stderr.strip()}\ndenied: {patched.stderr.strip()}")
    secret = json.loads(kube.kubectl("-n", NS, "get", "secret", "oracle-db", "--token", token,
                                     "-o", "json").stdout)
    assert base64.b64decode(secret["data"]["url"]).startswith(b"postgresql://")


def test_a_driver_killed_mid_commit_leaves_nothing_and_a_rerun_completes(cluster):
    """The commit's catalog insert waits on a lock the test holds; the driver pod is killed
    while it waits, and the lock released only once its container is gone."""
    kube = cluster.kube
    url = cluster.plane.info()["postgres_url"]
    # The catalog's tables exist once any client opened the resource (so also run alone).
    OracleClient.from_resource("orders", NS, data_dir=cluster.data / "tables",
                               kubeconfig=cluster.env["KUBECONFIG"]).close()
    holder = psycopg.connect(url)
    commits = holder.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s"
        " AND table_name LIKE %s", ("tsoracle_orders", "%commit%")).fetchone()[0]
    holder.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(
        sql.Identifier("tsoracle_orders", commits)))
    proc = submit(cluster, "d", "--batches", "3", "--rows", str(ROWS))
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
    assert progress(cluster, "d") == 0  # it never finished an append

    rerun = finished(cluster, submit(cluster, "d2", "--batches", "2", "--rows", str(ROWS)))
    assert rerun["failures"] == []
    stamps = rerun["final"]["stamps"]
    assert not [key for key in stamps if key.startswith("d/")], stamps  # nothing partial
    assert sorted(k for k in stamps if k.startswith("d2/")) == ["d2/0", "d2/1"]
    assert rerun["final"]["rows"] == rerun["final"]["distinct"]

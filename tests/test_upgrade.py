"""Upgrading in place on a real node: `helm upgrade` from the previous release (its chart, and
its operator image built from its commit by its own image tooling) to this checkout's, then
`helm rollback` to it, with TimestampOracle resources live and writers running.

Across both: no epoch changes (the operator flips nothing and fences nobody), no error and no
reopen reaches a writer, no timestamp is handed out twice, and the resources keep their status.
The writers run on this host against the node's PostgreSQL, as a service outside the cluster
would. The cluster is tests/support/node.py's own_node, in a folder of this module's; the tests
run in file order and build on each other.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import tsoracle
from tests.support.node import own_node
from tsoracle.oracle.reopening import ReopeningOracle
from tsoracle_dev import images
from tsoracle_dev.kube import Kube, condition, is_ready

ROOT = Path(__file__).resolve().parents[1]

# The module's own cluster; every test fails at once, before the cluster starts, without the
# previous release's commit.
pytestmark = [pytest.mark.node, pytest.mark.kube, pytest.mark.pg,
              pytest.mark.usefixtures("previous_tree")]

# The release before this checkout's, by name and by commit: bump both when a release lands. The
# commit is the reference, since git tags do not travel with a branch (a clone of main has no
# tags: the first CI run of this test failed on exactly that).
PREVIOUS = "v0.1.0"
PREVIOUS_COMMIT = "52448cc89b4d486988696ee7508087f0346e91e0"
RELEASE, SYSTEM, NS = "tsoracle", "tsoracle-system", "upgrade-app"
# The old image under a tag of its own: both releases' charts say appVersion 0.1.0.
OLD_IMAGE = images.normalise(f"{images.OPERATOR.repository}:{PREVIOUS}")
NEW_IMAGE = images.OPERATOR_IMAGE_NORMALISED
METRICS_PORT = 8081  # the chart's default metrics.port, in both releases
# What a pass that changes nothing must leave as it found it.
STABLE_STATUS = ("activeImplementation", "epoch", "incarnation", "fencing", "bootstrapTimestamp",
                 "lastFlipTime", "observedGeneration")
RESOURCES = {  # name -> (implementation, the timeline its writer uses)
    "orders": ("distributed", "counter:orders"),
    "ledger": ("legacy", "counter:ledger"),
}
TIMES: dict[str, float] = {}
SEEN: dict[str, Any] = {}


def _timed(step: str, started: float) -> None:
    TIMES[step] = round(time.monotonic() - started, 1)


def _git(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *argv], capture_output=True, text=True)


def _have_previous() -> bool:
    return _git("cat-file", "-e", f"{PREVIOUS_COMMIT}^{{commit}}").returncode == 0


@pytest.fixture(scope="module")
def previous_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's files, from its commit (missing, it fails, never skips)."""
    if not _have_previous() and _git("rev-parse", "--is-shallow-repository").stdout.strip() == \
            "true":
        for remote in _git("remote").stdout.split()[:1]:
            _git("fetch", "--quiet", remote, PREVIOUS_COMMIT)
    if not _have_previous():
        pytest.fail(f"commit {PREVIOUS_COMMIT[:12]} (release {PREVIOUS}) is not in this clone "
                    f"({ROOT}): this test upgrades from that release, built from its commit. A "
                    f"shallow clone may lack it: run `git fetch --unshallow` and run again",
                    pytrace=False)
    out = tmp_path_factory.mktemp("previous")
    tar = out / f"{PREVIOUS}.tar"
    made = _git("archive", "--format=tar", "-o", str(tar), PREVIOUS_COMMIT)
    assert made.returncode == 0, made.stderr
    tree = out / PREVIOUS
    tree.mkdir()
    subprocess.run(["tar", "-xf", str(tar), "-C", str(tree)], check=True)
    return tree


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory):
    started = time.monotonic()
    with own_node(tmp_path_factory, "upgrade-node") as cluster:
        _timed("own node up", started)
        try:
            yield cluster
        finally:
            for w in (STATE.pop("writers", None) or {}).values():
                w.stop()  # a failed test left them running
            print("\nupgrade test timings (s):", json.dumps(TIMES))
            print("upgrade test saw:", json.dumps(SEEN, default=str))


def run(node: SimpleNamespace, *argv: str, timeout: float = 600) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, env=node.env, timeout=timeout,
                          cwd=ROOT)
    assert proc.returncode == 0, f"{' '.join(argv)}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def wait_for(what: str, probe: Any, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := probe():
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def ctr(node: SimpleNamespace, *argv: str) -> str:
    return subprocess.run(["ctr", "--address", node.plane.info()["containerd_address"], "-n",
                           "k8s.io", *argv], capture_output=True, text=True, check=True).stdout


def operator_pod(kube: Kube, image: str) -> dict[str, Any] | None:
    """The one operator pod, if it is Ready and runs `image` (and no other pod is left)."""
    pods = json.loads(kube.kubectl("-n", SYSTEM, "get", "pods", "-l",
                                   "app.kubernetes.io/component=operator", "-o",
                                   "json").stdout)["items"]
    if len(pods) != 1 or "deletionTimestamp" in pods[0]["metadata"]:
        return None
    [pod] = pods
    [status] = pod["status"].get("containerStatuses") or [{}]
    return pod if status.get("ready") and status.get("image") == image else None


def reconciles(pod: dict[str, Any]) -> float:
    """Successful passes of that operator pod so far, from its own /metrics (pod network)."""
    url = f"http://{pod['status']['podIP']}:{METRICS_PORT}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith('tsoracle_operator_reconciles_total{result="ok"}'))


def crd_status_fields(kube: Kube) -> set[str]:
    crd = json.loads(kube.kubectl("get", "crd", "timestamporacles.tsoracle.io", "-o",
                                  "json").stdout)
    [version] = crd["spec"]["versions"]
    return set(version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"])


class Writers:
    """Writer tasks on this host sharing one ReopeningOracle that follows the active
    implementation (a legacy timeline's leader), in a thread with its own event loop. They
    record (monotonic time, timestamp) per task, the errors that reach them, and reopens."""

    def __init__(self, url: str, timeline: str, tasks: int = 8, pause: float = 0.02) -> None:
        self.url, self.timeline, self.pause = url, timeline, pause
        self.done: list[list[tuple[float, int]]] = [[] for _ in range(tasks)]
        self.errors: list[str] = []
        self.reopens = 0
        self._halt = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)

    def start(self) -> Writers:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), f"the writers of {self.timeline} did not stop"

    def writes(self) -> int:
        return sum(len(d) for d in self.done)

    def timestamps(self) -> list[int]:
        return [ts for d in self.done for _, ts in d]

    def longest_wait(self, start: float, end: float) -> float:
        """The longest gap between two writes of one task that overlaps [start, end]."""
        worst = 0.0
        for d in self.done:
            for (a, _), (b, _) in zip(d, d[1:], strict=False):
                if b >= start and a <= end:
                    worst = max(worst, b - a)
        return worst

    async def _main(self) -> None:
        oracle = ReopeningOracle(lambda: tsoracle.open_oracle(
            self.url, timeline=self.timeline, implementation=None), name=self.timeline)
        try:
            await asyncio.gather(*(self._task(oracle, d) for d in self.done))
        finally:
            self.reopens = oracle.reopens
            await oracle.close()

    async def _task(self, oracle: ReopeningOracle, done: list[tuple[float, int]]) -> None:
        while not self._halt.is_set():
            try:
                ts = (await oracle.write_ts()).timestamp
                done.append((time.monotonic(), ts))
            except Exception as exc:  # every kind counts: none may reach a writer
                self.errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            await asyncio.sleep(self.pause)


def schema_url(node: SimpleNamespace, name: str) -> str:
    return f"{node.pg_url}?schema=tsoracle_{name}"


def database_epochs(node: SimpleNamespace) -> dict[str, tuple[int, int, dict[str, int]]]:
    """Per resource: the deployment's epoch and incarnation and each timeline's legacy leader
    epoch, from the database itself."""
    out = {}
    for name in RESOURCES:
        st = asyncio.run(tsoracle.status(schema_url(node, name)))
        out[name] = (st.deployment.epoch, st.deployment.incarnation,
                     {t.timeline: t.leader_epoch for t in st.timelines})
    return out


def events(kube: Kube) -> dict[str, str]:
    """The namespace's Events (the operator posts them for flips, rewinds and warnings, never
    for a quiet pass), by uid, with their count."""
    return {e["metadata"]["uid"]: f"{e['reason']} {e['involvedObject']['name']} x"
            f"{e.get('count', 1)}: {e.get('message', '')[:200]}" for e in kube.events(NS)}


STATE: dict[str, Any] = {}  # what the tests pass on: writers, status before, pods


def test_previous_release_image_built_by_its_own_tooling(previous_tree, node):
    """The previous release's operator image, built by the previous tree's own tooling, imported
    under a tag of its own; then this checkout's, under the chart's default name."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tsoracle_dev.images", "-o", "json"],
                          cwd=previous_tree, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "PYTHONPATH": str(previous_tree / "tools")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    [old] = [i for i in json.loads(proc.stdout) if i["image"] == "operator"]
    _timed(f"build the {PREVIOUS} image (its tooling)", started)
    assert old["archive"].startswith(str(images.cache_dir()))  # the same cache, its own key
    address = str(node.plane.info()["containerd_address"])
    started = time.monotonic()
    # Its name is the current image's too (same appVersion): tag it, then import the current.
    images.import_archive(Path(old["archive"]), address)
    ctr(node, "images", "tag", "--force", old["name"], OLD_IMAGE)
    images.import_archive(images.build_pause(), address)
    current = images.build_operator()
    images.import_archive(current, address)
    _timed("import both images (+ build the current one)", started)
    listed = ctr(node, "images", "ls").splitlines()
    digests = {line.split()[0]: line.split()[2] for line in listed[1:]}
    assert OLD_IMAGE in digests and NEW_IMAGE in digests, listed
    assert digests[OLD_IMAGE] == old["manifest"]
    assert digests[NEW_IMAGE] == images.archive_info(current)["manifest"] != old["manifest"]
    SEEN["images"] = {OLD_IMAGE: old["manifest"], NEW_IMAGE: digests[NEW_IMAGE]}


def test_install_the_previous_release_with_live_resources_and_writers(previous_tree, node):
    kube = node.kube
    started = time.monotonic()
    run(node, "helm", "install", RELEASE, str(previous_tree / "charts" / "tsoracle"), "-n",
        SYSTEM, "--create-namespace", "--set", f"image.tag={PREVIOUS}", "--wait",
        "--timeout", "5m")
    _timed(f"helm install {PREVIOUS}", started)
    assert wait_for("the old operator Ready", lambda: operator_pod(kube, OLD_IMAGE), 120)
    assert "highWater" not in crd_status_fields(kube)  # the old CRD
    kube.kubectl("create", "namespace", NS)
    kube.backend_secret(NS, "oracle-db", node.pg_url)
    for name, (_, timeline) in RESOURCES.items():
        kube.kubectl("-n", NS, "apply", "-f", "-", stdin=json.dumps({
            "apiVersion": "tsoracle.io/v1alpha1", "kind": "TimestampOracle",
            "metadata": {"name": name},
            "spec": {"backend": {"urlSecretRef": {"name": "oracle-db", "key": "url"},
                                 "schema": f"tsoracle_{name}"},
                     "implementation": "distributed", "fencing": "Always",
                     "timelines": ["EpochMilliseconds", timeline],
                     "statusRefreshSeconds": 2, "deletionPolicy": "Retain"}}))
    for name, (implementation, _) in RESOURCES.items():
        kube.wait_tso(NS, name, is_ready, timeout=120, what=f"{name} Ready")
        if implementation != "distributed":
            # Flipped by the old release: its status carries what a flip adds (the bootstrap
            # timestamps, lastFlipTime), for the upgrade to keep.
            kube.kubectl("-n", NS, "patch", "tso", name, "--type", "merge", "-p",
                         json.dumps({"spec": {"implementation": implementation}}))
        obj = kube.wait_tso(NS, name, lambda o, i=implementation: is_ready(o) and o["status"][
            "activeImplementation"] == i, timeout=120, what=f"{name} Ready on {implementation}")
        assert obj["status"]["epoch"] == (1 if implementation == "distributed" else 2)
    writers = {name: Writers(schema_url(node, name), timeline).start()
               for name, (_, timeline) in RESOURCES.items()}
    STATE["writers"] = writers
    for name, w in writers.items():
        wait_for(f"the {name} writers writing", lambda w=w: w.writes() >= 200 or w.errors, 60)
        assert not w.errors, w.errors[:5]


def _steady(kube: Kube, image: str, passes: int) -> dict[str, Any]:
    """The operator pod running `image`, once it has made `passes` times as many successful
    passes as there are resources since it started."""
    pod = wait_for(f"the operator on {image} Ready", lambda: operator_pod(kube, image), 180)
    wait_for(f"{passes} passes per resource", lambda: reconciles(pod) >= passes * len(RESOURCES),
             120)
    return pod


def _check_nothing_moved(node: SimpleNamespace, step: str, began: float) -> dict[str, Any]:
    """The status, epochs, events and writers against what they were before the upgrade."""
    kube = node.kube
    before = STATE["before"]
    objs = {name: kube.tso(NS, name) for name in RESOURCES}
    for name, obj in objs.items():
        assert is_ready(obj), (step, name, obj["status"])
        assert condition(obj, "Degraded").get("status") != "True", (step, name, obj["status"])
        kept = {k: obj["status"].get(k) for k in STABLE_STATUS}
        assert kept == before["status"][name], (step, name, kept, before["status"][name])
        assert obj["metadata"]["uid"] == before["uid"][name]  # the same object, kept
    assert database_epochs(node) == before["database"], step
    assert events(kube) == before["events"], step  # none new, none repeated
    for name, w in STATE["writers"].items():
        assert not w.errors, (step, name, w.errors[:5])
        assert w.reopens == 0, (step, name, w.reopens)  # nothing fenced them
    SEEN[f"{step}: longest writer wait (s)"] = {
        name: round(w.longest_wait(began, time.monotonic()), 3)
        for name, w in STATE["writers"].items()}
    return objs


def test_helm_upgrade_to_this_release_changes_no_epoch(node):
    kube = node.kube
    old_pod = _steady(kube, OLD_IMAGE, 2)
    objs = {name: kube.tso(NS, name) for name in RESOURCES}
    STATE["before"] = {
        "status": {n: {k: o["status"].get(k) for k in STABLE_STATUS} for n, o in objs.items()},
        "uid": {n: o["metadata"]["uid"] for n, o in objs.items()},
        "database": database_epochs(node), "events": events(kube)}
    writes = {name: w.writes() for name, w in STATE["writers"].items()}
    began = time.monotonic()
    # The user's command: this chart with its defaults (the image tag set for the old release
    # goes with --reset-values).
    run(node, "helm", "upgrade", RELEASE, "charts/tsoracle", "-n", SYSTEM, "--reset-values",
        "--wait", "--timeout", "5m")
    new_pod = _steady(kube, NEW_IMAGE, 3)
    _timed("helm upgrade -> new pod Ready, 3 passes each", began)
    assert new_pod["metadata"]["name"] != old_pod["metadata"]["name"]
    assert "highWater" in crd_status_fields(kube)  # the chart upgraded the CRD
    # This release's new status field appears beside the old ones.
    for name in RESOURCES:
        obj = kube.wait_tso(NS, name, lambda o: (o["status"].get("highWater") or {}).get(
            "timelines"), timeout=60, what=f"{name} status.highWater")
        assert set(obj["status"]["highWater"]["timelines"]) == {
            "EpochMilliseconds", RESOURCES[name][1]}
    _check_nothing_moved(node, "upgrade", began)
    for name, w in STATE["writers"].items():
        assert w.writes() > writes[name]  # alive throughout


def test_helm_rollback_to_the_previous_release_changes_no_epoch(node):
    kube = node.kube
    writes = {name: w.writes() for name, w in STATE["writers"].items()}
    began = time.monotonic()
    run(node, "helm", "rollback", RELEASE, "1", "-n", SYSTEM, "--wait", "--timeout", "5m")
    _steady(kube, OLD_IMAGE, 3)
    _timed("helm rollback -> old pod Ready, 3 passes each", began)
    assert "highWater" not in crd_status_fields(kube)  # the old CRD again
    objs = _check_nothing_moved(node, "rollback", began)
    # The old schema does not know the field: the API server prunes it from what it serves
    # (a later upgrade starts the mark again from the positions its first pass sees).
    for name, obj in objs.items():
        assert "highWater" not in obj["status"], name
    assert {"bootstrapTimestamp", "lastFlipTime"} <= set(objs["ledger"]["status"])
    for name, w in STATE["writers"].items():
        assert w.writes() > writes[name]


def test_no_timestamp_was_handed_out_twice(node):
    writers: dict[str, Writers] = STATE.pop("writers")
    for w in writers.values():
        w.stop()
    for name, w in writers.items():
        assert not w.errors and w.reopens == 0, (name, w.errors[:5], w.reopens)
        for task in w.done:
            stamps = [ts for _, ts in task]
            assert stamps == sorted(set(stamps)), name  # each task's strictly increasing
        every = w.timestamps()
        assert len(every) == len(set(every)), f"{name}: a timestamp handed out twice"
    SEEN["writes"] = {name: w.writes() for name, w in writers.items()}

"""Apache Iceberg's REST Compatibility Kit (RCK), run against any Iceberg REST catalog.

    tsoracle-rck fetch                            # fetch (and cache) the jars, print their folder
    tsoracle-rck run --uri URL --warehouse W      # the kit against a catalog: counts, failures
    tsoracle-rck reference                        # the kit against Iceberg's reference server

(`python -m tsoracle_dev.rck` is the same command.)

`fetch` also caches Iceberg's REST catalog OpenAPI document of the same version
(`rest-catalog-open-api.yaml`, which tests/test_catalog_fuzz.py fuzzes the catalog with) when it
is given a copy (`--spec`, or TSORACLE_ICEBERG_SPEC): Iceberg publishes that file in no Maven
artifact, so it cannot be fetched like the jars; `fetch_spec` checks the copy against the git
blob id of the file at the tag apache-iceberg-<version> before caching it.

The kit is Iceberg's own catalog test suite (`CatalogTests`, `ViewCatalogTests`) driven through
its REST client: `iceberg-open-api` `tests` and `test-fixtures` jars and `iceberg-core` `tests`,
run by JUnit's console launcher. `pom.xml` beside this file lists them; Maven copies them once
into ${TSORACLE_CACHE:-~/.cache/tsoracle}/rck-<iceberg version>-<digest of pom.xml>/. Needs
`java` (17) and `mvn`.

Counts come from JUnit's Open Test Reporting XML, which tells an aborted test (an assumption
the catalog does not meet: an optional feature) from a skipped one and from a failed one.

What the 1.11 kit expects of a catalog (read from its sources, checked against the reference
server; 157 tests, 1.10's 148 and register-view, a missing metadata file, and more):
- `GET /v1/config`: the client uses exactly the `endpoints` listed (strings such as
  "GET /v1/{prefix}/namespaces", templates as written in the spec, whatever the prefix); an
  operation not listed raises UnsupportedOperationException, which fails its test. Without
  `endpoints` it assumes the 1.7 set: no HEAD (it loads instead) and no views unless the
  property `view-endpoints-supported` is "true".
- Nothing makes the view tests abort: a catalog without views fails every one that needs them.
- Switches, read from the client's properties (the config response's `defaults` and
  `overrides` count, and so do CATALOG_RCK_* variables: CATALOG_RCK_REQUIRES__NAMESPACE__CREATE
  is `rck.requires-namespace-create`): `rck.requires-namespace-create` (table tests default
  false: tables are created in namespaces never created), `rck.supports-names-with-dot`
  (false), `rck.supports-serverside-retry` (true), `rck.overrides-requested-location` (false).
- Before each class, no namespace `ns` or `newdb` may exist: a fresh catalog per run.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tsoracle_dev import jvm
from tsoracle_dev.localpg import free_port

POM = Path(__file__).resolve().with_name("pom.xml")
CACHE = Path(os.environ.get("TSORACLE_CACHE", Path.home() / ".cache" / "tsoracle"))
_POM_NS = "{http://maven.apache.org/POM/4.0.0}"


def _pom_property(name: str) -> str:
    value = ET.parse(POM).getroot().findtext(f"{_POM_NS}properties/{_POM_NS}{name}")
    if not value:
        raise RuntimeError(f"{POM} has no <{name}> property")
    return value.strip()


# pom.xml holds the versions (every jar must match Iceberg's); this is the one Python reads.
ICEBERG_VERSION = _pom_property("iceberg.version")

CATALOG_TESTS = "org.apache.iceberg.rest.RESTCompatibilityKitCatalogTests"
VIEW_TESTS = "org.apache.iceberg.rest.RESTCompatibilityKitViewCatalogTests"
KIT_CLASSES = (CATALOG_TESTS, VIEW_TESTS)
SERVER_CLASS = "org.apache.iceberg.rest.RESTCatalogServer"
LAUNCHER_CLASS = "org.junit.platform.console.ConsoleLauncher"

FETCH_TIMEOUT = 900.0
KIT_TIMEOUT = 600.0
SERVER_START_TIMEOUT = 60.0


# Apache Iceberg's REST catalog OpenAPI document, by the git blob id of open-api/<SPEC_NAME> at
# the tag apache-iceberg-<version> (`git rev-parse apache-iceberg-1.10.0:open-api/<SPEC_NAME>`;
# 1.10.1 has the same file). Iceberg's Maven artifacts do not carry it (iceberg-open-api's jars
# hold the kit and the reference server; it has no sources jar), so a copy is taken from an
# Iceberg checkout or source release the caller names, and only the pinned bytes are accepted.
SPEC_NAME = "rest-catalog-open-api.yaml"
SPEC_BLOBS = {"1.10.0": "e0b524a6d726afeef51c95bbbed07b1140123859"}
# The document's version is pinned apart from the kit's: the kit moves with Maven's jars, the
# document only with a copy of its bytes whose blob id is pinned above.
SPEC_VERSION = "1.10.0"
SPEC_ENV = "TSORACLE_ICEBERG_SPEC"


class RckError(RuntimeError):
    """The kit could not run (a missing tool, a failed fetch, no report): not a test result."""


def _require(tool: str) -> str:
    path = shutil.which(tool)
    if path:
        return path
    if tool == "java":
        raise RckError("`java` is not on PATH: install a Java 17 runtime "
                       "(Debian: apt-get install openjdk-17-jre-headless)")
    raise RckError("`mvn` is not on PATH: install Maven, which fetches the kit's jars "
                   "(Debian: apt-get install maven)")


def _die_with_parent() -> None:
    """In the child before exec: a killed run (a test, a fetch) leaves no JVM behind."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def cache_dir() -> Path:
    """Where the jars of this pom.xml live: a new pom (or Iceberg version) is a new folder."""
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()[:10]
    return CACHE / f"rck-{ICEBERG_VERSION}-{digest}"


def fetch_jars(timeout: float = FETCH_TIMEOUT) -> Path:
    """The folder of the kit's jars, copied from Maven on first use.

    Maven writes into a temporary folder renamed into place at the end, so an interrupted
    fetch never leaves a folder that looks complete.
    """
    out = cache_dir()
    jars = out / "jars"
    if jars.is_dir():
        return jars
    mvn = _require("mvn")
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")  # concurrent fetches must not collide
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    # The pom is copied beside the jars: Maven runs from a writable folder, and the cache
    # records what it was made from.
    shutil.copyfile(POM, tmp / "pom.xml")
    print(f"fetching Iceberg {ICEBERG_VERSION}'s REST Compatibility Kit from Maven "
          "(once; about 10 s)...", file=sys.stderr)
    cmd = [mvn, "-q", "-B", "-f", str(tmp / "pom.xml"), "dependency:copy-dependencies",
           f"-DoutputDirectory={tmp / 'jars'}"]
    try:
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=timeout,
                              preexec_fn=_die_with_parent)
    except subprocess.TimeoutExpired:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RckError(f"mvn did not fetch the kit's jars within {timeout:.0f} s") from None
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RckError(f"mvn could not fetch the kit's jars (exit {proc.returncode}):\n{tail}")
    try:
        os.rename(tmp, out)  # atomic; fails if a concurrent fetch got there first
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not jars.is_dir():
            raise
    # Folders of earlier poms of this version, and of fetches that were killed, are dead weight.
    for stale in CACHE.glob(f"rck-{ICEBERG_VERSION}-*"):
        if stale != out and not (stale.name.endswith(".tmp") and _fetching(stale)):
            shutil.rmtree(stale, ignore_errors=True)
    return jars


def git_blob_id(data: bytes) -> str:
    """The id git gives a file of these bytes (`git hash-object`)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def spec_path() -> Path:
    """Where Iceberg's REST catalog OpenAPI document of SPEC_VERSION is cached."""
    return CACHE / f"iceberg-rest-spec-{SPEC_VERSION}" / SPEC_NAME


def fetch_spec(source: str | Path | None = None) -> Path:
    """Iceberg's REST catalog OpenAPI document of SPEC_VERSION, copied into the cache from
    `source` when given, else from the cache, else from $TSORACLE_ICEBERG_SPEC. A source is the
    file itself, or an Iceberg checkout or source release holding open-api/<SPEC_NAME>; one
    whose bytes are not the pinned ones (another version, an edited file) is refused."""
    expected = SPEC_BLOBS.get(SPEC_VERSION)
    if expected is None:
        raise RckError(f"no {SPEC_NAME} is pinned for Iceberg {SPEC_VERSION}: add the git blob "
                       f"id of open-api/{SPEC_NAME} at its tag to SPEC_BLOBS")
    out = spec_path()
    if not source and out.is_file() and git_blob_id(out.read_bytes()) == expected:
        return out
    source = source or os.environ.get(SPEC_ENV)
    if not source:
        raise RckError(f"Iceberg {SPEC_VERSION}'s {SPEC_NAME} is not cached and no Maven "
                       f"artifact carries it: name a copy with {SPEC_ENV}=PATH (the file, or an "
                       f"Iceberg checkout at apache-iceberg-{SPEC_VERSION} or its source "
                       "release) or `tsoracle-rck fetch --spec PATH`")
    path = Path(source)
    if path.is_dir():
        path = path / "open-api" / SPEC_NAME
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RckError(f"cannot read {path}: {exc.strerror}") from None
    if git_blob_id(data) != expected:
        raise RckError(f"{path} is not Iceberg {SPEC_VERSION}'s {SPEC_NAME} (git blob "
                       f"{git_blob_id(data)}, expected {expected})")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, out)
    return out


def _fetching(tmp: Path) -> bool:
    """Whether the process named in a `<name>.<pid>.tmp` folder still runs."""
    try:
        os.kill(int(tmp.name.rsplit(".", 2)[-2]), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        pass  # another user's live process
    return True


def _java_env(catalog: Mapping[str, str]) -> dict[str, str]:
    """This process's environment without its CATALOG_* variables (the kit and the server
    turn every one into a catalog property), plus `catalog`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CATALOG_")}
    env.update(catalog)
    return env


# --- The report -------------------------------------------------------------------------------


@dataclass(frozen=True)
class KitResult:
    """One run of the kit. A container (a test class, a parameterized method) that failed or
    aborted as a whole counts once, with its name: its tests never reported."""

    succeeded: int
    failed: int
    aborted: int
    skipped: int
    failures: list[tuple[str, str]] = field(default_factory=list)  # (test, message)
    aborts: list[tuple[str, str]] = field(default_factory=list)  # (test, the unmet assumption)
    seconds: float = 0.0

    def summary(self) -> str:
        return (f"{self.succeeded} succeeded, {self.failed} failed, {self.aborted} aborted, "
                f"{self.skipped} skipped in {self.seconds:.1f} s")


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _child(element: ET.Element, name: str) -> ET.Element | None:
    for child in element.iter():
        if child is not element and _local(child.tag) == name:
            return child
    return None


def _message(result: ET.Element) -> str:
    """The throwable's message and its causes' without the stack traces (or the skip reason):
    a REST client error says what went wrong only in its cause."""
    for name in ("throwable", "reason"):
        node = _child(result, name)
        if node is not None and node.text:
            lines, in_trace = [], False
            for line in node.text.strip().splitlines():
                if line.startswith("Caused by: "):
                    in_trace = False
                elif line.startswith(("\tat ", "\t... ", "\tSuppressed: ")):
                    in_trace = True
                if not in_trace:
                    lines.append(line.rstrip())
            text = "\n".join(lines).strip()
            return text if len(text) <= 2000 else text[:2000] + " ..."
    return ""


def parse_report(path: Path, seconds: float = 0.0) -> KitResult:
    """Count the outcomes in JUnit's open-test-report.xml (events: started, finished)."""
    nodes: dict[str, tuple[str, str | None, str]] = {}  # id -> (name, parent id, TEST/CONTAINER)
    counts = {"SUCCESSFUL": 0, "FAILED": 0, "ABORTED": 0, "SKIPPED": 0}
    failures: list[tuple[str, str]] = []
    aborts: list[tuple[str, str]] = []

    def name_of(node_id: str) -> str:
        parts = []
        current: str | None = node_id
        while current is not None and current in nodes:
            name, parent, _ = nodes[current]
            if parent is None:  # the engine ("JUnit Jupiter") is not part of a test's name
                break
            parts.append(name)
            current = parent
        parts.reverse()
        return ".".join(parts[:2]) + "".join(f" {p}" for p in parts[2:]) if parts else node_id

    for _, element in ET.iterparse(path):
        kind = _local(element.tag)
        if kind == "started":
            type_node = _child(element, "type")
            node_type = (type_node.text or "").strip() if type_node is not None else "TEST"
            nodes[element.get("id", "")] = (element.get("name", ""), element.get("parentId"),
                                            node_type)
        elif kind == "finished":
            result = _child(element, "result")
            if result is None:
                continue
            status = result.get("status", "")
            node_id = element.get("id", "")
            is_test = nodes.get(node_id, ("", None, "TEST"))[2] != "CONTAINER"
            if status == "SUCCESSFUL" and not is_test:
                continue  # a container that ran is not a test
            if status in counts:
                counts[status] += 1
            if status == "FAILED":
                failures.append((name_of(node_id), _message(result)))
            elif status == "ABORTED":
                aborts.append((name_of(node_id), _message(result)))
    return KitResult(succeeded=counts["SUCCESSFUL"], failed=counts["FAILED"],
                     aborted=counts["ABORTED"], skipped=counts["SKIPPED"], failures=failures,
                     aborts=aborts, seconds=seconds)


# --- Running the kit --------------------------------------------------------------------------


def run_kit(catalog_uri: str, warehouse: str, *, env: Mapping[str, str] | None = None,
            report_dir: Path | None = None, classes: Sequence[str] = KIT_CLASSES,
            timeout: float = KIT_TIMEOUT) -> KitResult:
    """Run the kit against the REST catalog at `catalog_uri`.

    `env`: more CATALOG_* variables, each a catalog property of the kit's client (CATALOG_TOKEN
    is `token`; `_` becomes `.`, `__` becomes `-`). `report_dir` keeps JUnit's XML reports and
    the launcher's output (kit-output.log); without it they go to a temporary folder.
    """
    extra = dict(env or {})
    for name in extra:
        if not name.startswith("CATALOG_") or name in ("CATALOG_URI", "CATALOG_WAREHOUSE"):
            raise ValueError(f"env: {name} is not an extra CATALOG_* variable (the URI and the "
                             "warehouse are arguments)")
    java = _require("java")
    jars = fetch_jars()
    with contextlib.ExitStack() as stack:
        if report_dir is None:
            reports = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rck-")))
        else:
            reports = Path(report_dir)
            reports.mkdir(parents=True, exist_ok=True)
        report = reports / "open-test-report.xml"
        report.unlink(missing_ok=True)  # never count an earlier run's report
        cmd = [java, *jvm.SHORT_LIVED, "-Drck.local=false",
               # The client logs every request at INFO; warnings and errors are what matter.
               "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
               "-cp", f"{jars}/*", LAUNCHER_CLASS, "execute",
               "--disable-banner", "--details=summary", "--details-theme=ascii",
               "--include-engine=junit-jupiter",
               *[arg for cls in classes for arg in ("--select-class", cls)],
               f"--reports-dir={reports}",
               "--config=junit.platform.reporting.open.xml.enabled=true"]
        child_env = _java_env({**extra, "CATALOG_URI": catalog_uri,
                               "CATALOG_WAREHOUSE": warehouse})
        log = reports / "kit-output.log"
        started = time.monotonic()
        with log.open("w") as out:
            try:
                # Exit status 1 only says some test failed: the report says which.
                subprocess.run(cmd, env=child_env, stdout=out, stderr=subprocess.STDOUT,
                               timeout=timeout, preexec_fn=_die_with_parent)
            except subprocess.TimeoutExpired:
                raise RckError(f"the kit did not finish within {timeout:.0f} s "
                               f"(its output: {log if report_dir else 'not kept'})") from None
        seconds = time.monotonic() - started
        if not report.exists():
            tail = "\n".join(log.read_text(errors="replace").strip().splitlines()[-15:])
            raise RckError(f"the kit wrote no report; the end of its output:\n{tail}")
        return parse_report(report, seconds)


# --- Iceberg's reference server ---------------------------------------------------------------


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v1/config", timeout=2) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def reference_server(warehouse_dir: Path, *, log_path: Path | None = None,
                     timeout: float = SERVER_START_TIMEOUT,
                     jdbc_uri: str | None = None,
                     extra_env: dict[str, str] | None = None,
                     jvm_options: Sequence[str] = ()) -> Iterator[str]:
    """Iceberg's reference REST catalog (`RESTCatalogServer`: a JDBC catalog on in-memory SQLite,
    HadoopFileIO) on a free port, with tables under `warehouse_dir`; yields its URL.
    `jdbc_uri` puts its JDBC catalog elsewhere (e.g. `jdbc:sqlite:file:/path/catalog.db`: the
    in-memory database fails requests now and then under concurrent writers); `extra_env`,
    more of its CATALOG_* settings (CATALOG_JDBC_USER, CATALOG_JDBC_PASSWORD); `jvm_options`,
    options for its JVM (a test's short-lived server: tsoracle_dev.jvm.SHORT_LIVED; never for a
    benchmark's).

    Iceberg (1.10, 1.11) reads its settings from CATALOG_* variables only (CATALOG_REST_PORT is
    `rest.port`; a -Drest.port system property is ignored). Jetty listens on every interface.
    """
    java = _require("java")
    jars = fetch_jars()
    warehouse = Path(warehouse_dir).resolve()
    warehouse.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if log_path is None:
            log_path = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rck-"))) / "log"
        for _attempt in range(3):  # the free port may be taken before the JVM binds it
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            env = _java_env({"CATALOG_REST_PORT": str(port),
                             "CATALOG_WAREHOUSE": warehouse.as_uri(),
                             **({"CATALOG_URI": jdbc_uri} if jdbc_uri else {}),
                             **(extra_env or {})})
            with open(log_path, "w") as out:
                proc = subprocess.Popen([java, *jvm_options, "-cp", f"{jars}/*", SERVER_CLASS],
                                        env=env, stdout=out, stderr=subprocess.STDOUT,
                                        preexec_fn=_die_with_parent)
            try:
                deadline = time.monotonic() + timeout
                while proc.poll() is None and not _answers(url):
                    if time.monotonic() > deadline:
                        raise RckError(f"Iceberg's reference server did not answer within "
                                       f"{timeout:.0f} s")
                    time.sleep(0.2)
                if proc.poll() is None:
                    yield url
                    return
            finally:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            text = log_path.read_text(errors="replace")
            if "BindException" not in text:
                break
        tail = "\n".join(text.strip().splitlines()[-15:])
        raise RckError(f"Iceberg's reference server exited (status {proc.returncode}):\n{tail}")

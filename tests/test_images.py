"""tsoracle_dev.images: the Dockerfile follows the image recipe, and the archives built without
Docker import into containerd under the chart's names and run as the chart runs them."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

import pytest

from tests.test_dev_cluster import path_without
from tsoracle.spark.session import RUNTIME_PACKAGE
from tsoracle_dev import images
from tsoracle_dev.controlplane.cluster import K8S_VERSION

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
BUILD = [sys.executable, "-m", "tsoracle_dev.images"]


# --- the Dockerfile and the recipe ----------------------------------------------------------


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, args = pending.strip().partition(" ")
        out.append((keyword.upper(), args.strip()))
        pending = ""
    return out


def dockerfile_recipe(text: str) -> dict[str, object]:
    """The recipe fields a Dockerfile states (None where it states none)."""
    found: dict[str, object] = dict.fromkeys(
        ["suite", "packages", "venv", "pip_python", "extras", "group", "user", "uid", "gid",
         "image_user", "path", "entrypoint", "cmd"])
    for keyword, args in _instructions(text):
        if keyword == "FROM":
            image = args.split()[0]
            match = re.fullmatch(r"debian:([a-z]+)(-slim)?", image)
            found["suite"] = match.group(1) if match else image
        elif keyword == "RUN":
            for command in (shlex.split(c) for c in args.split("&&")):
                words = [w for w in command if not w.startswith("-")]
                if command[:2] == ["apt-get", "install"]:
                    found["packages"] = sorted(words[2:])
                elif command[1:3] == ["-m", "venv"]:
                    found["venv"] = words[-1]
                elif "install" in command and any(w.endswith("/pip") for w in command):
                    found["pip_python"] = str(Path(command[0]).parent.parent)
                    extras = re.search(r"\[([^]]*)\]$", words[-1])
                    found["extras"] = sorted(extras.group(1).split(",")) if extras else []
                elif command and command[0] == "groupadd":
                    opts = dict(zip(command[1::2], command[2::2], strict=False))
                    found["group"] = [command[-1], int(opts.get("--gid", -1))]
                elif command and command[0] == "useradd":
                    opts = dict(zip(command[1::2], command[2::2], strict=False))
                    found["user"] = command[-1]
                    found["uid"] = int(opts.get("--uid", -1))
                    found["gid"] = int(opts.get("--gid", -1))
        elif keyword == "USER":
            found["image_user"] = args
        elif keyword == "ENV" and args.startswith("PATH="):
            found["path"] = args.removeprefix("PATH=")
        elif keyword in ("ENTRYPOINT", "CMD"):
            found[keyword.lower()] = json.loads(args)
    return found


def recipe_fields(spec: images.ImageSpec) -> dict[str, object]:
    """The same fields, as the recipe (images.toml) has them."""
    return {"suite": spec.suite, "packages": sorted(spec.packages), "venv": spec.venv,
            "pip_python": spec.venv, "extras": sorted(spec.extras),
            "group": [spec.user, spec.gid], "user": spec.user,
            "uid": spec.uid, "gid": spec.gid, "image_user": f"{spec.uid}:{spec.gid}",
            "path": spec.path_env, "entrypoint": list(spec.entrypoint), "cmd": list(spec.cmd)}


def mismatches(text: str, spec: images.ImageSpec) -> dict[str, tuple[object, object]]:
    stated, want = dockerfile_recipe(text), recipe_fields(spec)
    return {k: (stated[k], want[k]) for k in want if stated[k] != want[k]}


def test_dockerfile_follows_the_image_recipe():
    assert mismatches(DOCKERFILE.read_text(), images.OPERATOR) == {}, \
        "Dockerfile vs tsoracle_dev/images/images.toml [operator] (Dockerfile value, recipe value)"


# Each edit of the Dockerfile must be caught, by the field it changes.
DOCKERFILE_EDITS = {
    "suite": ("debian:bookworm-slim", "debian:trixie-slim"),
    "packages": ("python3 python3-venv", "python3 python3-venv curl"),
    "extras": ('"/src[operator,iceberg]"', '"/src[operator,iceberg,spark]"'),
    "venv": ("venv --without-pip /opt/tsoracle", "venv --without-pip /opt/app"),
    "pip_python": ("&& /opt/tsoracle/bin/python", "&& /usr/bin/python3"),
    "user": ("--shell /usr/sbin/nologin tsoracle", "--shell /usr/sbin/nologin app"),
    "uid": ("--uid 65532", "--uid 1000"),
    "group": ("groupadd --gid 65532", "groupadd --gid 1000"),
    "gid": ("--uid 65532 --gid 65532", "--uid 65532 --gid 1000"),
    "image_user": ("USER 65532:65532", "USER 0"),
    "path": ("ENV PATH=/opt/tsoracle/bin:", "ENV PATH="),
    "entrypoint": ('ENTRYPOINT ["tsoracle"]', 'ENTRYPOINT ["python", "-m", "tsoracle"]'),
    "cmd": ('CMD ["operator"]', 'CMD ["serve"]'),
}


@pytest.mark.parametrize("field", sorted(DOCKERFILE_EDITS))
def test_a_dockerfile_edit_is_caught(field):
    old, new = DOCKERFILE_EDITS[field]
    text = DOCKERFILE.read_text()
    assert old in text, f"the Dockerfile no longer has {old!r}: update DOCKERFILE_EDITS"
    assert field in mismatches(text.replace(old, new), images.OPERATOR)


RECIPE_EDITS = {"suite": "trixie", "packages": ("python3",), "extras": ("operator", "spark"),
                "venv": "/opt/app", "user": "app", "uid": 1000, "gid": 1000,
                "entrypoint": ("python3",), "cmd": ("serve",)}


@pytest.mark.parametrize("field", sorted(RECIPE_EDITS))
def test_a_recipe_edit_is_caught(field):
    spec = dataclasses.replace(images.OPERATOR, **{field: RECIPE_EDITS[field]})
    assert field in mismatches(DOCKERFILE.read_text(), spec)


def test_the_operator_reference_is_the_charts_default():
    chart = (ROOT / "charts" / "tsoracle" / "Chart.yaml").read_text()
    values = (ROOT / "charts" / "tsoracle" / "values.yaml").read_text()
    app_version = re.search(r'^appVersion:\s*"?([^"\s]+)', chart, re.MULTILINE).group(1)
    repository = re.search(r"^image:\n(?:\s+.*\n)*?\s+repository:\s*(\S+)", values,
                           re.MULTILINE).group(1)
    assert images.OPERATOR_IMAGE == f"{repository}:{app_version}"
    assert images.OPERATOR_IMAGE_NORMALISED == f"docker.io/library/{repository}:{app_version}"
    assert images.PAUSE_IMAGE == "tsoracle.dev/pause:3.10"


@pytest.mark.parametrize("reference, name", [
    ("tsoracle:0.1.0", "docker.io/library/tsoracle:0.1.0"),
    ("tsoracle", "docker.io/library/tsoracle:latest"),
    ("me/tsoracle:1", "docker.io/me/tsoracle:1"),
    ("tsoracle.dev/pause:3.10", "tsoracle.dev/pause:3.10"),
    ("localhost:5000/tsoracle", "localhost:5000/tsoracle:latest"),
    ("quay.io/a/b@sha256:00", "quay.io/a/b@sha256:00"),
])
def test_normalise_names_as_containerd_does(reference, name):
    assert images.normalise(reference) == name


def test_import_without_a_dev_cluster_says_what_to_do(tmp_path):
    env = {**os.environ, "TSORACLE_DEV_CLUSTER_STATE": str(tmp_path / "none")}
    proc = subprocess.run([*BUILD, "--import"], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "make dev-cluster" in proc.stderr


def test_the_pause_source_is_found_without_go_where_go_left_it(tmp_path, monkeypatch):
    """A newcomer with the cluster built before, and no Go on PATH, was stopped by `make
    dev-cluster` (issue 28): the source is looked up in Go's default module cache first."""
    source = (tmp_path / "mod" / f"k8s.io/kubernetes@{images.k8s_version()}"
              / "build/pause/linux/pause.c")
    source.parent.mkdir(parents=True)
    source.write_text("int main(void) { return 0; }\n")
    monkeypatch.setenv("GOMODCACHE", str(tmp_path / "mod"))
    monkeypatch.setenv("PATH", path_without(tmp_path, "go"))
    assert images.pause_source() == source


def test_a_missing_go_is_one_line_naming_its_package(tmp_path):
    """The pause image is compiled from kubernetes' source in Go's module cache: without go,
    one line and exit code 1, not a FileNotFoundError traceback."""
    env = {**os.environ, "PATH": path_without(tmp_path, "go"),
           "TSORACLE_CACHE": str(tmp_path / "cache"),
           "GOMODCACHE": str(tmp_path / "gomodcache")}  # nothing of Go's found either
    proc = subprocess.run(BUILD, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "go not found on PATH" in proc.stderr
    assert "apt-get install golang-go" in proc.stderr


def fake_go(tmp_path: Path, answer: str, code: int = 0) -> dict[str, str]:
    """An environment whose `go` answers `go mod download -json` with `answer` (a stand-in
    for Go fetching the kubernetes module: the real one would download it) and records its
    arguments; Go's module cache is empty."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "answer").write_text(answer)
    (bin_dir / "go").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'argv'}\n"
                                f"cat {tmp_path / 'answer'}\nexit {code}\n")
    (bin_dir / "go").chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "GOMODCACHE": str(tmp_path / "empty-gomodcache")}


def test_the_pause_source_is_fetched_when_no_cluster_build_fetched_it(tmp_path, monkeypatch):
    """.ci/run builds the images beside the cluster's Go builds: the images fetch the module
    themselves rather than wait for a build to have."""
    module = tmp_path / "fetched"
    (module / "build/pause/linux").mkdir(parents=True)
    (module / "build/pause/linux/pause.c").write_text("int main(void) { return 0; }\n")
    for key, value in fake_go(tmp_path, json.dumps({"Dir": str(module)})).items():
        monkeypatch.setenv(key, value)
    assert images.pause_source() == module / "build/pause/linux/pause.c"
    argv = (tmp_path / "argv").read_text().split()
    assert argv == ["mod", "download", "-json", f"k8s.io/kubernetes@{images.k8s_version()}"]


@pytest.mark.parametrize(("answer", "code", "why"), [
    (json.dumps({"Error": "proxy unreachable\n\tand a second line"}), 1, "proxy unreachable"),
    ("not JSON at all", 0, "no error given"),
    (json.dumps({"Dir": "/nonexistent/k8s"}), 0, "no error given")])
def test_a_failed_pause_source_fetch_is_one_line_saying_what_to_do(tmp_path, answer, code, why):
    env = {**os.environ, "TSORACLE_CACHE": str(tmp_path / "cache"),
           **fake_go(tmp_path, answer, code=code)}
    proc = subprocess.run(BUILD, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert why in proc.stderr and "go mod download k8s.io/kubernetes@" in proc.stderr


ONE_LINE = """# deb http://commented.invalid/debian bookworm main
deb [arch=amd64] http://one-line.invalid/debian bookworm main
deb http://other-suite.invalid/debian trixie main
"""
DEB822 = """Types: deb-src
URIs: http://sources-only.invalid/debian
Suites: bookworm

Enabled: no
Types: deb
URIs: http://disabled.invalid/debian
Suites: bookworm

Types: deb
# a comment inside a stanza
URIs: http://deb822.invalid/debian
Suites: bookworm bookworm-updates
Components: main
"""


@pytest.mark.parametrize("files, mirror", [
    ({"sources.list": ONE_LINE}, "http://one-line.invalid/debian"),
    ({"sources.list.d/debian.sources": DEB822}, "http://deb822.invalid/debian"),
    ({"sources.list.d/debian.sources.disabled": DEB822,
      "sources.list.d/x.list": ONE_LINE}, "http://one-line.invalid/debian"),
    ({"sources.list.d/x.list.disabled": ONE_LINE}, None),
])
def test_the_debian_mirror_comes_from_apt_sources(tmp_path, monkeypatch, files, mirror):
    monkeypatch.delenv("TSORACLE_DEBIAN_MIRROR", raising=False)
    (tmp_path / "sources.list.d").mkdir()
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    if mirror is None:
        with pytest.raises(RuntimeError, match="TSORACLE_DEBIAN_MIRROR"):
            images.debian_mirror("bookworm", tmp_path)
    else:
        assert images.debian_mirror("bookworm", tmp_path) == mirror


# --- the real thing: build, import into a private containerd, run ---------------------------

NEEDED = ["debootstrap", "chroot", "gcc", "go", "containerd", "ctr", "runc", "tar"]


@pytest.fixture(scope="module")
def archives() -> dict[str, Path]:
    """Both archives, from the user's cache (a cold build is a minute or two, once)."""
    if os.geteuid() != 0:
        pytest.skip("building images needs root (debootstrap, chroot)")
    missing = [tool for tool in NEEDED if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"missing {', '.join(missing)}")
    return {"pause": images.build_pause(), "operator": images.build_operator()}


CONTAINERD_CONFIG = """version = 2
root = "{dir}/root"
state = "{dir}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.snapshotter.v1.aufs", "io.containerd.internal.v1.tracing",
                    "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{dir}/containerd.sock"
[ttrpc]
  address = "{dir}/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{dir}/opt"
"""


@pytest.fixture(scope="module")
def containerd(archives, tmp_path_factory):
    """A containerd of the test's own (root, state, socket in a temp dir), stopped at the end."""
    home = tmp_path_factory.mktemp("containerd")
    (home / "config.toml").write_text(CONTAINERD_CONFIG.format(dir=home))
    address = str(home / "containerd.sock")
    log = open(home / "containerd.log", "w")
    proc = subprocess.Popen(["containerd", "--config", str(home / "config.toml")],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(["ctr", "--address", address, "version"],
                             capture_output=True).returncode != 0:
            assert proc.poll() is None, (home / "containerd.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "containerd did not start in 30 s"
            time.sleep(0.2)
        yield {"address": address, "home": home}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        images.remove_tree(home)  # unmounts any snapshot a failed run left mounted first


@pytest.fixture(scope="module")
def imported(archives, containerd) -> list[str]:
    for path in archives.values():
        images.import_archive(path, containerd["address"])
    return images.image_names(containerd["address"])


def test_archives_import_under_the_names_the_cluster_uses(imported):
    assert images.OPERATOR_IMAGE_NORMALISED in imported
    assert f"docker.io/library/{images.OPERATOR_IMAGE}" in imported
    assert images.PAUSE_IMAGE in imported


def _members(layer: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=gzip.GzipFile(fileobj=io.BytesIO(layer))) as tar:
        return tar.getmembers()


def test_archive_blobs_digests_and_layers(archives):
    with tarfile.open(archives["operator"]) as tar:
        blob = {m.name.removeprefix("blobs/sha256/"): tar.extractfile(m).read()
                for m in tar.getmembers() if m.isfile() and m.name.startswith("blobs/")}
        index = json.load(tar.extractfile("index.json"))
        assert json.load(tar.extractfile("oci-layout")) == {"imageLayoutVersion": "1.0.0"}
    for digest, data in blob.items():
        assert hashlib.sha256(data).hexdigest() == digest
    (entry,) = index["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == images.OPERATOR_IMAGE_NORMALISED
    manifest = json.loads(blob[entry["digest"][7:]])
    config = json.loads(blob[manifest["config"]["digest"][7:]])
    assert config["config"]["User"] == "65532:65532"
    assert config["config"]["Entrypoint"] == ["tsoracle"]
    assert config["config"]["Cmd"] == ["operator"]
    assert f"PATH={images.OPERATOR.path_env}" in config["config"]["Env"]
    layers = [blob[layer["digest"][7:]] for layer in manifest["layers"]]
    assert len(layers) == 2  # the Debian base, then the app
    assert config["rootfs"]["diff_ids"] == [
        f"sha256:{hashlib.sha256(gzip.decompress(layer)).hexdigest()}" for layer in layers]
    base, app = (_members(layer) for layer in layers)
    for member in base + app:
        assert not (member.ischr() or member.isblk() or member.isfifo()), member.name
        assert member.uname == "" and member.gname == "", member.name
        assert member.name not in ("", "/", "."), "a root entry would re-mode the container's /"
    names = {m.name for m in app}
    assert names >= {"etc/passwd", "etc/group", "opt/tsoracle/bin/tsoracle"}
    assert all(n in ("etc", "etc/passwd", "etc/group", "opt") or n.startswith("opt/tsoracle")
               for n in names), "the app layer holds the venv and the user entries only"
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    base_names = {m.name for m in base}
    assert "usr/bin/python3.11" in base_names
    assert not [n for n in base_names if n.startswith(("var/lib/apt/lists/", "usr/share/man/",
                                                       "var/cache/apt/"))]
    assert not [n for n in base_names if n.startswith("dev/")]
    docs = [n for n in base_names if n.startswith("usr/share/doc/") and n.count("/") > 3]
    assert docs and all(n.endswith("/copyright") for n in docs), "docs go, licences stay"


def written(paths) -> dict[Path, tuple[int, int]]:
    """Each file's inode and modification time: a build writes a new file and renames it
    into place, so a rebuilt archive has another inode."""
    return {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in paths}


def test_a_warm_build_rebuilds_nothing_and_reports_the_archives(archives):
    before = written(archives.values())
    proc = subprocess.run([*BUILD, "-o", "json"], capture_output=True,
                          text=True, timeout=300, check=True)
    report = {r["image"]: r for r in json.loads(proc.stdout)}
    assert Path(report["operator"]["archive"]) == archives["operator"]
    assert Path(report["pause"]["archive"]) == archives["pause"]
    assert report["operator"]["name"] == images.OPERATOR_IMAGE_NORMALISED
    assert report["operator"]["archive_bytes"] == archives["operator"].stat().st_size
    assert "spark" not in report, "the Spark image is built only with --spark"
    # Warm means taken from the cache, not built again (counted in files, not seconds).
    assert written(archives.values()) == before


def ctr_run(containerd, image: str, *argv: str, options: tuple[str, ...] = (),
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `argv` in `image` as the image says (its user), on a read-only root filesystem.
    Like `ctr run` (and unlike Kubernetes), `argv` replaces the image's entrypoint too."""
    home = containerd["home"]
    return subprocess.run(
        ["ctr", "--address", containerd["address"], "-n", "k8s.io", "run", "--rm", "--read-only",
         "--fifo-dir", str(home / "fifo"), "--runc-root", str(home / "runc"), *options, image,
         f"test-{uuid.uuid4().hex[:10]}", *argv],
        capture_output=True, text=True, timeout=timeout)


def test_the_operator_image_runs_as_the_chart_runs_it(containerd, imported):
    version = ctr_run(containerd, images.OPERATOR_IMAGE_NORMALISED, "tsoracle", "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"tsoracle {images.app_version()}"
    who = ctr_run(containerd, images.OPERATOR_IMAGE_NORMALISED, "python", "-c",
                  "import os, kopf, kubernetes, tsoracle.operator; "
                  "print(os.getuid(), os.getgid(), os.environ['PATH'])")
    assert who.returncode == 0, who.stderr
    assert who.stdout.split() == ["65532", "65532", images.OPERATOR.path_env]
    write = ctr_run(containerd, images.OPERATOR_IMAGE_NORMALISED, "python", "-c",
                    "open('/opt/tsoracle/x', 'w')")
    assert write.returncode != 0 and "Read-only file system" in write.stderr


def test_the_operator_image_has_only_the_operator_and_iceberg_extras(containerd, imported):
    # iceberg: spec.catalog's pods run `tsoracle catalog serve` from this image.
    catalog = ctr_run(containerd, images.OPERATOR_IMAGE_NORMALISED, "tsoracle", "catalog",
                      "serve", "--help")
    assert catalog.returncode == 0 and "--metrics-port" in catalog.stdout, catalog.stderr
    spark = ctr_run(containerd, images.OPERATOR_IMAGE_NORMALISED, "python", "-c",
                    "import pyspark")
    assert spark.returncode != 0 and "No module named 'pyspark'" in spark.stderr
    pip = ctr_run(containerd, images.OPERATOR_IMAGE_NORMALISED, "python", "-c", "import pip")
    assert pip.returncode != 0 and "No module named 'pip'" in pip.stderr


def test_the_pause_image_runs(containerd, imported):
    proc = ctr_run(containerd, images.PAUSE_IMAGE, "/pause", "-v")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"pause.c v{images.PAUSE_TAG}-{K8S_VERSION}"


# --- the Spark image -------------------------------------------------------------------------

ENTRYPOINT = ROOT / "tools" / "tsoracle_dev" / "images" / "spark-entrypoint.sh"
# Spark's Kubernetes scheduler sets these on executor pods (spark-kubernetes' Constants and
# BasicExecutorFeatureStep); the values are what an executor of a real application gets.
EXECUTOR_ENV = {
    "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@127.0.0.1:9", "SPARK_EXECUTOR_ID": "3",
    "SPARK_EXECUTOR_CORES": "2", "SPARK_APPLICATION_ID": "spark-0123abcd",
    "SPARK_EXECUTOR_POD_IP": "127.0.0.1", "SPARK_RESOURCE_PROFILE_ID": "0",
    "SPARK_EXECUTOR_POD_NAME": "app-exec-3", "SPARK_EXECUTOR_MEMORY": "512m",
}
# The executor pod's command line for EXECUTOR_ENV: KubernetesExecutorBackend's arguments.
BACKEND_ARGS = [
    "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend",
    "--driver-url", "spark://CoarseGrainedScheduler@127.0.0.1:9", "--executor-id", "3",
    "--cores", "2", "--app-id", "spark-0123abcd", "--hostname", "127.0.0.1",
    "--resourceProfileId", "0", "--podName", "app-exec-3",
]
# What a pod with readOnlyRootFilesystem and an emptyDir at /tmp has: Spark, Java and Python
# write there (HOME=/tmp in the image).
TMPFS = ("--mount", "type=tmpfs,src=tmpfs,dst=/tmp,options=nosuid:nodev:mode=1777")


def _fake_spark(tmp_path: Path) -> dict[str, str]:
    """An environment for the entrypoint on this host: a SPARK_HOME with a spark-submit and a
    JAVA_HOME with a java that print their arguments one per line."""
    for tool in ("spark/bin/spark-submit", "java/bin/java"):
        path = tmp_path / tool
        path.parent.mkdir(parents=True)
        path.write_text(f'#!/bin/sh\necho {path.name}\nfor a; do echo "$a"; done\n'
                        'echo "HOME=$HOME SPARK_SUBMIT_OPTS=$SPARK_SUBMIT_OPTS"\n')
        path.chmod(0o755)
    (tmp_path / "home").mkdir()
    return {"PATH": os.environ["PATH"], "SPARK_HOME": str(tmp_path / "spark"),
            "JAVA_HOME": str(tmp_path / "java"), "HOME": str(tmp_path / "home"),
            "PYSPARK_PYTHON": sys.executable}


def _entrypoint(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ENTRYPOINT), *args], env=env, capture_output=True,
                          text=True, timeout=30)


def test_the_spark_reference_is_tsoracle_spark_at_the_app_version():
    assert images.SPARK_IMAGE == f"tsoracle-spark:{images.app_version()}"
    assert images.SPARK_IMAGE_NORMALISED == \
        f"docker.io/library/tsoracle-spark:{images.app_version()}"
    assert images.SPARK.entrypoint == ("/opt/tsoracle-spark/entrypoint.sh",)
    assert dict(images.SPARK.files) == {
        "/opt/tsoracle-spark/entrypoint.sh": "tools/tsoracle_dev/images/spark-entrypoint.sh",
        "/opt/tsoracle-spark/examples/pipeline.py": "examples/spark/pipeline.py"}
    assert {"python3", "python3-venv", "openjdk-17-jre-headless"} <= set(images.SPARK.packages)
    # operator: the Kubernetes client, with which a driver pod finds its catalog (the
    # TimestampOracle's status).
    assert images.SPARK.extras == ("spark", "operator")
    # Iceberg's Spark runtime, the one tsoracle.spark pins, on Spark's own classpath: pods
    # fetch nothing from Maven, and the sessions use that jar ($TSORACLE_ICEBERG_JAR).
    [(jar, coordinate)] = images.SPARK.maven
    assert coordinate == RUNTIME_PACKAGE
    assert jar.startswith(dict(images.SPARK.env)["SPARK_HOME"] + "/jars/")
    assert dict(images.SPARK.env)["TSORACLE_ICEBERG_JAR"] == jar


def test_the_entrypoint_starts_an_executor_as_spark_kubernetes_does(tmp_path):
    env = {**_fake_spark(tmp_path), **EXECUTOR_ENV, "SPARK_CONF_DIR": "/opt/spark/conf",
           "SPARK_JAVA_OPT_10": "-Dten=1", "SPARK_JAVA_OPT_2": "-Dtwo=a b",
           "SPARK_JAVA_OPT_0": "-Dzero"}
    proc = _entrypoint(env, "executor")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines == [
        "java", f"-Duser.home={tmp_path / 'home'}", "-Dzero", "-Dtwo=a b", "-Dten=1",
        "-Xms512m", "-Xmx512m", "-cp", f"/opt/spark/conf:{tmp_path / 'spark'}/jars/*",
        *BACKEND_ARGS, f"HOME={tmp_path / 'home'} SPARK_SUBMIT_OPTS="]


def test_the_entrypoint_starts_a_driver_in_client_mode(tmp_path):
    env = {**_fake_spark(tmp_path), "SPARK_DRIVER_BIND_ADDRESS": "10.244.0.7",
           "HOME": "/nonexistent"}
    args = ["--properties-file", "/opt/spark/conf/spark.properties", "--class",
            "org.apache.spark.deploy.PythonRunner", "local:///app/job.py", "x y"]
    proc = _entrypoint(env, "driver", *args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "spark-submit", "--conf", "spark.driver.bindAddress=10.244.0.7", "--deploy-mode",
        "client", *args, "HOME=/tmp SPARK_SUBMIT_OPTS=-Duser.home=/tmp"]


@pytest.mark.parametrize("role, missing", [
    ("executor", sorted(EXECUTOR_ENV)), ("driver", ["SPARK_DRIVER_BIND_ADDRESS"])])
def test_the_entrypoint_names_what_a_role_misses(tmp_path, role, missing):
    proc = _entrypoint(_fake_spark(tmp_path), role)
    assert proc.returncode == 64 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"spark-entrypoint: {role}: missing environment variable(s) ")
    assert sorted(line.split("(s) ")[1].split(".")[0].split()) == missing


def test_the_entrypoint_runs_anything_else_as_given(tmp_path):
    env = _fake_spark(tmp_path)
    proc = _entrypoint(env, "sh", "-c", 'echo "$1|$PYSPARK_PYTHON"', "-", "a b")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"a b|{sys.executable}\n"
    none = _entrypoint(env)
    assert none.returncode == 64 and "no command" in none.stderr


@pytest.fixture(scope="module")
def spark_archive(archives) -> Path:
    """The Spark image's archive, from the user's cache (cold: a few minutes, once)."""
    return images.build_spark()


@pytest.fixture(scope="module")
def spark_imported(spark_archive, containerd) -> list[str]:
    images.import_archive(spark_archive, containerd["address"])
    return images.image_names(containerd["address"])


def test_the_spark_archive_imports_under_its_name(spark_imported):
    assert images.SPARK_IMAGE_NORMALISED in spark_imported


def test_a_warm_spark_build_rebuilds_nothing(spark_archive, archives):
    before = written([spark_archive, *archives.values()])
    proc = subprocess.run([*BUILD, "--spark", "-o", "json"],
                          capture_output=True, text=True, timeout=300, check=True)
    report = {r["image"]: r for r in json.loads(proc.stdout)}
    assert sorted(report) == ["operator", "pause", "spark"]
    assert Path(report["spark"]["archive"]) == spark_archive
    assert report["spark"]["reference"] == images.SPARK_IMAGE
    assert report["spark"]["name"] == images.SPARK_IMAGE_NORMALISED
    assert written([spark_archive, *archives.values()]) == before


def test_the_spark_archive_config_and_layers(spark_archive):
    with tarfile.open(spark_archive) as tar:
        blob = {m.name.removeprefix("blobs/sha256/"): tar.extractfile(m).read()
                for m in tar.getmembers() if m.isfile() and m.name.startswith("blobs/")}
        index = json.load(tar.extractfile("index.json"))
    (entry,) = index["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == images.SPARK_IMAGE_NORMALISED
    manifest = json.loads(blob[entry["digest"][7:]])
    config = json.loads(blob[manifest["config"]["digest"][7:]])["config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["/opt/tsoracle-spark/entrypoint.sh"]
    assert config["Env"] == [
        f"PATH={images.SPARK.path_env}",
        "SPARK_HOME=/opt/tsoracle/lib/python3.11/site-packages/pyspark",
        "PYSPARK_PYTHON=/opt/tsoracle/bin/python", "HOME=/tmp",
        "TSORACLE_ICEBERG_JAR=/opt/tsoracle/lib/python3.11/site-packages/pyspark/jars/"
        "iceberg-spark-runtime-4.1_2.13-1.12.0.jar"]
    base, app = (_members(blob[layer["digest"][7:]]) for layer in manifest["layers"])
    entrypoint = {m.name: m for m in app}["opt/tsoracle-spark/entrypoint.sh"]
    assert entrypoint.mode == 0o755 and entrypoint.uid == 0
    with tarfile.open(fileobj=gzip.GzipFile(fileobj=io.BytesIO(
            blob[manifest["layers"][1]["digest"][7:]]))) as tar:
        assert tar.extractfile(entrypoint.name).read() == ENTRYPOINT.read_bytes()
    names = {m.name for m in base}
    assert {"usr/bin/tini", "usr/bin/python3.11"} <= names
    assert [n for n in names if n.startswith("usr/lib/jvm/java-17-openjdk-")
            and n.endswith("/bin/java")]


def spark_run(containerd, *args: str, env: dict[str, str] | None = None,
              mounts: tuple[str, ...] = (), timeout: float = 180,
              ) -> subprocess.CompletedProcess[str]:
    """The Spark image as Kubernetes runs it: its entrypoint with `args`, a tmpfs at /tmp, and
    an /etc/hosts naming the container's hostname (the kubelet writes one for each pod; `ctr
    run` leaves the host's hostname, which Spark's and log4j's getLocalHost must resolve)."""
    hosts = containerd["home"] / "hosts"
    if not hosts.exists():
        hosts.write_text(f"127.0.0.1 localhost {socket.gethostname()}\n")
    options = [*TMPFS, "--mount", f"type=bind,src={hosts},dst=/etc/hosts,options=rbind:ro",
               *mounts]
    for name, value in (env or {}).items():
        options += ["--env", f"{name}={value}"]
    return ctr_run(containerd, images.SPARK_IMAGE_NORMALISED, *images.SPARK.entrypoint, *args,
                   options=tuple(options), timeout=timeout)


def test_the_spark_image_runs_java_and_python_as_65532(containerd, spark_imported):
    java = spark_run(containerd, "java", "-version")
    assert java.returncode == 0, java.stderr
    assert 'version "17.' in java.stderr
    python = spark_run(containerd, "python", "-c",
                       "import os, sys, tsoracle.spark, pyspark; "
                       "print(os.getuid(), os.getgid(), os.environ['HOME'], sys.executable, "
                       "pyspark.__version__)")
    assert python.returncode == 0, python.stderr
    uid, gid, home, executable, version = python.stdout.split()
    assert (uid, gid, home, executable) == ("65532", "65532", "/tmp", "/opt/tsoracle/bin/python")
    assert version.split(".")[0] >= "4"
    version = spark_run(containerd, "tsoracle", "--version")
    assert version.returncode == 0 and version.stdout.strip() == \
        f"tsoracle {images.app_version()}", version.stderr


JOB = """\
import os
from pyspark.sql import SparkSession

spark = SparkSession.builder.appName("count").getOrCreate()
# A range counted by the JVM, squares summed by Python workers (PYSPARK_PYTHON).
print("count", spark.range(1000).filter("id % 7 = 0").count())
print("squares", spark.sparkContext.parallelize(range(100), 4).map(lambda x: x * x).sum())
print("user.home", spark.sparkContext._jvm.java.lang.System.getProperty("user.home"))
print("uid", os.getuid())
spark.stop()
"""


def test_a_local_spark_job_runs_in_the_driver_role(containerd, spark_imported, tmp_path):
    """`driver` (spark-submit in client mode) with a local master: a PySpark job as uid 65532
    on a read-only root filesystem."""
    (tmp_path / "job").mkdir(mode=0o755)
    (tmp_path / "job" / "job.py").write_text(JOB)
    proc = spark_run(
        containerd, "driver", "--master", "local[2]", "--conf", "spark.ui.enabled=false",
        "/job/job.py", env={"SPARK_DRIVER_BIND_ADDRESS": "127.0.0.1"},
        mounts=("--mount", f"type=bind,src={tmp_path / 'job'},dst=/job,options=rbind:ro"))
    log = "\n".join(line for line in proc.stderr.splitlines() if " INFO " not in line)
    assert proc.returncode == 0, log[-5000:]
    lines = [line for line in proc.stdout.splitlines() if " " in line]
    assert lines == ["count 143", "squares 328350", "user.home /tmp", "uid 65532"], \
        proc.stdout + log[-3000:]


def test_an_executor_without_its_environment_says_what_is_missing(containerd, spark_imported):
    proc = spark_run(containerd, "executor", env={"SPARK_EXECUTOR_ID": "1"})
    assert proc.returncode == 64
    assert "Exception" not in proc.stderr and "\tat " not in proc.stderr
    assert proc.stderr.startswith("spark-entrypoint: executor: missing environment variable(s) "
                                  "SPARK_DRIVER_URL SPARK_EXECUTOR_CORES"), proc.stderr


def test_the_executor_backend_takes_the_entrypoints_arguments(containerd, spark_imported):
    """The real KubernetesExecutorBackend parses what the entrypoint passes, then fails only
    because no driver listens at SPARK_DRIVER_URL."""
    proc = spark_run(containerd, "executor", env=EXECUTOR_ENV)
    assert proc.returncode != 0
    assert "Usage:" not in proc.stderr and "Unrecognized options" not in proc.stderr
    assert "KubernetesExecutorBackend: Started daemon" in proc.stderr, proc.stderr[-3000:]
    assert "Failed to connect to /127.0.0.1:9" in proc.stderr, proc.stderr[-3000:]

"""tools/images: the Dockerfile follows the image recipe, and the archives built without Docker
import into containerd under the chart's names and run as the chart runs them."""

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
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools" / "images"))

import images  # noqa: E402

DOCKERFILE = ROOT / "Dockerfile"
BUILD = ROOT / "tools" / "images" / "build.py"


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
        "Dockerfile vs tools/images/images.toml [operator] (Dockerfile value, recipe value)"


# Each edit of the Dockerfile must be caught, by the field it changes.
DOCKERFILE_EDITS = {
    "suite": ("debian:bookworm-slim", "debian:trixie-slim"),
    "packages": ("python3 python3-venv", "python3 python3-venv curl"),
    "extras": ('"/src[operator]"', '"/src[operator,spark]"'),
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
    proc = subprocess.run([sys.executable, str(BUILD), "--import"], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "make dev-cluster" in proc.stderr


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


def test_a_warm_build_takes_seconds_and_reports_the_archives(archives):
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(BUILD), "-o", "json"], capture_output=True,
                          text=True, timeout=300, check=True)
    elapsed = time.monotonic() - started
    report = {r["image"]: r for r in json.loads(proc.stdout)}
    assert Path(report["operator"]["archive"]) == archives["operator"]
    assert Path(report["pause"]["archive"]) == archives["pause"]
    assert report["operator"]["name"] == images.OPERATOR_IMAGE_NORMALISED
    assert report["operator"]["archive_bytes"] == archives["operator"].stat().st_size
    assert elapsed < 20, f"a warm build took {elapsed:.1f} s"


def ctr_run(containerd, image: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run `argv` in `image` as the image says (its user), on a read-only root filesystem."""
    home = containerd["home"]
    return subprocess.run(
        ["ctr", "--address", containerd["address"], "-n", "k8s.io", "run", "--rm", "--read-only",
         "--fifo-dir", str(home / "fifo"), "--runc-root", str(home / "runc"), image,
         f"test-{uuid.uuid4().hex[:10]}", *argv],
        capture_output=True, text=True, timeout=120)


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


def test_the_operator_image_has_only_the_operator_extra(containerd, imported):
    spark = ctr_run(containerd, images.OPERATOR_IMAGE_NORMALISED, "python", "-c",
                    "import pyspark")
    assert spark.returncode != 0 and "No module named 'pyspark'" in spark.stderr
    pip = ctr_run(containerd, images.OPERATOR_IMAGE_NORMALISED, "python", "-c", "import pip")
    assert pip.returncode != 0 and "No module named 'pip'" in pip.stderr


def test_the_pause_image_runs(containerd, imported):
    proc = ctr_run(containerd, images.PAUSE_IMAGE, "/pause", "-v")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"pause.c v{images.PAUSE_TAG}-{_k8s_version()}"


def _k8s_version() -> str:
    sys.path.insert(0, str(ROOT / "tools" / "controlplane"))
    from cluster import K8S_VERSION

    return K8S_VERSION

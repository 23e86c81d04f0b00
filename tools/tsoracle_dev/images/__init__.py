"""OCI image archives for the dev cluster, built from Debian packages: no Docker, no registry.

    build_pause() -> Path      # tsoracle.dev/pause:3.10, a static /pause from kubernetes' source
    build_operator() -> Path   # tsoracle:<appVersion>, Debian + a venv with tsoracle[operator]
    build_spark() -> Path      # tsoracle-spark:<appVersion>, + a JRE, tsoracle[spark], entrypoint
    import_archive(path, address)   # `ctr -n k8s.io images import` into a containerd

The app images are data (images.toml; the Dockerfile mirrors its operator): a Debian base layer
made with `debootstrap --variant=minbase` plus packages, and an app layer holding the venv, the
user entries and any files the recipe adds (the Spark image's entrypoint). Each layer and
archive is cached under ${TSORACLE_CACHE:-~/.cache/tsoracle}/images by a digest of its recipe,
so a change to tsoracle/ rebuilds only the app layer and an unchanged checkout builds nothing.
Building needs root (debootstrap, chroot).
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tsoracle_dev import CHECKOUT, hosttools

RECIPES = Path(__file__).resolve().with_name("images.toml")
CHART = CHECKOUT / "charts" / "tsoracle" / "Chart.yaml"

# Bump to rebuild a kind of layer whose recipe changed in code rather than in data.
BASE_FORMAT = 1
APP_FORMAT = 1
WHEELS_FORMAT = 1
PAUSE_FORMAT = 2

PAUSE_TAG = "3.10"
PAUSE_IMAGE = f"tsoracle.dev/pause:{PAUSE_TAG}"
# What `python3` is in each Debian suite: the wheels are built by the Python running this tool.
SUITE_PYTHON = {"bookworm": (3, 11)}
# Layers and archives older than the newest few of an image are deleted, so iterating on
# tsoracle/ does not fill the disk.
KEEP = 3
# Fixed times in the image metadata, so an unchanged recipe gives the same config and manifest.
EPOCH = "1970-01-01T00:00:00Z"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# What the base drops after debootstrap: apt's lists and caches, docs (the copyright files
# stay), man pages, translations, logs, and the build host's resolv.conf/hostname (runtimes
# mount their own).
BASE_CLEANUP = [
    "var/lib/apt/lists/*", "var/cache/apt/*", "var/cache/debconf/*-old", "var/lib/dpkg/*-old",
    "var/cache/ldconfig/aux-cache", "var/log/*", "usr/share/man/*", "usr/share/info/*",
    "usr/share/lintian", "usr/share/linda", "usr/share/bug", "etc/resolv.conf", "etc/hostname",
    "tmp/*", "root/.cache",
]
# Children of these are never put in a layer: device nodes and mount points (runtimes mount
# /dev, /proc and /sys themselves).
EMPTY_DIRS = {"dev", "proc", "sys"}

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
# containerd's import names an image after this annotation of the index's manifest entry.
ANNOTATION_NAME = "io.containerd.image.name"
ANNOTATION_REF = "org.opencontainers.image.ref.name"


def app_version() -> str:
    """The chart's appVersion: the tag of the operator image the chart runs by default."""
    match = re.search(r'^appVersion:\s*["\']?([^"\'\s]+)', CHART.read_text(), re.MULTILINE)
    if not match:
        raise RuntimeError(f"no appVersion in {CHART}")
    return match.group(1)


def normalise(reference: str) -> str:
    """The name containerd and the kubelet give a reference: `tsoracle:1` is
    `docker.io/library/tsoracle:1`."""
    name, at, digest = reference.partition("@")
    # A tag is after the last colon of the last path component (an earlier one is a port).
    repo, _, tag = name.rpartition(":") if ":" in name.rpartition("/")[2] else (name, "", "")
    first, _, rest = repo.partition("/")
    if not rest:
        repo = f"docker.io/library/{repo}"
    elif "." not in first and ":" not in first and first != "localhost":
        repo = f"docker.io/{repo}"
    if not tag and not at:
        tag = "latest"
    return repo + (f":{tag}" if tag else "") + (f"@{digest}" if at else "")


@dataclass(frozen=True)
class ImageSpec:
    """One app image of images.toml: a Debian base plus a venv of this checkout with extras."""

    name: str
    repository: str
    suite: str
    packages: tuple[str, ...]
    extras: tuple[str, ...]
    venv: str
    user: str
    uid: int
    gid: int
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    # (path in the image, path in this checkout) of files the app layer adds, mode 0755.
    files: tuple[tuple[str, str], ...] = ()
    # The image's environment besides PATH.
    env: tuple[tuple[str, str], ...] = ()
    # (path in the image, Maven coordinate group:artifact:version) of jars the app layer adds,
    # fetched on the build host (pods may reach no repository).
    maven: tuple[tuple[str, str], ...] = ()

    @property
    def reference(self) -> str:
        return f"{self.repository}:{app_version()}"

    @property
    def image_name(self) -> str:
        return normalise(self.reference)

    @property
    def path_env(self) -> str:
        return f"{self.venv}/bin:{DEFAULT_PATH}"

    @property
    def requirement(self) -> str:
        return f"tsoracle[{','.join(self.extras)}]" if self.extras else "tsoracle"


def load_recipes(path: Path = RECIPES) -> dict[str, ImageSpec]:
    """The images of images.toml by name."""
    data = tomllib.loads(path.read_text())
    specs = {}
    for name, table in data.items():
        specs[name] = ImageSpec(
            name=name, repository=table["repository"], suite=table["suite"],
            packages=tuple(table["packages"]), extras=tuple(table["extras"]),
            venv=table["venv"], user=table["user"], uid=int(table["uid"]), gid=int(table["gid"]),
            entrypoint=tuple(table["entrypoint"]), cmd=tuple(table["cmd"]),
            files=tuple(sorted(table.get("files", {}).items())),
            env=tuple(table.get("env", {}).items()),
            maven=tuple(sorted(table.get("maven", {}).items())))
    return specs


OPERATOR = load_recipes()["operator"]
OPERATOR_IMAGE = OPERATOR.reference                # what the chart says: tsoracle:<appVersion>
OPERATOR_IMAGE_NORMALISED = OPERATOR.image_name    # what containerd lists: docker.io/library/…
SPARK = load_recipes()["spark"]
SPARK_IMAGE = SPARK.reference                      # tsoracle-spark:<appVersion>
SPARK_IMAGE_NORMALISED = SPARK.image_name


# --- cache --------------------------------------------------------------------------------


def cache_dir() -> Path:
    base = Path(os.environ.get("TSORACLE_CACHE", Path.home() / ".cache" / "tsoracle"))
    return base / "images"


def _key(*parts: object) -> str:
    """A short digest of a recipe: any change to a part gives another cache entry."""
    digest = hashlib.sha256()
    for part in parts:
        data = part if isinstance(part, bytes) else json.dumps(part, sort_keys=True).encode()
        digest.update(len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """Serialise builds of one recipe across processes (a second cold build waits, then finds
    the first's result instead of running debootstrap again)."""
    locks = cache_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = _tmp_name(path)
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _prune(directory: Path, prefix: str, suffixes: tuple[str, ...]) -> None:
    """Delete all but the KEEP newest entries `prefix*suffix` (with their sidecars)."""
    main = suffixes[0]
    entries = sorted((p for p in directory.glob(f"{prefix}*{main}") if not p.name.startswith(".")),
                     key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[KEEP:]:
        stem = old.name[: -len(main)]
        for suffix in suffixes:
            (directory / f"{stem}{suffix}").unlink(missing_ok=True)


# --- layers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layer:
    """A gzip layer blob with what the manifest (digest, size) and config (diff_id) need."""

    path: Path
    digest: str
    diff_id: str
    size: int
    unpacked: int
    created_by: str

    def meta(self) -> dict[str, object]:
        return {"digest": self.digest, "diff_id": self.diff_id, "size": self.size,
                "unpacked": self.unpacked, "created_by": self.created_by}


def _cached_layer(path: Path) -> Layer | None:
    """The layer at `path` if its sidecar (written after the blob) is there."""
    meta = path.with_name(path.name.removesuffix(".tar.gz") + ".json")
    if not (meta.exists() and path.exists()):
        return None
    data = json.loads(meta.read_text())
    return Layer(path=path, digest=data["digest"], diff_id=data["diff_id"], size=data["size"],
                 unpacked=data["unpacked"], created_by=data["created_by"])


class _Hashing(io.RawIOBase):
    """A write-through file that counts and digests what passes (diff_id before gzip, digest
    after)."""

    def __init__(self, inner: IO[bytes]) -> None:
        self.inner = inner
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.sha.update(data)
        self.size += len(data)
        self.inner.write(data)
        return len(data)


def _walk(root: Path, rel: str, recursive: bool = True) -> Iterator[str]:
    """`rel` and (if recursive) everything below it, sorted, without following symlinks."""
    yield rel
    path = root / rel
    if not recursive or path.is_symlink() or not path.is_dir():
        return
    if rel in EMPTY_DIRS:
        return
    for entry in sorted(os.listdir(path)):
        yield from _walk(root, f"{rel}/{entry}" if rel else entry)


def write_layer(root: Path, members: list[tuple[str, bool]], out: Path, created_by: str) -> Layer:
    """Tar (numeric owners, modes as on disk, no device nodes) and gzip the given paths of
    `root` into `out`; `members` are (path, recursive) with parents listed first."""
    with open(_tmp_name(out), "wb") as raw:
        compressed = _Hashing(raw)
        with gzip.GzipFile(fileobj=compressed, mode="wb", compresslevel=6, mtime=0) as gz:
            plain = _Hashing(gz)
            with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for member, recursive in members:
                    for rel in _walk(root, member, recursive):
                        _add(tar, root / rel, rel)
    os.replace(_tmp_name(out), out)
    layer = Layer(path=out, digest=f"sha256:{compressed.sha.hexdigest()}",
                  diff_id=f"sha256:{plain.sha.hexdigest()}", size=compressed.size,
                  unpacked=plain.size, created_by=created_by)
    _write_atomic(out.with_name(out.name.removesuffix(".tar.gz") + ".json"),
                  json.dumps(layer.meta(), indent=1).encode())
    return layer


def _add(tar: tarfile.TarFile, path: Path, arcname: str) -> None:
    if not arcname:
        return  # the root itself: an entry `/` would change the modes of the container's root
    info = tar.gettarinfo(str(path), arcname)  # hard links become link entries here
    if info is None or info.ischr() or info.isblk() or info.isfifo():
        return  # sockets, device nodes, fifos: a runtime provides /dev
    info.uname = info.gname = ""  # numeric owners only: the image's passwd is not the host's
    info.mtime = int(info.mtime)  # a float would add a PAX record to every member
    if info.isreg():
        with open(path, "rb") as handle:
            tar.addfile(info, handle)
    else:
        tar.addfile(info)


# --- the Debian base ----------------------------------------------------------------------


def debian_mirror(suite: str, apt: Path = Path("/etc/apt")) -> str:
    """The Debian mirror this host's apt uses for `suite` (one-line and deb822 sources), or
    $TSORACLE_DEBIAN_MIRROR."""
    if os.environ.get("TSORACLE_DEBIAN_MIRROR"):
        return os.environ["TSORACLE_DEBIAN_MIRROR"]
    files = [apt / "sources.list", *sorted((apt / "sources.list.d").glob("*.list"))]
    for path in [f for f in files if f.exists()]:
        for line in path.read_text().splitlines():
            words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
            if len(words) >= 3 and words[0] == "deb" and words[2] == suite:
                if words[1].startswith(("http:", "https:", "file:")):
                    return words[1]
    for path in sorted((apt / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text()):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line or line[:1].isspace():
                    continue
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
            if fields.get("enabled", "yes").lower() == "no":
                continue
            types, suites = fields.get("types", "").split(), fields.get("suites", "").split()
            if "deb" in types and suite in suites:
                for uri in fields.get("uris", "").split():
                    if uri.startswith(("http:", "https:", "file:")):
                        return uri
    raise RuntimeError(f"no apt source for Debian {suite} in {apt}; set TSORACLE_DEBIAN_MIRROR")


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()) + "/"
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    return sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True)


def _unmount_under(path: Path) -> None:
    for point in _mounts_under(path):
        hosttools.run(["umount", "--lazy", point], check=False)


def remove_tree(path: Path) -> None:
    """Delete a build root; first unmount what debootstrap may have left mounted in it (proc,
    sys), so the delete cannot reach into the host's."""
    _unmount_under(path)
    if _mounts_under(path):
        raise RuntimeError(f"{path} still has mounts; not deleting it")
    shutil.rmtree(path, ignore_errors=True)


def _clean_base(rootfs: Path) -> None:
    for pattern in BASE_CLEANUP:
        for path in rootfs.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    for locale in (rootfs / "usr/share/locale").glob("*"):
        if locale.name != "locale.alias":  # read by libc's setlocale; the rest is translations
            shutil.rmtree(locale) if locale.is_dir() else locale.unlink()
    for doc in (rootfs / "usr/share/doc").glob("*"):
        if doc.is_dir() and not doc.is_symlink():
            for entry in doc.iterdir():
                if entry.name != "copyright":  # licences stay
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() \
                        else entry.unlink()


def _need_root() -> None:
    if os.geteuid() != 0:
        raise SystemExit("building images needs root (debootstrap, chroot)")


def build_base(spec: ImageSpec) -> Layer:
    """The Debian layer of `spec`: debootstrap minbase + its packages, cleaned. Cached by suite,
    package list and cleanup recipe."""
    packages = sorted(spec.packages)
    key = _key(BASE_FORMAT, spec.suite, packages, BASE_CLEANUP, _arch())
    out = cache_dir() / "base" / f"{spec.suite}-{key}.tar.gz"
    if layer := _cached_layer(out):
        return layer
    _need_root()
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(f"base-{key}"):
        if layer := _cached_layer(out):
            return layer  # built by a concurrent run while this one waited
        hosttools.need("debootstrap", "chroot")
        mirror = debian_mirror(spec.suite)
        argv = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}",
                spec.suite]
        print(f"building the Debian {spec.suite} base ({', '.join(packages)}): a minute or "
              "two, once...", file=sys.stderr)
        work = Path(tempfile.mkdtemp(prefix="base-", dir=out.parent))
        try:
            rootfs = work / "rootfs"
            proc = hosttools.run([*argv, str(rootfs), mirror], capture_output=True, text=True)
            if proc.returncode != 0:
                log = rootfs / "debootstrap" / "debootstrap.log"
                tail = log.read_text()[-3000:] if log.exists() else ""
                raise RuntimeError(f"debootstrap failed ({proc.returncode}):\n{proc.stdout[-2000:]}"
                                   f"{proc.stderr[-2000:]}\n{tail}")
            _unmount_under(rootfs)
            _clean_base(rootfs)
            layer = write_layer(rootfs, [("", True)], out, " ".join(argv))
        finally:
            remove_tree(work)
    return layer


# --- the app layer ------------------------------------------------------------------------

SOURCES = ["pyproject.toml", "README.md", "tsoracle"]


def _source_files() -> list[Path]:
    """The files of this checkout that go in the image: no caches, no build output."""
    files = []
    for name in SOURCES:
        path = CHECKOUT / name
        if path.is_file():
            files.append(path)
            continue
        for sub in sorted(path.rglob("*")):
            parts = sub.relative_to(CHECKOUT).parts
            if sub.is_file() and "__pycache__" not in parts and sub.suffix not in (".pyc", ".pyo"):
                files.append(sub)
    return files


def _copy_sources(files: list[Path], dest: Path) -> None:
    for path in files:
        target = dest / path.relative_to(CHECKOUT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)


def _chroot(rootfs: Path, *argv: str) -> None:
    # A clean environment: the host's PIP_*, PYTHON* and PATH mean nothing in the image.
    env = {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PIP_NO_CACHE_DIR": "1"}
    proc = hosttools.run(["chroot", str(rootfs), *argv], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"in the image: {' '.join(argv)} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")


def build_app_layer(spec: ImageSpec, base: Layer) -> Layer:
    """The venv (this checkout + the extras) and the user entries, on top of `base`. Cached by
    the base, the recipe and the source files."""
    files = _source_files()
    sources = [(str(p.relative_to(CHECKOUT)), hashlib.sha256(p.read_bytes()).hexdigest())
               for p in files]
    # The added files count only when there are some (the operator's key predates them).
    added = [(dest, hashlib.sha256((CHECKOUT / src).read_bytes()).hexdigest())
             for dest, src in spec.files]
    # Jars count only when there are some, too; a release of a coordinate never changes.
    key = _key(APP_FORMAT, base.digest, spec.extras, spec.venv, spec.user, spec.uid, spec.gid,
               sources, *([added] if added else []), *([spec.maven] if spec.maven else []))
    layers = cache_dir() / "layers"
    out = layers / f"{spec.name}-app-{key}.tar.gz"
    if layer := _cached_layer(out):
        return layer
    _need_root()
    want = SUITE_PYTHON.get(spec.suite)
    if want and sys.version_info[:2] != want:
        raise SystemExit(f"run this with Python {'.'.join(map(str, want))}, the image's "
                         f"(the wheels are resolved by the running Python)")
    layers.mkdir(parents=True, exist_ok=True)
    with _locked(f"{spec.name}-app-{key}"):
        if layer := _cached_layer(out):
            return layer
        print(f"building the {spec.name} app layer ({spec.requirement})...", file=sys.stderr)
        work = Path(tempfile.mkdtemp(prefix=f"{spec.name}-app-", dir=layers))
        try:
            layer = _build_app(spec, base, files, work, out)
        finally:
            remove_tree(work)
    _prune(layers, f"{spec.name}-app-", (".tar.gz", ".json"))
    return layer


def _pip_wheel(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", *args],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip wheel failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")


def _dependency_wheels(spec: ImageSpec, src: Path) -> Path:
    """The wheels of tsoracle's dependencies with `spec.extras`, resolved once per
    pyproject.toml (so rebuilding the app layer after a code change needs no index): a new
    release of a dependency comes in when pyproject.toml changes or this cache is deleted."""
    key = _key(WHEELS_FORMAT, (src / "pyproject.toml").read_bytes(), spec.extras,
               sys.version_info[:2], _arch())
    wheels = cache_dir() / "wheels"
    out = wheels / f"{spec.name}-{key}"
    if out.is_dir():
        return out
    wheels.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}-", dir=wheels))
    try:
        _pip_wheel("--wheel-dir", str(tmp), f"{src}[{','.join(spec.extras)}]")
        for own in tmp.glob("tsoracle-*.whl"):
            own.unlink()  # the app's own wheel is built each time, from the sources
        try:
            os.rename(tmp, out)  # atomic; fails if a concurrent build got there first
        except OSError:
            if not out.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _prune_dirs(wheels, f"{spec.name}-")
    return out


def _prune_dirs(directory: Path, prefix: str) -> None:
    entries = sorted(directory.glob(f"{prefix}*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[KEEP:]:
        shutil.rmtree(old, ignore_errors=True)


def _base_rootfs(base: Layer) -> Path:
    """The base layer unpacked, once: the read-only lower layer of each app build's overlay."""
    out = base.path.with_name("rootfs-" + base.path.name.removesuffix(".tar.gz"))
    if out.is_dir():
        return out
    with _locked(out.name):
        if not out.is_dir():
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
            try:
                hosttools.run(["tar", "--numeric-owner", "-xpzf", str(base.path), "-C",
                                str(tmp)], check=True)
                os.chmod(tmp, 0o755)  # it is / in the chroot
                os.rename(tmp, out)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        _prune_dirs(out.parent, "rootfs-")
    return out


def _mount_base(base: Layer, rootfs: Path, work: Path) -> subprocess.Popen[bytes] | None:
    """Put the base at `rootfs`: an overlay on its unpacked copy (instant: unpacking costs
    seconds, mostly creating files), or else unpack it there, in the background (returned)."""
    upper, scratch = work / "upper", work / "overlay-work"
    upper.mkdir()
    scratch.mkdir()
    options = f"lowerdir={_base_rootfs(base)},upperdir={upper},workdir={scratch}"
    if hosttools.run(["mount", "-t", "overlay", "overlay", "-o", options, str(rootfs)],
                      capture_output=True).returncode == 0:
        return None  # remove_tree unmounts it
    return subprocess.Popen(["tar", "--numeric-owner", "-xpzf", str(base.path), "-C",
                             str(rootfs)], stderr=subprocess.PIPE)


def _build_app(spec: ImageSpec, base: Layer, files: list[Path], work: Path, out: Path) -> Layer:
    rootfs = work / "rootfs"
    rootfs.mkdir()
    untar = _mount_base(base, rootfs, work)
    try:
        # The wheels: resolved and built on the host (its pip config and cache; no network,
        # DNS or CA bundle needed in the chroot) from a clean copy of the sources.
        src = work / "src"
        _copy_sources(files, src)
        deps = _dependency_wheels(spec, src)
        _pip_wheel("--no-deps", "--wheel-dir", str(work / "wheels"), str(src))
    finally:
        err = untar.communicate()[1] if untar else b""
    if untar and untar.returncode != 0:
        raise RuntimeError(f"unpacking the base failed: {err.decode()[-2000:]}")
    shutil.copytree(deps, rootfs / "tmp" / "deps")
    shutil.copytree(work / "wheels", rootfs / "tmp" / "wheels")
    null = rootfs / "dev" / "null"  # some tools write to it; not part of any layer
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.chmod(null, 0o666)
    # The venv gets no pip: Debian's pip wheel (python3-venv) installs into it from outside.
    pip = sorted((rootfs / "usr/share/python-wheels").glob("pip-*.whl"))
    if not pip:
        raise RuntimeError("no pip wheel in the base (is python3-venv in its packages?)")
    _chroot(rootfs, "python3", "-m", "venv", "--without-pip", spec.venv)
    # --no-compile: the .pyc files would be a third of the layer (64 of 180 MiB, mostly the
    # kubernetes client) to save about a second at start-up.
    _chroot(rootfs, f"{spec.venv}/bin/python", f"/{pip[-1].relative_to(rootfs)}/pip", "install",
            "--no-index", "--find-links", "/tmp/wheels", "--find-links", "/tmp/deps",
            "--no-warn-script-location", "--no-compile", spec.requirement)
    for cache in sorted((rootfs / spec.venv.strip("/")).rglob("__pycache__"), reverse=True):
        shutil.rmtree(cache)  # any the build itself left
    with open(rootfs / "etc" / "passwd", "a") as passwd:
        passwd.write(f"{spec.user}:x:{spec.uid}:{spec.gid}::/nonexistent:/usr/sbin/nologin\n")
    with open(rootfs / "etc" / "group", "a") as group:
        group.write(f"{spec.user}:x:{spec.gid}:\n")
    for dest, src in spec.files:
        target = rootfs / dest.strip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(CHECKOUT / src, target)
        os.chmod(target, 0o755)
    for dest, coordinate in spec.maven:
        target = rootfs / dest.strip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(maven_jar(coordinate), target)
        os.chmod(target, 0o644)
    venv = spec.venv.strip("/")
    members = [("etc", False), ("etc/group", False), ("etc/passwd", False),
               *[(p, False) for p in _parents(venv)], (venv, True)]
    for dest, _ in [*spec.files, *spec.maven]:
        members += [(p, False) for p in _parents(dest.strip("/"))] + [(dest.strip("/"), False)]
    created_by = (f"python3 -m venv {spec.venv} && pip install {spec.requirement}; "
                  f"user {spec.user} {spec.uid}:{spec.gid}")
    if spec.files:
        created_by += "; " + ", ".join(f"{dest} from {src}" for dest, src in spec.files)
    if spec.maven:
        created_by += "; " + ", ".join(f"{dest} from {c}" for dest, c in spec.maven)
    return write_layer(rootfs, list(dict.fromkeys(members)), out, created_by)


def maven_jar(coordinate: str) -> Path:
    """The jar of `coordinate` (group:artifact:version) from Maven Central, through mvn's own
    configuration, cached here: built images carry it, so no pod fetches anything."""
    group, artifact, version = coordinate.split(":")
    out = cache_dir() / "maven" / f"{artifact}-{version}.jar"
    if out.is_file():
        return out
    hosttools.need("mvn")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        proc = hosttools.run(["mvn", "-q", "-B", "dependency:copy",
                               f"-Dartifact={group}:{artifact}:{version}:jar",
                               f"-DoutputDirectory={tmp}"], capture_output=True, text=True)
        jar = Path(tmp) / f"{artifact}-{version}.jar"
        if proc.returncode != 0 or not jar.is_file():
            raise RuntimeError(f"mvn could not fetch {coordinate}:\n{proc.stdout[-2000:]}"
                               f"{proc.stderr[-2000:]}")
        os.replace(jar, out)
    return out


def _parents(rel: str) -> list[str]:
    """The parent directories of a relative path, outermost first: `a/b/c` gives a, a/b."""
    path = Path(rel)
    return [str(path.parents[i]) for i in range(len(path.parts) - 2, -1, -1)]


# --- OCI archives -------------------------------------------------------------------------


def _arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}.get(machine, machine)


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _sha(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def _tarinfo(name: str, size: int = 0, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o755 if directory else 0o644
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    return info


def write_archive(out_dir: Path, stem: str, name: str, image_config: dict[str, object],
                  layers: list[Layer]) -> Path:
    """An OCI image layout as a tar (what `ctr images import` reads), named `name` through the
    index's annotations. Cached by its manifest digest."""
    config = {
        "created": EPOCH, "architecture": _arch(), "os": "linux", "config": image_config,
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [{"created": EPOCH, "created_by": layer.created_by} for layer in layers],
    }
    config_blob = _json(config)
    manifest = {
        "schemaVersion": 2, "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": _sha(config_blob),
                   "size": len(config_blob)},
        "layers": [{"mediaType": MEDIA_LAYER, "digest": layer.digest, "size": layer.size}
                   for layer in layers],
    }
    manifest_blob = _json(manifest)
    index = {
        "schemaVersion": 2, "mediaType": MEDIA_INDEX,
        "manifests": [{
            "mediaType": MEDIA_MANIFEST, "digest": _sha(manifest_blob),
            "size": len(manifest_blob),
            "platform": {"architecture": _arch(), "os": "linux"},
            "annotations": {ANNOTATION_NAME: name, ANNOTATION_REF: name.rpartition(":")[2]},
        }],
    }
    index_blob = _json(index)
    out = out_dir / f"{stem}-{_sha(index_blob)[7:23]}.oci.tar"
    if out.exists():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    # The sidecar first: an archive that exists always has one.
    _write_atomic(out.with_name(out.name.removesuffix(".oci.tar") + ".json"), json.dumps({
        "name": name, "manifest": _sha(manifest_blob),
        "layers": [layer.meta() for layer in layers],
        "unpacked_bytes": sum(layer.unpacked for layer in layers)}, indent=1).encode())
    with tarfile.open(_tmp_name(out), "w", format=tarfile.PAX_FORMAT) as tar:
        def add_bytes(arcname: str, data: bytes) -> None:
            tar.addfile(_tarinfo(arcname, len(data)), io.BytesIO(data))

        add_bytes("oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
        add_bytes("index.json", index_blob)
        for directory in ("blobs", "blobs/sha256"):
            tar.addfile(_tarinfo(directory, directory=True))
        add_bytes(f"blobs/sha256/{_sha(manifest_blob)[7:]}", manifest_blob)
        add_bytes(f"blobs/sha256/{_sha(config_blob)[7:]}", config_blob)
        for layer in layers:
            with open(layer.path, "rb") as blob:
                tar.addfile(_tarinfo(f"blobs/sha256/{layer.digest[7:]}", layer.size), blob)
    os.replace(_tmp_name(out), out)
    _prune(out_dir, f"{stem}-", (".oci.tar", ".json"))
    return out


def build_image(spec: ImageSpec) -> Path:
    """The OCI archive of an images.toml image (base + app layer), built or from the cache."""
    base = build_base(spec)
    app = build_app_layer(spec, base)
    image_config = {
        "User": f"{spec.uid}:{spec.gid}",
        "Env": [f"PATH={spec.path_env}", *(f"{name}={value}" for name, value in spec.env)],
        "Entrypoint": list(spec.entrypoint), "Cmd": list(spec.cmd), "WorkingDir": "/",
        "Labels": {"org.opencontainers.image.title": spec.repository,
                   "org.opencontainers.image.version": app_version()},
    }
    stem = f"{spec.repository}-{app_version()}"
    return write_archive(cache_dir() / "archives", stem, spec.image_name, image_config,
                         [base, app])


def build_operator() -> Path:
    """The operator image the chart runs by default (OPERATOR_IMAGE)."""
    return build_image(OPERATOR)


def build_spark() -> Path:
    """The image Spark on Kubernetes runs drivers and executors from (SPARK_IMAGE): the
    operator's recipe with a JRE, tsoracle[spark] and spark-entrypoint.sh (beside this file)."""
    return build_image(SPARK)


def k8s_version() -> str:
    """The Kubernetes version of the dev cluster (one constant, in its code)."""
    # Here, not at the top: the cluster code imports this module.
    from tsoracle_dev.controlplane.cluster import K8S_VERSION

    return K8S_VERSION


PAUSE_FETCH_TIMEOUT_S = 600  # the kubernetes module is tens of MB


def _node_module() -> Path:
    """The node's Go wrapper module (its go.sum pins the kubernetes module)."""
    from tsoracle_dev.controlplane import cluster  # it imports this module

    return cluster.HERE / "kube-node"


def pause_source() -> Path:
    """kubernetes' pause.c, from the Go module cache the control plane is built from."""
    version = k8s_version()
    relative = f"k8s.io/kubernetes@{version}/build/pause/linux/pause.c"
    # Go's default module cache, found without Go: a cluster built before needs no Go on PATH.
    gopath = os.environ.get("GOPATH", "").split(os.pathsep)[0] or str(Path.home() / "go")
    source = Path(os.environ.get("GOMODCACHE") or Path(gopath) / "pkg" / "mod") / relative
    if source.exists():
        return source
    hosttools.need("go")
    # Into the module cache the cluster's builds share, so this build needs no earlier
    # `make dev-cluster` and can run beside the cluster's builds (.ci/run does). From inside
    # the node's wrapper module, so the download is checked against its go.sum.
    module = f"k8s.io/kubernetes@{version}"
    try:
        proc = hosttools.run(["go", "mod", "download", "-json", module], capture_output=True,
                             text=True, timeout=PAUSE_FETCH_TIMEOUT_S,
                             cwd=_node_module(),
                             env={**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"})
    except subprocess.TimeoutExpired:
        raise SystemExit(f"go mod download {module} took more than {PAUSE_FETCH_TIMEOUT_S} s: "
                         "check that Go can reach its module proxy, then build again") from None
    try:
        found = json.loads(proc.stdout or "{}")
    except json.JSONDecodeError:
        found = {}
    source = Path(found.get("Dir") or "/nonexistent") / "build/pause/linux/pause.c"
    if proc.returncode != 0 or not source.is_file():
        why = (found.get("Error") or proc.stderr or "no error given").strip().splitlines()[0]
        raise SystemExit(f"kubernetes' pause.c could not be fetched ({why}): check that Go can "
                         f"reach its module proxy, then run `go mod download {module}` and "
                         "build again")
    return source


def build_pause() -> Path:
    """PAUSE_IMAGE: one layer with a static /pause compiled from kubernetes' pause.c."""
    source = pause_source()
    flags = ["-static", "-O2", "-s", "-Wall", "-Werror",
             f"-DVERSION=v{PAUSE_TAG}-{k8s_version()}"]  # as upstream: v$(TAG)-$(REV)
    key = _key(PAUSE_FORMAT, flags, source.read_bytes(), _arch())
    layers = cache_dir() / "layers"
    out = layers / f"pause-{key}.tar.gz"
    layer = _cached_layer(out)
    if layer is None:
        hosttools.need("gcc")
        layers.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="pause-", dir=layers))
        try:
            hosttools.run(["gcc", *flags, "-o", str(work / "pause"), str(source)], check=True)
            os.chmod(work / "pause", 0o755)
            os.utime(work / "pause", (0, 0))  # so the same compiler output is the same layer
            layer = write_layer(work, [("pause", False)], out, f"gcc {' '.join(flags)} pause.c")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        _prune(layers, "pause-", (".tar.gz", ".json"))
    # Upstream's image runs as 65535 (its Dockerfile: USER 65535:65535).
    image_config = {"User": "65535:65535", "Entrypoint": ["/pause"], "WorkingDir": "/",
                    "Env": [f"PATH={DEFAULT_PATH}"]}
    return write_archive(cache_dir() / "archives", f"pause-{PAUSE_TAG}", PAUSE_IMAGE,
                         image_config, [layer])


# --- containerd ---------------------------------------------------------------------------


def import_archive(path: Path, address: str, namespace: str = "k8s.io",
                   snapshotter: str | None = None) -> None:
    """Import an archive into the containerd at `address` and unpack it for `snapshotter`
    (default: containerd's, overlayfs; it must be the one the CRI plugin uses)."""
    argv = ["ctr", "--address", address, "-n", namespace, "images", "import"]
    argv += [f"--snapshotter={snapshotter}"] if snapshotter else []
    proc = hosttools.run([*argv, str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"ctr images import {path} failed ({proc.returncode}): "
                           f"{proc.stderr.strip() or proc.stdout.strip()}")


def image_names(address: str, namespace: str = "k8s.io") -> list[str]:
    """The images the containerd at `address` has in `namespace`."""
    proc = hosttools.run(["ctr", "--address", address, "-n", namespace, "images", "ls", "-q"],
                          capture_output=True, text=True, check=True)
    return proc.stdout.split()


def archive_info(path: Path) -> dict[str, object]:
    """Name, manifest digest and sizes of an archive written here: the archive's, and its
    layers' uncompressed (about what the image takes once unpacked)."""
    info = json.loads(path.with_name(path.name.removesuffix(".oci.tar") + ".json").read_text())
    return {**info, "archive": str(path), "archive_bytes": path.stat().st_size}


def cluster_containerd_address() -> str:
    """The dev cluster's containerd socket, from its state file."""
    state = Path(os.environ.get("TSORACLE_DEV_CLUSTER_STATE", CHECKOUT / ".dev-cluster"))
    path = state / "cluster.json"
    try:
        address = json.loads(path.read_text()).get("containerd_address")
    except (OSError, ValueError):
        address = None
    if not address:
        raise SystemExit(f"no containerd_address in {path}: run `make dev-cluster` first "
                         "(or pass --containerd-address SOCKET)")
    return str(address)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="tsoracle-images", description="Build the pause and operator image archives "
        "(cached), and with --spark the Spark image; optionally import them into a containerd.")
    parser.add_argument("--spark", action="store_true",
                        help=f"also build {SPARK_IMAGE}, the image of Spark's driver and executor "
                        "pods (a JRE and pyspark: a 560 MiB archive, two minutes cold)")
    parser.add_argument("--import", dest="do_import", action="store_true",
                        help="import them into containerd (namespace k8s.io)")
    parser.add_argument("--containerd-address", metavar="SOCKET",
                        help="default: containerd_address of the dev cluster's cluster.json")
    parser.add_argument("-o", "--output", choices=["text", "json"], default="text")
    args = parser.parse_args(argv)
    address = None
    if args.do_import:
        address = args.containerd_address or cluster_containerd_address()
        hosttools.need("ctr")
    started = time.monotonic()
    images = [("pause", PAUSE_IMAGE, build_pause()),
              ("operator", OPERATOR_IMAGE, build_operator())]
    if args.spark:
        images.append(("spark", SPARK_IMAGE, build_spark()))
    report = []
    for kind, reference, path in images:
        info = {"image": kind, "reference": reference, **archive_info(path)}
        if address:
            import_archive(path, address)
            info["imported"] = address
        report.append(info)
    if args.output == "json":
        print(json.dumps(report, indent=2))
    else:
        for info in report:
            print(f"{info['reference']}  ({info['name']})\n  {info['archive']}\n"
                  f"  archive {_mib(info['archive_bytes'])}, "
                  f"unpacked {_mib(info['unpacked_bytes'])}"
                  + (f"\n  imported into {address}" if address else ""))
        print(f"{time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0


def _mib(size: object) -> str:
    return f"{int(size) / 2**20:.1f} MiB"  # type: ignore[call-overload]

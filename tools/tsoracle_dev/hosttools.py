"""The programs the dev cluster and the image builds run, and the Debian package of each.

One table, so that a missing program ends in one line naming what to install (exit code 1),
never in a traceback: `need()` checks before work starts, `run()` turns a program that vanished
since into the same line.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

# Program -> the Debian package(s) that install it (bookworm and trixie alike).
PACKAGES: dict[str, str] = {
    "go": "golang-go",
    "containerd": "containerd",
    "containerd-shim-runc-v2": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "conntrack": "conntrack",
    "iptables": "iptables",
    "ip6tables": "iptables",
    "ip": "iproute2",
    "modprobe": "kmod",
    "openssl": "openssl",
    "debootstrap": "debootstrap",
    "chroot": "coreutils",
    "gcc": "gcc libc6-dev",  # the pause binary is linked statically: libc.a is libc6-dev's
    "tar": "tar",
    "mount": "mount",
    "umount": "mount",
    "runuser": "util-linux",
    "mvn": "maven",
    "initdb": "postgresql",
}
# Where a program is looked for when not on PATH.
PLACES: dict[str, str] = {"initdb": "/usr/lib/postgresql/*/bin"}
# Programs found at a fixed path rather than on PATH.
FILES: dict[Path, str] = {
    Path("/usr/lib/cni/bridge"): "containernetworking-plugins",
    Path("/usr/lib/cni/host-local"): "containernetworking-plugins",
    Path("/usr/lib/cni/loopback"): "containernetworking-plugins",
}
# The Go modules the dev cluster builds (their `go` lines give the oldest Go that builds them).
GO_MODULES = Path(__file__).resolve().parent / "controlplane"


class MissingTool(SystemExit):
    """A program is not installed: the message names its package. A SystemExit, so that any
    command that meets it ends with that one line and exit code 1."""


def _go_line(mod: Path) -> tuple[int, int]:
    match = re.search(r"^go (\d+)\.(\d+)", mod.read_text(), re.MULTILINE)
    return (int(match[1]), int(match[2])) if match else (1, 0)


def go_minimum(modules: Path = GO_MODULES) -> tuple[int, int]:
    """The newest `go X.Y` line among the go.mod files under `modules`."""
    return max([(1, 0), *(_go_line(mod) for mod in modules.glob("*/go.mod"))])


def hint(name: str) -> str:
    """The line that says how to get `name` (a program, or a path of FILES)."""
    if name == "go":
        major, minor = go_minimum()
        want = f"{major}.{minor}"
        return (f"go not found on PATH: put Go {want} or newer on PATH (apt-get install "
                f"golang-go where Debian's is that new; bookworm's is 1.19)")
    if "/" in name:
        package = FILES.get(Path(name))
        return f"{name} not found" + (f": apt-get install {package}" if package else "")
    package = PACKAGES.get(name)
    return (f"{name} not found {'in ' + PLACES[name] if name in PLACES else 'on PATH'}"
            + (f": apt-get install {package}" if package else ""))


def missing(*names: str | Path) -> list[str]:
    """A line per program (or FILES path) of `names` this machine lacks."""
    gone = []
    for name in names:
        if isinstance(name, Path):
            if not name.exists():
                gone.append(hint(str(name)))
        elif shutil.which(name) is None:
            gone.append(hint(name))
    return gone


def need(*names: str | Path) -> None:
    """Raise MissingTool (one line, every missing one) unless all of `names` are here."""
    if gone := missing(*names):
        raise MissingTool("; ".join(gone))


@functools.cache
def go_version() -> str:
    """The `go` on PATH's toolchain (go1.26.8): part of every cached Go binary's key, since a
    new toolchain builds a different binary from the same sources."""
    need("go")
    return run(["go", "env", "GOVERSION"], capture_output=True, text=True).stdout.strip()


def need_go(module: Path | None = None) -> None:
    """Raise MissingTool unless the `go` on PATH can build `module` (a folder with a go.mod;
    default: every module of the dev cluster)."""
    want = _go_line(module / "go.mod") if module else go_minimum()
    version = go_version()
    match = re.search(r"go(\d+)\.(\d+)", version)
    if match and (int(match[1]), int(match[2])) < want:
        raise MissingTool(f"the go on PATH is {version}, and the dev cluster's Go modules need "
                          f"Go {want[0]}.{want[1]} or newer: put a newer Go first on PATH")


def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """subprocess.run, except that a program not on PATH raises MissingTool."""
    try:
        return subprocess.run(argv, **kwargs)
    except FileNotFoundError:
        if shutil.which(argv[0]) is None and not Path(argv[0]).exists():
            raise MissingTool(hint(argv[0])) from None
        raise

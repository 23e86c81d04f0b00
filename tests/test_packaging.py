"""The library's wheel holds the library only; the development tools are a distribution of
their own (tools/pyproject.toml) that works on a checkout, however it was installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tsoracle_dev import find_checkout

ROOT = Path(__file__).resolve().parents[1]
# Building a wheel as pip does fetches setuptools into an isolated environment (from pip's
# cache once it holds it): the tests that build one are not the fast tier.


def _wheel(source: Path, parts: list[str], out: Path) -> zipfile.ZipFile:
    """Build from a copy of `parts` of `source`: setuptools leaves build/ and egg-info behind
    in the tree it builds, which must not be the checkout."""
    tree = out / "src"
    tree.mkdir()
    for part in parts:
        copy = shutil.copytree if (source / part).is_dir() else shutil.copy2
        copy(source / part, tree / part,
             **({"ignore": shutil.ignore_patterns("__pycache__", "build", "*.egg-info")}
                if (source / part).is_dir() else {}))
    # As pip builds it for a user: in an isolated environment with the pyproject's setuptools.
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                           str(out), str(tree)], capture_output=True, text=True, cwd=out)
    assert done.returncode == 0, done.stderr[-3000:]
    [built] = out.glob("*.whl")
    return zipfile.ZipFile(built)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, zipfile.ZipFile]:
    return {"library": _wheel(ROOT, ["pyproject.toml", "README.md", "tsoracle"],
                              tmp_path_factory.mktemp("library")),
            "tools": _wheel(ROOT / "tools", ["pyproject.toml", "tsoracle_dev"],
                            tmp_path_factory.mktemp("tools"))}


def _entry_points(wheel: zipfile.ZipFile) -> str:
    [name] = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    return wheel.read(name).decode()


@pytest.mark.slow
def test_the_library_wheel_holds_no_dev_tools(wheels):
    names = wheels["library"].namelist()
    assert "tsoracle/__init__.py" in names and "tsoracle/catalog/serve.py" in names
    assert not [n for n in names if n.startswith(("tsoracle_dev", "tools/", "tests/"))]
    scripts = _entry_points(wheels["library"])
    assert "tsoracle = tsoracle.cli:main" in scripts and "tsoracle_dev" not in scripts


@pytest.mark.slow
def test_the_tools_wheel_holds_the_tools_and_their_data(wheels):
    names = set(wheels["tools"].namelist())
    assert {"tsoracle_dev/__init__.py", "tsoracle_dev/lincheck/main.go",
            "tsoracle_dev/images/images.toml", "tsoracle_dev/rck/pom.xml"} <= names
    assert any(n.startswith("tsoracle_dev/lincheck/corpus/") for n in names)
    assert not [n for n in names if n.startswith("tsoracle/")]
    assert "tsoracle-dev-cluster = tsoracle_dev.controlplane.cluster:main" \
        in _entry_points(wheels["tools"])


def _import_installed_tools(wheel: zipfile.ZipFile, site: Path, cwd: Path,
                            env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Import tsoracle_dev as a plain (not editable) install would put it: from site-packages,
    nowhere near the checkout."""
    wheel.extractall(site)
    code = "import tsoracle_dev, sys; assert 'site' in tsoracle_dev.__file__; " \
           "print(tsoracle_dev.CHECKOUT)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=cwd, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site),
                                        **env})


@pytest.mark.slow
def test_a_plain_install_of_the_tools_finds_the_checkout_it_runs_in(wheels, tmp_path):
    site = tmp_path / "site"
    inside = _import_installed_tools(wheels["tools"], site, ROOT / "docs", {})
    assert inside.returncode == 0, inside.stderr
    assert Path(inside.stdout.strip()) == ROOT
    outside = _import_installed_tools(wheels["tools"], site, tmp_path, {})
    assert outside.returncode != 0
    assert "works on a checkout of tsoracle" in outside.stderr
    named = _import_installed_tools(wheels["tools"], site, tmp_path,
                                    {"TSORACLE_CHECKOUT": str(ROOT)})
    assert Path(named.stdout.strip()) == ROOT, named.stderr


def test_the_checkout_is_found_in_order(tmp_path):
    def checkout(path: Path) -> Path:
        (path / "charts" / "tsoracle").mkdir(parents=True)
        (path / "charts" / "tsoracle" / "Chart.yaml").write_text("name: tsoracle\n")
        (path / "tools" / "tsoracle_dev").mkdir(parents=True)
        return path

    a, b = checkout(tmp_path / "a"), checkout(tmp_path / "b")
    package = a / "tools" / "tsoracle_dev"
    assert find_checkout(package, b / "docs", None) == a  # the editable install's own
    assert find_checkout(tmp_path / "site" / "tsoracle_dev", b / "tools", None) == b
    assert find_checkout(package, b, str(b)) == b  # named wins
    with pytest.raises(ImportError, match="is not a checkout"):
        find_checkout(package, b, str(tmp_path))
    with pytest.raises(ImportError, match="run it from inside one"):
        find_checkout(tmp_path / "site" / "tsoracle_dev", tmp_path, None)

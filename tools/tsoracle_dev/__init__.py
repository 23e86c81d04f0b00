"""tsoracle's development tools: throwaway PostgreSQL servers and their faults, a local
Kubernetes cluster and its images, the linearizability runs, Iceberg's REST Compatibility Kit,
the dashboards and plots, and the processes the tests start.

A distribution of their own (tools/pyproject.toml, `pip install -e ".[test]" -e ./tools`),
never in the library's wheel: they work on a checkout (the chart, the sources the images are
built from and the state folders .dev-cluster, .lincheck are the checkout's). Nothing in the
`tsoracle` package imports them.
"""

import os
from pathlib import Path


def _is_checkout(path: Path) -> bool:
    return (path / "charts" / "tsoracle" / "Chart.yaml").is_file() \
        and (path / "tools" / "tsoracle_dev").is_dir()


def find_checkout(here: Path, cwd: Path, named: str | None) -> Path:
    """The checkout the tools work on: $TSORACLE_CHECKOUT, else the one this package sits in
    (an editable install), else the working directory's or one of its parents (a plain
    `pip install ./tools`, run from inside a checkout)."""
    if named:
        if not _is_checkout(Path(named)):
            raise ImportError(f"TSORACLE_CHECKOUT={named} is not a checkout of tsoracle "
                              "(no charts/tsoracle/Chart.yaml and tools/tsoracle_dev there)")
        return Path(named).resolve()
    for candidate in (here.parents[1], cwd, *cwd.parents):
        if _is_checkout(candidate):
            return candidate
    raise ImportError("tsoracle_dev works on a checkout of tsoracle: run it from inside one, "
                      "set TSORACLE_CHECKOUT to one, or install it from one with "
                      "`pip install -e ./tools`")


CHECKOUT = find_checkout(Path(__file__).resolve().parent, Path.cwd(),
                         os.environ.get("TSORACLE_CHECKOUT"))

"""The core install works without the optional extras, and a missing extra is one clear line.

Uninstalling kopf, kubernetes, pyspark and grafanalib from the test environment would break the
other tests, so these runs hide them instead: an import hook makes them raise the same
ModuleNotFoundError a machine without them raises. `.ci/run` also installs the core alone into a
fresh virtual environment and runs `tsoracle init`, `ts write` and `status` for real.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

OPTIONAL = ("kopf", "kubernetes", "pyspark", "grafanalib", "matplotlib")

LAUNCHER = """
import sys

class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {hidden!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Absent())
from tsoracle.cli import kubectl_main, main
entry = sys.argv.pop(1)
sys.argv[0] = entry
sys.exit(kubectl_main() if entry == "kubectl-tsoracle" else main(sys.argv[1:]))
"""


def run(tmp_path: Path, entry: str, *args: str) -> subprocess.CompletedProcess[str]:
    launcher = tmp_path / "without_extras.py"
    launcher.write_text(LAUNCHER.format(hidden=OPTIONAL))
    return subprocess.run([sys.executable, str(launcher), entry, *args], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})


@pytest.mark.served  # the CLI in a process of its own
def test_core_commands_need_no_extra(tmp_path):
    for args in (["init"], ["ts", "write"], ["ts", "read"], ["status"],
                 ["flip", "--to", "legacy"], ["ts", "write", "--take-leadership"],
                 ["bench", "--concurrency", "1", "--duration", "0.2"]):
        proc = run(tmp_path, "tsoracle", *args)
        assert proc.returncode == 0, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert (tmp_path / "tsoracle.db").exists()  # the embedded default, in the working folder
    status = run(tmp_path, "tsoracle", "status").stdout
    assert "implementation: legacy" in status


@pytest.mark.served  # the CLI in a process of its own
@pytest.mark.parametrize(("entry", "args", "extra"), [
    ("tsoracle", ["demo"], "spark"),
    ("tsoracle", ["operator"], "operator"),
    ("kubectl-tsoracle", ["status", "oracle"], "operator"),
])
def test_a_missing_extra_is_one_line_naming_it(tmp_path, entry, args, extra):
    proc = run(tmp_path, entry, *args)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"pip install 'tsoracle[{extra}]'" in lines[0]

"""The harness around Apache Iceberg's REST Compatibility Kit (tools/tsoracle_dev/rck): it runs
the kit against Iceberg's own reference server and counts what the kit reports.

The bar every catalog of this project must clear is set by the reference server in the same
run: no failure, and at least as many successes. The jars come from Maven on first use
(`.ci/run` fetches them before the tests).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tsoracle_dev.localpg import free_port
from tsoracle_dev.rck import KIT_CLASSES, reference_server, run_kit

pytestmark = pytest.mark.slow  # two JVMs for about 30 s


def test_the_reference_server_passes_the_kit(tmp_path):
    warehouse = tmp_path / "warehouse"
    with reference_server(warehouse) as url:
        result = run_kit(url, warehouse.as_uri(), report_dir=tmp_path / "reports")
    assert result.failed == 0, result.failures
    assert result.succeeded >= 100, result.summary()
    # Iceberg 1.10.0's kit: 148 tests, of which the reference server's JDBC catalog cannot meet
    # 9 assumptions (names with dots, nested or empty namespaces...).
    assert result.succeeded + result.aborted + result.skipped >= 140
    assert {name.split(".")[0] for name, _ in result.aborts} <= {
        cls.rsplit(".", 1)[1] for cls in KIT_CLASSES}
    assert all(message for _, message in result.aborts)
    assert (tmp_path / "reports" / "TEST-junit-jupiter.xml").exists()  # for CI's viewers
    assert any(warehouse.rglob("*.metadata.json"))  # the server wrote where it was told


def test_an_unreachable_catalog_fails_instead_of_passing_nothing(tmp_path):
    # The kit connects in @BeforeAll: its classes fail as a whole and no test reports. Those
    # failures must count, or a dead catalog would look like one with zero failures.
    result = run_kit(f"http://127.0.0.1:{free_port()}", (tmp_path / "w").as_uri(), timeout=120)
    assert result.succeeded == 0
    assert result.failed == len(KIT_CLASSES)
    assert {name for name, _ in result.failures} == {c.rsplit(".", 1)[1] for c in KIT_CLASSES}
    assert all("Connection refused" in message or "connect" in message.lower()
               for _, message in result.failures), result.failures


def test_the_cli_reports_counts_and_exit_status(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    proc = subprocess.run([sys.executable, "-m", "tsoracle_dev.rck", "run", "--uri", dead,
                           "--warehouse", (tmp_path / "w").as_uri(), "--only", "views"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith("0 succeeded, 1 failed, 0 aborted, 0 skipped"), proc.stdout
    assert "RESTCompatibilityKitViewCatalogTests" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_extra_variables_must_be_catalog_properties(tmp_path):
    with pytest.raises(ValueError, match="CATALOG_URI"):
        run_kit("http://127.0.0.1:1", "w", env={"CATALOG_URI": "http://elsewhere"})
    with pytest.raises(ValueError, match="TOKEN"):
        run_kit("http://127.0.0.1:1", "w", env={"TOKEN": "t"})

"""The harness around Apache Iceberg's REST Compatibility Kit (tools/tsoracle_dev/rck): it runs
the kit against Iceberg's own reference server and counts what the kit reports.

The bar every catalog of this project must clear is set by the reference server in the same
run: no failure, and at least as many successes. The kit's run against that server, and what
the harness reports of it, is tested once, in tests/test_catalog_rck.py. The jars come from
Maven on first use (`.ci/run` fetches them before the tests).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tsoracle_dev.localpg import free_port
from tsoracle_dev.rck import KIT_CLASSES, parse_report, run_kit

slow = pytest.mark.slow  # a JVM (two for the whole kit, about 30 s)


@slow
def test_an_unreachable_catalog_fails_instead_of_passing_nothing(tmp_path):
    # The kit connects in @BeforeAll: its classes fail as a whole and no test reports. Those
    # failures must count, or a dead catalog would look like one with zero failures.
    result = run_kit(f"http://127.0.0.1:{free_port()}", (tmp_path / "w").as_uri(), timeout=120)
    assert result.succeeded == 0
    assert result.failed == len(KIT_CLASSES)
    assert {name for name, _ in result.failures} == {c.rsplit(".", 1)[1] for c in KIT_CLASSES}
    assert all("Connection refused" in message or "connect" in message.lower()
               for _, message in result.failures), result.failures


@slow
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


def test_a_missing_tool_is_one_line_saying_what_to_install(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "java").write_text("#!/bin/sh\nexit 1\n")  # found on PATH; never reached
    (bin_dir / "java").chmod(0o755)
    cache = tmp_path / "cache"  # empty: the jars must be fetched, which needs mvn
    for path, install in ((str(bin_dir), "apt-get install maven"),
                          (str(tmp_path / "nothing"), "apt-get install openjdk-17-jre-headless")):
        proc = subprocess.run([sys.executable, "-m", "tsoracle_dev.rck", "reference"],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PATH": path, "TSORACLE_CACHE": str(cache)})
        assert proc.returncode == 2
        assert proc.stderr.count("\n") == 1 and install in proc.stderr, proc.stderr
    assert not cache.exists() or not any(cache.iterdir())


def test_the_report_tells_skipped_from_aborted_and_counts_failed_containers(tmp_path):
    # The kit never skips a test (nothing in it is @Disabled), so this report is written by
    # hand in the launcher's format: events whose ids link a test to its class.
    report = tmp_path / "open-test-report.xml"
    report.write_text("""<?xml version='1.0' encoding='UTF-8'?>
<e:events xmlns="https://schemas.opentest4j.org/reporting/core/0.2.0"
    xmlns:e="https://schemas.opentest4j.org/reporting/events/0.2.0"
    xmlns:java="https://schemas.opentest4j.org/reporting/java/0.2.0"
    xmlns:junit="https://schemas.junit.org/open-test-reporting">
<e:started id="1" name="JUnit Jupiter"><metadata><junit:type>CONTAINER</junit:type></metadata>
</e:started>
<e:started id="2" name="KitTests" parentId="1"><metadata><junit:type>CONTAINER</junit:type>
</metadata></e:started>
<e:started id="3" name="ok()" parentId="2"><metadata><junit:type>TEST</junit:type></metadata>
</e:started>
<e:finished id="3"><result status="SUCCESSFUL"/></e:finished>
<e:started id="4" name="off()" parentId="2"><metadata><junit:type>TEST</junit:type></metadata>
</e:started>
<e:finished id="4"><result status="SKIPPED"><reason>void off() is @Disabled</reason></result>
</e:finished>
<e:started id="5" name="bad()" parentId="2"><metadata><junit:type>TEST</junit:type></metadata>
</e:started>
<e:finished id="5"><result status="FAILED"><java:throwable type="java.lang.AssertionError"><![CDATA[
java.lang.AssertionError: expected 409
\tat org.example.KitTests.bad(KitTests.java:1)
Caused by: java.io.IOException: reset
\tat org.example.Client.send(Client.java:2)
]]></java:throwable></result></e:finished>
<e:finished id="2"><result status="SUCCESSFUL"/></e:finished>
<e:started id="6" name="ViewTests" parentId="1"><metadata><junit:type>CONTAINER</junit:type>
</metadata></e:started>
<e:finished id="6"><result status="FAILED"><java:throwable><![CDATA[
java.lang.RuntimeException: no catalog]]></java:throwable></result></e:finished>
<e:finished id="1"><result status="SUCCESSFUL"/></e:finished>
</e:events>
""")
    result = parse_report(report)
    assert (result.succeeded, result.failed, result.aborted, result.skipped) == (1, 2, 0, 1)
    assert result.failures == [
        ("KitTests.bad()", "java.lang.AssertionError: expected 409\n"
                           "Caused by: java.io.IOException: reset"),
        ("ViewTests", "java.lang.RuntimeException: no catalog")]

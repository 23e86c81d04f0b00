"""The options of the suite's short-lived JVMs (tsoracle_dev.jvm)."""

from __future__ import annotations

from tsoracle_dev import jvm


def test_short_lived_jvm_options_are_added_once_and_never_a_second_collector():
    assert jvm.with_short_lived(None) == " ".join(jvm.SHORT_LIVED)
    once = jvm.with_short_lived("-Duser.home=/h")
    assert once.split() == [*jvm.SHORT_LIVED, "-Duser.home=/h"]
    assert jvm.with_short_lived(once) == once  # a worker inheriting the controller's
    mine = jvm.with_short_lived("-XX:+UseG1GC -Xss4m")
    assert mine.split() == ["-XX:TieredStopAtLevel=1", "-XX:+UseG1GC", "-Xss4m"]

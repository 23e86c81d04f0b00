"""Options for the JVMs the suite and the dev tools start: short-lived, on a small machine.

A JVM that lives seconds to minutes spends much of its CPU in C2, the optimizing JIT, and the
suite runs two such JVMs beside each other on two cores. C1 alone and the serial collector
halved the Java CPU of tests/test_spark_iceberg_session.py (48 s to 25 s; docs/performance.md,
"CI"). Never for a benchmark's JVM: C2 is what a long-running server gets.
"""

from __future__ import annotations

import re

SHORT_LIVED = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


def with_short_lived(options: str | None) -> str:
    """`options` (a JVM option string such as $SPARK_SUBMIT_OPTS) with what SHORT_LIVED adds
    to it: each option once (xdist's workers inherit what the controller set), and no second
    collector where `options` chose one (the JVM refuses two)."""
    given = (options or "").split()
    own_gc = any(re.fullmatch(r"-XX:\+Use\w+GC", word) for word in given)
    added = [o for o in SHORT_LIVED if o not in given and not (own_gc and o.endswith("GC"))]
    return " ".join([*added, *given])

"""`tsoracle ts apply T` moves a counting timeline at most as far as `tsoracle advance` does
without --force: a typo must not use up the timeline."""

from __future__ import annotations

import pytest

from tests.test_cli import tso
from tsoracle.oracle.advance import MAX_COUNTER_JUMP
from tsoracle.store import U64_MAX

pytestmark = pytest.mark.served

COUNTER = "counter:c"


def _ts(*args: str, url: str, impl: str) -> tuple[int, str, str]:
    leadership = ("--take-leadership",) if impl == "legacy" else ()
    r = tso("ts", *args, "--timeline", COUNTER, *leadership, url=url)
    return r.returncode, r.stdout.strip(), r.stderr.strip()


@pytest.mark.parametrize("impl", ["distributed", "legacy"])
def test_ts_apply_of_the_largest_timestamp_is_refused_and_the_timeline_stays_usable(url, impl):
    # Before the fix, `ts apply 18446744073709551615` succeeded, and every `ts write` after it
    # failed: "timeline 'counter:c' reached the largest timestamp"; nothing moves it back.
    assert tso("init", "--timeline", COUNTER, "--implementation", impl, url=url).returncode == 0
    rc, out, err = _ts("write", url=url, impl=impl)
    assert rc == 0, err
    written = int(out)

    rc, out, err = _ts("apply", str(U64_MAX), url=url, impl=impl)
    assert rc == 1, out
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"more than {MAX_COUNTER_JUMP}" in err
    assert f"tsoracle advance --timeline {COUNTER} --to {U64_MAX} --force" in err

    rc, out, err = _ts("write", url=url, impl=impl)
    assert rc == 0, err
    assert int(out) > written

    # A timestamp write_ts handed out is applied as before, and so is a jump within the bound.
    rc, out, err = _ts("apply", str(written), url=url, impl=impl)
    assert rc == 0 and int(out) >= written, err
    rc, out, err = _ts("peek", url=url, impl=impl)
    within = int(out) + 1000
    rc, out, err = _ts("apply", str(within), url=url, impl=impl)
    assert rc == 0 and int(out) == within, err
    rc, out, err = _ts("write", url=url, impl=impl)
    assert rc == 0 and int(out) > within, err


def test_ts_apply_far_ahead_on_epoch_milliseconds_is_refused_by_the_clock_guard(sqlite_url):
    assert tso("init", url=sqlite_url).returncode == 0
    r = tso("ts", "apply", str(U64_MAX), url=sqlite_url)
    assert r.returncode == 1 and "apply only timestamps that write_ts handed out" in r.stderr
    assert tso("ts", "write", url=sqlite_url).returncode == 0

"""OracleOptions: every bad value is refused in one place, before a connection; no server here."""

from __future__ import annotations

import dataclasses

import pytest

import tsoracle
from tsoracle.oracle.options import DEFAULT_PIPELINE_DEPTH, OracleOptions

# A folder that does not exist: opening a backend there fails with OracleUnavailable, so a
# ConfigError below proves the options were refused before any backend was opened.
NOWHERE = "sqlite:///no/such/folder/tsoracle.db"


def test_the_defaults_are_valid():
    options = OracleOptions()
    assert options.timeline == tsoracle.EPOCH_MILLISECONDS
    assert options.implementation == "distributed"
    assert (options.pool_size, options.pipeline_depth, options.window) == (10, None, 1000)
    assert options.parsed_timeline().wall_clock


@pytest.mark.parametrize("fields, error, message", [
    ({"timeline": "wallclock"}, tsoracle.InvalidTimeline,
     "unknown timeline 'wallclock'; use EpochMilliseconds or counter:<name>, external:<name>, "
     "user:<name>"),
    ({"timeline": 7}, tsoracle.InvalidTimeline, "timeline must be a string, not int"),
    ({"implementation": "fast"}, tsoracle.ConfigError,
     "implementation 'fast' is not one of legacy, distributed"),
    ({"fencing": "Sometimes"}, tsoracle.ConfigError,
     "fencing mode 'Sometimes' is not one of Always, Rollout, Disabled"),
    ({"implementation": "legacy", "read_only": True}, tsoracle.ConfigError,
     "the legacy oracle serves from its leader's memory, so it cannot be read-only; open "
     "read-only clients with implementation='distributed'"),
    ({"pool_size": 0}, tsoracle.ConfigError, "pool_size must be a positive integer, got 0"),
    ({"pool_size": True}, tsoracle.ConfigError, "pool_size must be a positive integer, got True"),
    ({"pool_size": "3"}, tsoracle.ConfigError, "pool_size must be a positive integer, got '3'"),
    ({"pipeline_depth": 0}, tsoracle.ConfigError,
     "pipeline_depth must be an integer from 1 to 16, got 0"),
    ({"pipeline_depth": 17}, tsoracle.ConfigError,
     "pipeline_depth must be an integer from 1 to 16, got 17"),
    ({"pipeline_depth": 2.0}, tsoracle.ConfigError,
     "pipeline_depth must be an integer from 1 to 16, got 2.0"),
])
def test_bad_values_are_refused_with_their_message(fields, error, message):
    with pytest.raises(error) as err:
        OracleOptions(**fields)
    assert str(err.value) == message


def test_messages_name_flags_on_the_command_line():
    with pytest.raises(tsoracle.ConfigError) as err:
        OracleOptions(pipeline_depth=0)
    assert err.value.for_cli() == "--pipeline-depth must be an integer from 1 to 16, got 0"


def test_a_changed_copy_is_checked_again():
    with pytest.raises(tsoracle.ConfigError, match="pool_size must be a positive integer"):
        dataclasses.replace(OracleOptions(), pool_size=-1)


@pytest.mark.parametrize("pool_size, chosen, pinned, depth", [
    (10, "distributed", 2, DEFAULT_PIPELINE_DEPTH),  # room for the default
    (3, "distributed", 2, 1),  # the default shrinks to the room left
    (4, "legacy", 1, 3),
])
def test_the_default_depth_fits_the_pool(pool_size, chosen, pinned, depth):
    assert OracleOptions(pool_size=pool_size).pipeline_depth_for(chosen, pinned, True) == depth


def test_one_connection_needs_no_room():
    # SQLite: one connection shared by everything, nothing is borrowed from a pool.
    assert OracleOptions(pool_size=1).pipeline_depth_for("distributed", 2, False) == 8
    assert OracleOptions(pipeline_depth=16).pipeline_depth_for("distributed", 2, False) == 16


def test_a_pool_the_pinned_connections_would_take_is_refused():
    with pytest.raises(tsoracle.ConfigError) as err:
        OracleOptions(pool_size=2).pipeline_depth_for("distributed", 2, True)
    assert str(err.value) == (
        "pool_size=2 is too small for the distributed oracle: it keeps 2 connection(s) for "
        "batched calls and needs at least one more; use pool_size=3 or more")
    assert err.value.for_cli().endswith("use --pool-size 3 or more")


def test_an_explicit_depth_that_does_not_fit_names_both_ways_out():
    options = OracleOptions(pool_size=5, pipeline_depth=6)
    with pytest.raises(tsoracle.ConfigError) as err:
        options.pipeline_depth_for("distributed", 2, True)
    assert str(err.value) == (
        "pool_size=5 leaves room for 3 batched call(s) in flight besides the 2 connection(s) "
        "the distributed oracle keeps; use pipeline_depth=3 or pool_size=8")
    assert OracleOptions(pool_size=5, pipeline_depth=3).pipeline_depth_for(
        "distributed", 2, True) == 3


async def test_open_oracle_refuses_bad_options_before_connecting():
    with pytest.raises(tsoracle.ConfigError, match="pool_size must be a positive integer"):
        await tsoracle.open_oracle(NOWHERE, pool_size=0)
    with pytest.raises(tsoracle.ConfigError, match="cannot be read-only"):
        async with tsoracle.connect(NOWHERE, implementation="legacy", read_only=True):
            pass
    # Keyword arguments override an options object, and are checked with it.
    with pytest.raises(tsoracle.ConfigError, match="pipeline_depth must be"):
        await tsoracle.open_oracle(NOWHERE, OracleOptions(timeline="counter:x"),
                                   pipeline_depth=99)
    with pytest.raises(TypeError, match="no_such_option"):
        await tsoracle.open_oracle(NOWHERE, no_such_option=1)
    with pytest.raises(tsoracle.OracleUnavailable, match="does not exist"):
        await tsoracle.open_oracle(NOWHERE, OracleOptions(timeline="counter:x"))

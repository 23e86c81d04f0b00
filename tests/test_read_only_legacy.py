"""Read-only opens never lead: on a legacy deployment they are refused before anything durable
changes, so the running leader keeps its timeline."""

from __future__ import annotations

import pytest

import tsoracle

COUNTER = "counter:orders"


async def _positions(url: str) -> tuple[int, int, int, int]:
    """The deployment epoch, and the timeline's legacy leader epoch, stored read_ts and
    reserved upper (a take-over bumps the leader epoch and reserves a window above)."""
    st = await tsoracle.status(url)
    row = next(t for t in st.timelines if t.timeline == COUNTER)
    return st.deployment.epoch, row.leader_epoch, row.read_ts, row.write_ts


async def test_read_only_open_of_a_legacy_deployment_leaves_the_leader_alone(url):
    # Before the fix, implementation=None with read_only=True opened a LegacyOracle: it took
    # the leadership, and the writer's next write_ts raised LeadershipLost.
    await tsoracle.init(url, timelines=[COUNTER], implementation="legacy")
    async with tsoracle.connect(url, timeline=COUNTER, implementation=None) as writer:
        first = (await writer.write_ts()).timestamp
        await writer.apply_write(first)
        before = await _positions(url)

        with pytest.raises(tsoracle.ConfigError) as err:
            await tsoracle.open_oracle(url, timeline=COUNTER, implementation=None,
                                       read_only=True)
        message = str(err.value)
        assert "legacy" in message and "tsoracle flip --to distributed" in message
        assert "leader's process" in message
        with pytest.raises(tsoracle.ConfigError):  # the context-manager form too
            async with tsoracle.connect(url, timeline=COUNTER, implementation=None,
                                        read_only=True):
                pass

        assert await _positions(url) == before  # no leader epoch, epoch or row moved
        second = (await writer.write_ts()).timestamp  # still the leader: no LeadershipLost
        assert second > first
        await writer.apply_write(second)
        await writer.confirm_leadership()
        assert await writer.read_ts() == second


async def test_read_only_open_follows_a_flip_to_distributed(url):
    # What the refusal suggests works: after the flip, the same call opens a reader.
    await tsoracle.init(url, timelines=[COUNTER], implementation="legacy")
    async with tsoracle.connect(url, timeline=COUNTER, implementation=None) as writer:
        w = (await writer.write_ts()).timestamp
        await writer.apply_write(w)
    await tsoracle.flip(url, to="distributed")
    async with tsoracle.connect(url, timeline=COUNTER, implementation=None,
                                read_only=True) as reader:
        assert reader.implementation == "distributed"
        assert await reader.read_ts() >= w
        with pytest.raises(tsoracle.ReadOnly):
            await reader.write_ts()


def test_blocking_read_only_open_of_a_legacy_deployment_is_refused(sqlite_url):
    import asyncio

    asyncio.run(tsoracle.init(sqlite_url, timelines=[COUNTER], implementation="legacy"))
    with pytest.raises(tsoracle.ConfigError, match="tsoracle flip --to distributed"):
        with tsoracle.connect_sync(sqlite_url, timeline=COUNTER, implementation=None,
                                   read_only=True):
            pass
    st = asyncio.run(tsoracle.status(sqlite_url))
    assert next(t for t in st.timelines if t.timeline == COUNTER).leader_epoch == 0

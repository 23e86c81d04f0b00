"""Bad input gets a typed error with a helpful message, never a secret, never an injection."""

from __future__ import annotations

import pytest

import tsoracle
from tsoracle.store import parse_url


@pytest.mark.parametrize("bad", [
    "", "mysql://h/db", "postgresql://", "postgresql://h:notaport/db", "sqlite://",
    "sqlite://remotehost/x.db", "postgresql://h/db?schema=x;drop",
])
async def test_malformed_urls_are_config_errors(bad):
    with pytest.raises(tsoracle.ConfigError):
        await tsoracle.init(bad)


def test_password_never_shown():
    url = parse_url("postgresql://alice:hunter2@db.example:5432/app?password=hunter3")
    assert "hunter2" not in url.safe and "hunter3" not in url.safe
    assert "hunter2" not in repr(url)
    assert url.scrub("boom hunter2") == "boom ***"


async def test_wrong_password(pg):
    url = pg.url(password="not-the-password")
    with pytest.raises(tsoracle.OracleUnavailable, match="password authentication failed") as e:
        await tsoracle.init(url)
    assert "not-the-password" not in str(e.value)


async def test_missing_database(pg):
    url = pg.url(database="no_such_db")
    with pytest.raises(tsoracle.OracleUnavailable, match="no_such_db"):
        await tsoracle.init(url)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_missing_tables_in_read_only_mode(backend, pg, tmp_path):
    url = (f"sqlite:///{tmp_path / 'empty.db'}" if backend == "sqlite"
           else f"{pg.url()}?schema=never_created")
    with pytest.raises(tsoracle.NotInitialized, match="tsoracle init"):
        async with tsoracle.connect(url, read_only=True):
            pass


async def test_unknown_and_invalid_timelines(url):
    await tsoracle.init(url)
    with pytest.raises(tsoracle.UnknownTimeline, match="counter:missing"):
        async with tsoracle.connect(url, timeline="counter:missing"):
            pass
    for bad in ["", "Counter:x", "counter:", "wallclock", "user:\x00x"]:
        with pytest.raises(tsoracle.InvalidTimeline):
            async with tsoracle.connect(url, timeline=bad):
                pass


async def test_sql_looking_timeline_names_are_stored_verbatim(url):
    names = [
        "user:x'); DROP TABLE timestamps; --",
        'external:"; DELETE FROM deployment; --',
        "counter:%(epoch)s {timestamps} ' OR '1'='1",
    ]
    await tsoracle.init(url, timelines=names)
    for name in names:
        async with tsoracle.connect(url, timeline=name) as o:
            w = await o.write_ts()
            await o.apply_write(w.timestamp)
            assert await o.read_ts() == 1
    st = await tsoracle.status(url)
    assert sorted(t.timeline for t in st.timelines) == sorted(names)
    assert st.deployment.epoch == 1


async def test_timeline_mismatch_names_every_timeline():
    assert tsoracle.common_timeline(["counter:a", "counter:a"]) == "counter:a"
    with pytest.raises(tsoracle.TimelineMismatch) as e:
        tsoracle.common_timeline(["counter:a", "EpochMilliseconds", "counter:a", "user:b"])
    for name in ("counter:a", "EpochMilliseconds", "user:b"):
        assert name in str(e.value)


async def test_wrong_implementation_is_fenced_at_open(url):
    await tsoracle.init(url)
    with pytest.raises(tsoracle.Fenced, match="active implementation is 'distributed'"):
        async with tsoracle.connect(url, implementation="legacy"):
            pass
    with pytest.raises(tsoracle.ConfigError):
        async with tsoracle.connect(url, implementation="quantum"):
            pass


async def test_bad_timestamps_are_rejected(url):
    await tsoracle.init(url)
    async with tsoracle.connect(url) as o:
        for bad in (-1, 2**64, "7", 1.5, True):
            with pytest.raises(tsoracle.ConfigError):
                await o.apply_write(bad)


@pytest.mark.parametrize(("url", "schema", "password"), [
    # key=value: `schema=` inside a quoted or escaped password is part of the password
    ("host=h password='x schema=evil ' user=u", "tsoracle", "x schema=evil "),
    ("host=h password=abc\\ schema=bench", "tsoracle", "abc schema=bench"),
    ("host=h dbname=d schema=s1 password=pw", "s1", "pw"),
    # URL: libpq reads + literally; a legitimate @ may sit in the query
    ("postgresql://u:a+b@h/db?schema=s2", "s2", "a+b"),
    ("postgresql://h/db?user=admin@myserver&schema=s3", "s3", ""),
])
def test_locations_parse_by_libpq_rules(url, schema, password):
    parsed = parse_url(url)
    assert (parsed.schema, parsed.password) == (schema, password)
    if password:
        assert password not in parsed.safe


def test_query_values_keep_their_plus_and_spaces():
    parsed = parse_url("postgresql://h/db?application_name=a+b&options=-c%20x%3D1")
    assert "application_name=a+b" in parsed.dsn and "options='-c x=1'" in parsed.dsn


@pytest.mark.parametrize("bad", ["postgresql://u:s@cret@h/db", "host=h port=\u00b2",
                                 "sqlite://[bad/x.db", "host=h password='unterminated"])
def test_more_malformed_locations_are_config_errors(bad):
    with pytest.raises(tsoracle.ConfigError) as err:
        parse_url(bad)
    assert "cret" not in str(err.value) and "unterminated" not in str(err.value)


def test_a_schema_is_added_before_a_fragment():
    from tsoracle.store import has_schema, url_with_schema

    url = url_with_schema("postgresql://u:pw@h/db#frag", "tsoracle_bench")
    assert parse_url(url).schema == "tsoracle_bench"
    assert not has_schema("host=h password='x schema=evil '")
    assert has_schema("host=h schema=a")

"""tsoracle.spark.session: the Spark settings for an Iceberg REST catalog (no Spark needed), and
a session from `iceberg_session` that writes and reads through a real REST catalog, with
pyiceberg reading and writing the same table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tsoracle.spark.session import (
    CATALOG_CLASS,
    EXTENSIONS,
    ICEBERG_VERSION,
    JAR_ENV,
    RUNTIME_PACKAGE,
    iceberg_conf,
)

ROOT = Path(__file__).resolve().parent.parent
URI = "http://127.0.0.1:8181"
TOKEN = "spark-test-t0ken-4f1c"


@pytest.fixture
def no_jar_env(monkeypatch):
    """The settings tests run as if no downloaded jar were configured on this machine."""
    monkeypatch.delenv(JAR_ENV, raising=False)


def test_conf_names_the_rest_catalog_and_the_pinned_runtime(no_jar_env):
    conf = iceberg_conf(URI)
    assert conf == {
        "spark.sql.extensions": EXTENSIONS,
        "spark.sql.catalog.tso": CATALOG_CLASS,
        "spark.sql.catalog.tso.type": "rest",
        "spark.sql.catalog.tso.uri": URI,
        "spark.sql.catalog.tso.cache-enabled": "false",
        "spark.jars.packages": RUNTIME_PACKAGE,
    }
    assert RUNTIME_PACKAGE == (
        f"org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:{ICEBERG_VERSION}")


def test_conf_token_warehouse_and_catalog_name(no_jar_env):
    conf = iceberg_conf(URI, catalog_name="lake", token="t0ken", warehouse="s3://bucket/wh")
    assert conf["spark.sql.catalog.lake"] == CATALOG_CLASS
    assert conf["spark.sql.catalog.lake.token"] == "t0ken"
    assert conf["spark.sql.catalog.lake.token-refresh-enabled"] == "false"
    assert conf["spark.sql.catalog.lake.warehouse"] == "s3://bucket/wh"
    assert not any(k.startswith("spark.sql.catalog.tso") for k in conf)


def test_conf_takes_a_downloaded_jar_from_the_argument_or_the_environment(tmp_path, monkeypatch,
                                                                        no_jar_env):
    jar = tmp_path / "iceberg-runtime.jar"
    jar.write_bytes(b"PK")
    conf = iceberg_conf(URI, jar=jar)
    assert conf["spark.jars"] == str(jar) and "spark.jars.packages" not in conf
    monkeypatch.setenv(JAR_ENV, str(jar))
    conf = iceberg_conf(URI)
    assert conf["spark.jars"] == str(jar) and "spark.jars.packages" not in conf
    monkeypatch.setenv(JAR_ENV, str(tmp_path / "missing.jar"))
    with pytest.raises(FileNotFoundError, match=JAR_ENV):
        iceberg_conf(URI)


@pytest.mark.parametrize("kwargs, match", [
    ({"catalog_uri": "thrift://metastore:9083"}, "http"),
    ({"catalog_uri": URI, "catalog_name": "a.b"}, "identifier"),
    ({"catalog_uri": URI, "token": ""}, "token"),
])
def test_conf_rejects_bad_input(kwargs, match, no_jar_env):
    with pytest.raises(ValueError, match=match):
        iceberg_conf(**kwargs)


def test_conf_errors_never_carry_the_token(tmp_path):
    with pytest.raises(FileNotFoundError) as caught:
        iceberg_conf(URI, token="s3cr3t", jar=tmp_path / "missing.jar")
    assert "s3cr3t" not in str(caught.value)


# --- The REST catalog the Spark test talks to: tsoracle's own, on SQLite ----------------------

@pytest.fixture(scope="module")
def rest_catalog_uri(tmp_path_factory: pytest.TempPathFactory):
    import asyncio

    import tsoracle
    from tsoracle.catalog.serve import CatalogConfig, RunningCatalog

    home = tmp_path_factory.mktemp("catalog")
    url = f"sqlite:///{home / 'oracle.db'}"
    asyncio.run(tsoracle.init(url))
    with RunningCatalog(CatalogConfig(url=url, warehouse=str(home / "warehouse"), port=0,
                                      token=TOKEN)) as running:
        yield running.url


# --- Spark ---------------------------------------------------------------------------------------
# Each Spark half runs in a Python process of its own: the suite's session-wide `spark` fixture
# is a SparkSession without Iceberg, and a process's Spark keeps the jars it started with.


def _spark_round_trip(uri: str) -> dict[str, object]:
    from tsoracle.spark.session import iceberg_session

    spark = iceberg_session(uri, token=TOKEN)
    spark.sparkContext.setLogLevel("ERROR")
    conf_text = spark.sparkContext.getConf().toDebugString() + "\n".join(
        f"{k}={v}" for k, v in spark.sql("SET").collect())
    seen = sorted(tuple(r) for r in spark.sql("SELECT id, v FROM tso.rt.t").collect())
    spark.createDataFrame([(2, "b"), (3, "c")], "id BIGINT, v STRING").writeTo("tso.rt.t").append()
    spark.createDataFrame([(3, "C"), (4, "d")], "id BIGINT, v STRING").createOrReplaceTempView("s")
    spark.sql("MERGE INTO tso.rt.t t USING s ON t.id = s.id "
              "WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *")
    spark.sql("DELETE FROM tso.rt.t WHERE id = 2")
    first = spark.sql("SELECT snapshot_id FROM tso.rt.t.snapshots ORDER BY committed_at") \
        .first().snapshot_id
    as_of_first = sorted(tuple(r) for r in
                         spark.sql(f"SELECT id, v FROM tso.rt.t VERSION AS OF {first}").collect())
    spark.stop()
    return {"seen": seen, "as_of_first": as_of_first, "token_shown": TOKEN in conf_text}


def _spark_after_a_plain_session(uri: str) -> dict[str, object]:
    from pyspark.sql import SparkSession

    from tsoracle.spark.session import iceberg_session

    plain = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false") \
        .getOrCreate()
    refused = []
    for _ in range(2):  # with the plain session running, then after it stopped
        try:
            iceberg_session(uri)
        except RuntimeError as exc:
            refused.append(str(exc))
        plain.stop()
    return {"refused": refused}


def _in_own_process(function: str, uri: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "tools"), os.environ.get("PYTHONPATH", "")])}
    code = ("import json, sys; from tests import test_spark_iceberg_session as t; "
            f"print(json.dumps(t.{function}(sys.argv[1])))")
    run = subprocess.run([sys.executable, "-c", code, uri], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    # Java's stack frames would bury the message.
    assert run.returncode == 0, "\n".join(
        line for line in run.stderr.splitlines()
        if not line.lstrip().startswith(("at ", "... ")))[-4000:]
    assert TOKEN not in run.stdout + run.stderr
    return dict(json.loads(run.stdout.strip().splitlines()[-1]))


@pytest.mark.spark
def test_session_round_trips_a_table_with_pyiceberg(rest_catalog_uri):
    import pyarrow as pa
    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    catalog = RestCatalog("tso", uri=rest_catalog_uri, token=TOKEN)
    catalog.create_namespace("rt")
    table = catalog.create_table("rt.t", Schema(NestedField(1, "id", LongType()),
                                                NestedField(2, "v", StringType())))
    table.append(pa.table({"id": pa.array([1], pa.int64()), "v": ["a"]}))

    spark = _in_own_process("_spark_round_trip", rest_catalog_uri)
    assert spark["token_shown"] is False
    assert spark["seen"] == [[1, "a"]]  # Spark reads what pyiceberg wrote
    assert spark["as_of_first"] == [[1, "a"]]
    rows = catalog.load_table("rt.t").scan().to_arrow().sort_by("id").to_pylist()
    assert rows == [{"id": 1, "v": "a"}, {"id": 3, "v": "C"}, {"id": 4, "v": "d"}]


@pytest.mark.spark
def test_session_refuses_a_process_whose_spark_started_without_iceberg(rest_catalog_uri):
    refused = _in_own_process("_spark_after_a_plain_session", rest_catalog_uri)["refused"]
    assert isinstance(refused, list) and len(refused) == 2
    assert all("started without Iceberg" in message for message in refused)

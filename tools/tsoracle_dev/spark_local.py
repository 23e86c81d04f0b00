"""A local Spark session and an oracle client on a fresh SQLite oracle, for the Spark benches."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import tsoracle
from tsoracle.spark import OracleClient


def local_spark_client(prefix: str) -> tuple[Any, OracleClient, Path]:
    """(Spark session, client, working folder); the caller closes the client and stops Spark."""
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(tempfile.mkdtemp(prefix=prefix))
    url = f"sqlite:///{work / 'oracle.db'}"
    asyncio.run(tsoracle.init(url))
    return spark, OracleClient(url, data_dir=work / "tables"), work

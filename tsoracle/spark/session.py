"""A SparkSession on an Iceberg REST catalog: the settings, pinned to one Iceberg runtime.

`iceberg_conf` is the pure part (the Spark settings as a dict, unit-tested); `iceberg_session`
starts local or cluster Spark with them. PySpark is imported only inside `iceberg_session`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Iceberg ships one runtime jar per Spark minor and Scala version; pyproject's `spark` extra pins
# PySpark to SPARK_MINOR. 1.12.0 is the newest runtime for Spark 4.1 (the 4.0 one ends at 1.11.0).
ICEBERG_VERSION = "1.12.0"
SPARK_MINOR = "4.1"
SCALA_VERSION = "2.13"
RUNTIME_PACKAGE = (f"org.apache.iceberg:iceberg-spark-runtime-{SPARK_MINOR}_{SCALA_VERSION}:"
                   f"{ICEBERG_VERSION}")
# A downloaded runtime jar, for pods and machines that cannot reach Maven Central.
JAR_ENV = "TSORACLE_ICEBERG_JAR"

CATALOG_CLASS = "org.apache.iceberg.spark.SparkCatalog"
EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"


def iceberg_conf(catalog_uri: str, *, catalog_name: str = "tso", token: str | None = None,
                 warehouse: str | None = None, jar: str | os.PathLike[str] | None = None
                 ) -> dict[str, str]:
    """Spark settings for catalog `catalog_name` on the REST catalog at `catalog_uri`.

    The runtime comes from `jar` or $TSORACLE_ICEBERG_JAR (`spark.jars`) when either is set, else
    from Maven (`spark.jars.packages`, cached by Ivy). The result holds `token` in clear text:
    hand it to Spark, never to a log (Spark itself redacts keys that contain "token").
    """
    if not catalog_uri.startswith(("http://", "https://")):
        raise ValueError("catalog_uri must be the http:// or https:// URL of a REST catalog")
    if not catalog_name.isidentifier():
        raise ValueError(f"catalog_name must be a plain identifier, got {catalog_name!r}")
    prefix = f"spark.sql.catalog.{catalog_name}"
    conf = {
        "spark.sql.extensions": EXTENSIONS,
        prefix: CATALOG_CLASS,
        f"{prefix}.type": "rest",
        f"{prefix}.uri": catalog_uri,
        # Iceberg's Spark catalog caches loaded tables (30 s by default) and serves reads from
        # the cached metadata: a read at a timestamp the oracle just handed out would miss the
        # commits the cache has not seen. Every load asks the catalog instead.
        f"{prefix}.cache-enabled": "false",
    }
    if token is not None:
        if not token:
            raise ValueError("token must not be empty (pass None for no authentication)")
        conf[f"{prefix}.token"] = token
        # A static bearer token: without this the client may try to exchange or refresh it at
        # the OAuth2 token endpoint, which the catalog need not serve.
        conf[f"{prefix}.token-refresh-enabled"] = "false"
    if warehouse is not None:
        conf[f"{prefix}.warehouse"] = warehouse
    source = "jar"
    if jar is None:
        jar, source = os.environ.get(JAR_ENV) or None, JAR_ENV
    if jar is not None:
        path = Path(jar)
        if not path.is_file():
            raise FileNotFoundError(
                f"{source} names {path}, which is not a file: download {RUNTIME_PACKAGE} there, "
                f"or unset it to let Spark fetch the runtime from Maven")
        conf["spark.jars"] = str(path.resolve())
    else:
        conf["spark.jars.packages"] = RUNTIME_PACKAGE
    return conf


def iceberg_session(catalog_uri: str, *, catalog_name: str = "tso", token: str | None = None,
                    warehouse: str | None = None, app_name: str = "tsoracle",
                    master: str | None = None, jar: str | os.PathLike[str] | None = None,
                    extra_conf: dict[str, str] | None = None) -> SparkSession:
    """Start (or join) a SparkSession whose catalog `catalog_name` is the REST catalog.

    `master` defaults to local[2] unless spark-submit already chose one. Settings in
    `extra_conf` win over the defaults here. Spark fixes its jars and extensions when this
    process starts its JVM: after a SparkSession without Iceberg (even a stopped one), this
    raises RuntimeError; Iceberg sessions need the first session of their process.
    """
    from pyspark import SparkContext
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    conf = {
        # The conventions of the project's local Spark: no UI, no progress bars, two shuffle
        # partitions for the small tables of tests and demos.
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        **iceberg_conf(catalog_uri, catalog_name=catalog_name, token=token,
                       warehouse=warehouse, jar=jar),
        **(extra_conf or {}),
    }
    builder = SparkSession.builder.appName(app_name)
    running = SparkContext._active_spark_context
    if master is not None:
        builder = builder.master(master)
    elif running is None and "spark.master" not in conf and not _master_chosen():
        builder = builder.master("local[2]")
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    except PySparkRuntimeError as exc:
        if exc.getCondition() != "JAVA_GATEWAY_EXITED" or "spark.jars.packages" not in conf:
            raise
        raise RuntimeError(
            f"Spark did not start (its output above says why); if it could not fetch "
            f"{RUNTIME_PACKAGE} from Maven, download that jar and name it in ${JAR_ENV}") from exc
    if not _has_iceberg(session):
        if running is None:
            session.stop()  # started here, and of no use without Iceberg
        raise RuntimeError(
            "this process's Spark started without Iceberg (an earlier SparkSession without "
            "iceberg_conf's settings): Spark fixes its jars and extensions when its JVM starts, "
            "so run Iceberg sessions in a process of their own, or give the first session "
            "iceberg_conf's settings")
    return session


def _has_iceberg(session: SparkSession) -> bool:
    """Whether the session's JVM can load Iceberg's catalog and its SQL extensions are on."""
    extensions = session.sparkContext.getConf().get("spark.sql.extensions") or ""
    jvm = session.sparkContext._jvm
    assert jvm is not None  # a started SparkContext has its gateway
    return EXTENSIONS in extensions and bool(
        jvm.org.apache.spark.util.Utils.classIsLoadable(CATALOG_CLASS))


def _master_chosen() -> bool:
    """Whether spark-submit (or PYSPARK_SUBMIT_ARGS) already chose this driver's master."""
    # spark-submit starts the JVM first and hands Python its gateway port.
    return "PYSPARK_GATEWAY_PORT" in os.environ or "--master" in os.environ.get(
        "PYSPARK_SUBMIT_ARGS", "")

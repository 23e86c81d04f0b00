"""Top floor: Spark drivers on the configured oracle. Uses oracle/ (and operator/ for discovery).

PySpark is imported only by `tsoracle.spark.table` and inside `iceberg_session`, so the client
and the Iceberg settings work without it.
"""

from tsoracle.spark.client import OracleClient
from tsoracle.spark.session import ICEBERG_VERSION, RUNTIME_PACKAGE, iceberg_conf, iceberg_session

__all__ = ["ICEBERG_VERSION", "RUNTIME_PACKAGE", "OracleClient", "iceberg_conf", "iceberg_session"]

"""Top floor: Spark drivers on the configured oracle. Uses oracle/ (and operator/ for discovery).

PySpark is imported only by `tsoracle.spark.table`, so the client works without it.
"""

from tsoracle.spark.client import OracleClient

__all__ = ["OracleClient"]

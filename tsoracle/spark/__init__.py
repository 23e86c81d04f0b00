"""Top floor: Spark drivers on the configured oracle. Uses oracle/ (and operator/ for discovery).

Tables are Iceberg tables in tsoracle's catalog (`Lakehouse`). PySpark is imported only inside
`iceberg_session` and the Lakehouse's methods, so the client and the settings work without it.
"""

from tsoracle.spark.client import OracleClient
from tsoracle.spark.lakehouse import (
    AsOf,
    CatalogUnavailable,
    Cut,
    HistoryExpired,
    Lakehouse,
    TableExists,
    TableNotFound,
)
from tsoracle.spark.session import ICEBERG_VERSION, RUNTIME_PACKAGE, iceberg_conf, iceberg_session

__all__ = ["ICEBERG_VERSION", "RUNTIME_PACKAGE", "AsOf", "CatalogUnavailable", "Cut",
           "HistoryExpired", "Lakehouse", "OracleClient", "TableExists", "TableNotFound",
           "iceberg_conf", "iceberg_session"]

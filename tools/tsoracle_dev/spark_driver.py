"""A Spark driver process for tests: appends batches, then prints what it committed.

    python -m tsoracle_dev.spark_driver URL DATA_DIR WRITER BATCHES ROWS
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession

from tsoracle.spark import OracleClient

SCHEMA = "writer INT, seq INT"


def main() -> None:
    url, data_dir, writer, batches, rows = sys.argv[1:6]
    spark = (SparkSession.builder.master("local[1]").appName(f"driver-{writer}")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "1").getOrCreate())
    stamps = []
    with OracleClient(url, data_dir=data_dir) as client:
        table = client.table(spark, "shared")
        for b in range(int(batches)):
            df = spark.createDataFrame([(int(writer), b * int(rows) + i)
                                        for i in range(int(rows))], SCHEMA)
            ts = table.append(df)
            # Visible to this driver's next linearized read, at once.
            seen = table.read().where(f"writer = {writer}").count()
            assert seen == (b + 1) * int(rows), (seen, b)
            stamps.append(ts)
    spark.stop()
    print(json.dumps({"stamps": stamps}))


if __name__ == "__main__":
    main()

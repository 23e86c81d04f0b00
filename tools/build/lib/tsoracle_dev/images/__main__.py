"""Build the dev cluster's image archives (pause, operator), cached; optionally import them.

    tsoracle-images [--spark] [--import] [--containerd-address SOCKET] [-o text|json]
    (or: python -m tsoracle_dev.images ...)

--spark also builds the Spark image (tsoracle-spark: a JRE and pyspark, for Spark on
Kubernetes); it is left out by default so that `make images` stays fast.

Without --containerd-address, --import uses the dev cluster's containerd (its cluster.json).
See __init__.py for the Python API and images.toml for the recipes.
"""

from __future__ import annotations

import sys

from tsoracle_dev.images import main

if __name__ == "__main__":
    sys.exit(main())

"""Build the dev cluster's image archives (pause, operator), cached; optionally import them.

    python tools/images/build.py [--spark] [--import] [--containerd-address SOCKET]
                                 [-o text|json]

--spark also builds the Spark image (tsoracle-spark: a JRE and pyspark, for Spark on
Kubernetes); it is left out by default so that `make images` stays fast.

Without --containerd-address, --import uses the dev cluster's containerd (its cluster.json).
See images.py for the Python API and images.toml for the recipes.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from images import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

"""Build the dev cluster's image archives (pause, operator), cached; optionally import them.

    python tools/images/build.py [--import] [--containerd-address SOCKET] [-o text|json]

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

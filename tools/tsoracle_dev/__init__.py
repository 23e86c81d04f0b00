"""tsoracle's development tools: throwaway PostgreSQL servers and their faults, a local
Kubernetes cluster and its images, the linearizability runs, Iceberg's REST Compatibility Kit,
the dashboards and plots, and the processes the tests start.

They work on a checkout, installed with `pip install -e ".[test]"`: the chart, the sources the
images are built from and the state folders (.dev-cluster, .lincheck) are the checkout's.
Nothing in the `tsoracle` package imports them.
"""

from pathlib import Path

# The checkout this package sits in (tools/tsoracle_dev/).
CHECKOUT = Path(__file__).resolve().parents[2]

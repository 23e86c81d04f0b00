"""A one-node cluster of the test module's own (tsoracle_dev.controlplane with its node)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from tsoracle_dev.controlplane.cluster import ControlPlane
from tsoracle_dev.controlplane.node import missing_prerequisites
from tsoracle_dev.kube import Kube
from tsoracle_dev.kubetools import tools_dir


@contextmanager
def own_node(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[SimpleNamespace]:
    """Start it (purged afterwards, also if this process is killed); yields the Kube helper,
    the environment a user's shell would have (KUBECONFIG, the venv's and kubectl's PATH) and
    the ControlPlane."""
    problems = missing_prerequisites()
    assert not problems, "; ".join(problems)  # CI installs them: a missing one is a failure
    state = tmp_path_factory.mktemp(name) / "state"
    plane = ControlPlane(state, node=True)
    plane.purge_when_this_process_exits()
    kubeconfig = plane.up()
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "TSORACLE_DEV_CLUSTER_STATE": str(state),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), str(tools_dir()),
                                    os.environ["PATH"]])}
    try:
        yield SimpleNamespace(kube=Kube(kubeconfig, tools_dir(), plane=plane), env=env,
                              plane=plane, state=state,
                              pg_url=str(plane.info()["postgres_url"]))
    finally:
        plane.down(purge=True)

"""Second floor: durable epochs, fencing modes, legacy leadership. Uses store/ only."""

from tsoracle.fencing.coalesce import Coalescer
from tsoracle.fencing.leader import Leadership, Start
from tsoracle.fencing.modes import (
    GUARD,
    IMPLEMENTATIONS,
    MODES,
    Deployment,
    check_implementation,
    check_mode,
    confirms_reads,
    finish_rollout,
    lock_deployment,
    moved,
    read_deployment,
    set_fencing,
    superseded,
)

__all__ = [
    "GUARD",
    "IMPLEMENTATIONS",
    "MODES",
    "Coalescer",
    "Deployment",
    "Leadership",
    "Start",
    "check_implementation",
    "check_mode",
    "confirms_reads",
    "finish_rollout",
    "lock_deployment",
    "moved",
    "read_deployment",
    "set_fencing",
    "superseded",
]

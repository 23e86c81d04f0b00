"""Second floor: durable epochs, fencing modes, legacy leadership. Uses store/ only."""

from tsoracle.fencing.leader import Leadership, Start
from tsoracle.fencing.modes import (
    IMPLEMENTATIONS,
    MODE_ALIASES,
    MODE_WARNINGS,
    MODES,
    Deployment,
    check_implementation,
    check_mode,
    confirms_reads,
    count_pass,
    fence_everyone,
    finish_rollout,
    lock_deployment,
    moved,
    parse_mode,
    read_deployment,
    record_generation,
    set_fencing,
    superseded,
)
from tsoracle.fencing.tables import ensure_tables, tables_exist

__all__ = [
    "IMPLEMENTATIONS",
    "MODE_ALIASES",
    "MODE_WARNINGS",
    "MODES",
    "Deployment",
    "Leadership",
    "Start",
    "ensure_tables",
    "tables_exist",
    "check_implementation",
    "check_mode",
    "confirms_reads",
    "count_pass",
    "fence_everyone",
    "finish_rollout",
    "lock_deployment",
    "moved",
    "parse_mode",
    "read_deployment",
    "record_generation",
    "set_fencing",
    "superseded",
]

"""Third floor: the TimestampOracle API and its implementations. Uses fencing/ and store/."""

from tsoracle.oracle.advance import (
    AdvanceResult,
    advance_timeline,
    advance_timelines,
    positions,
)
from tsoracle.oracle.api import TimestampOracle, WriteTimestamp
from tsoracle.oracle.connect import (
    advance,
    connect,
    finish_rollout,
    flip,
    init,
    open_oracle,
    set_fencing,
    status,
)
from tsoracle.oracle.flip import FlipResult
from tsoracle.oracle.group_commit import CommitInterrupted, GroupCommitter
from tsoracle.oracle.metrics import serve_metrics
from tsoracle.oracle.options import OracleOptions
from tsoracle.oracle.sync import SyncTimestampOracle, connect_sync, open_sync
from tsoracle.oracle.timeline import EPOCH_MILLISECONDS, Timeline, common_timeline, parse_timeline

__all__ = [
    "EPOCH_MILLISECONDS",
    "AdvanceResult",
    "FlipResult",
    "CommitInterrupted",
    "GroupCommitter",
    "OracleOptions",
    "SyncTimestampOracle",
    "Timeline",
    "TimestampOracle",
    "WriteTimestamp",
    "advance",
    "advance_timeline",
    "advance_timelines",
    "common_timeline",
    "connect",
    "connect_sync",
    "finish_rollout",
    "flip",
    "init",
    "open_oracle",
    "open_sync",
    "parse_timeline",
    "positions",
    "serve_metrics",
    "set_fencing",
    "status",
]

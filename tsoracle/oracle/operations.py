"""The oracle's operations, declared once.

`TimestampOracle` implements each as a method of the same name; the metrics, the blocking
facade (`SyncTimestampOracle`), the Spark driver's `OracleClient`, the reopening wrapper and
`tsoracle ts` follow this list, and tests/test_seams.py fails if one of them misses an entry.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Operation:
    name: str  # the method, and the `operation` label of the metrics
    command: str  # `tsoracle ts <command>`
    writes: bool  # refused by an oracle opened read_only
    takes_ts: bool  # called with a timestamp
    help: str


OPERATIONS = (
    Operation("write_ts", "write", True, False, "allocate a write timestamp"),
    Operation("peek_write_ts", "peek", False, False, "the latest write timestamp, unallocated"),
    Operation("read_ts", "read", False, False, "a timestamp covering every applied write"),
    Operation("apply_write", "apply", True, True, "mark writes at T complete"),
    Operation("confirm_leadership", "confirm", False, False,
              "check that this process may still serve the timeline"),
)
NAMES = tuple(op.name for op in OPERATIONS)
BY_COMMAND = {op.command: op for op in OPERATIONS}

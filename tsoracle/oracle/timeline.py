"""Timelines: what a timestamp means. One oracle state per timeline; timelines never mix."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tsoracle.errors import InvalidTimeline, TimelineMismatch

EPOCH_MILLISECONDS = "EpochMilliseconds"
PREFIXES = ("counter:", "external:", "user:")
MAX_NAME = 255


@dataclass(frozen=True)
class Timeline:
    name: str

    @property
    def wall_clock(self) -> bool:
        """Write timestamps track the wall clock on EpochMilliseconds; elsewhere they count."""
        return self.name == EPOCH_MILLISECONDS


def parse_timeline(name: object) -> Timeline:
    """Validate a timeline name; the part after the prefix is stored verbatim."""
    if not isinstance(name, str):
        raise InvalidTimeline(f"timeline must be a string, not {type(name).__name__}")
    if name == EPOCH_MILLISECONDS:
        return Timeline(name)
    prefix = next((p for p in PREFIXES if name.startswith(p)), None)
    if prefix is None or len(name) == len(prefix):
        raise InvalidTimeline(
            f"unknown timeline {name!r}; use {EPOCH_MILLISECONDS} or counter:<name>, "
            "external:<name>, user:<name>"
        )
    if len(name) > MAX_NAME or any(ord(c) < 32 for c in name):
        raise InvalidTimeline(
            f"timeline name {name[:40]!r}… must be at most {MAX_NAME} printable characters"
        )
    return Timeline(name)


def common_timeline(timelines: Iterable[str]) -> str:
    """The one timeline shared by all inputs of a read; TimelineMismatch names them otherwise."""
    names = [parse_timeline(t).name for t in timelines]
    if not names:
        raise InvalidTimeline("a read needs at least one input to pick its timeline")
    if len(set(names)) > 1:
        raise TimelineMismatch(names)
    return names[0]

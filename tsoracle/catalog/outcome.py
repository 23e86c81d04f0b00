"""What became of one attempt of a commit, as one of four types. The commit loop retries only
a `Conflict`; the others answer the request (a refusal or an unknown outcome with its error,
whose type carries the REST spec's status: errors.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tsoracle.catalog.errors import CommitStateUnknown


@dataclass(frozen=True)
class Landed:
    """Committed at its W and applied: the result to answer with."""

    result: Any


@dataclass(frozen=True)
class Conflict:
    """Nothing landed because of another commit (its W fell behind, its table moved, what it
    was built on did not land): the same request may land at a fresh W."""

    reason: str


@dataclass(frozen=True)
class Failed:
    """Refused: nothing landed, and the same request would be refused again."""

    error: BaseException


@dataclass(frozen=True)
class Unknown:
    """It may have landed (the database or the oracle did not confirm): never retried."""

    error: CommitStateUnknown


Outcome = Landed | Conflict | Failed | Unknown

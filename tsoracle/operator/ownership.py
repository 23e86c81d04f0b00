"""Which resource owns a backend schema, and when a reconcile must not touch it (pure rules).

A deployment row records its owner (`<namespace>/<name>/<uid>` of the TimestampOracle that
provisioned or adopted it) and its incarnation; the resource's status records the incarnation
and epoch it last saw. The operator re-seeds nothing it cannot account for: a schema that went
missing or changed incarnation means the Secret now points somewhere else (or the data was
dropped), and handing out timestamps from a fresh row would repeat ones already handed out. The
same deployment gone back in time (restored) is moved forward instead: see `model.rewind_targets`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tsoracle.errors import ConfigError
from tsoracle.fencing import Deployment


class OwnershipProblem(ConfigError):
    """The backend does not hold what this resource provisioned, or holds someone else's."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Owner:
    namespace: str
    name: str
    uid: str

    @property
    def tag(self) -> str:
        return f"{self.namespace}/{self.name}/{self.uid}"


_START_OVER = ("nothing was re-created and clients stay fenced; point the Secret back at the "
               "original database, or, to start a new timeline there (timestamps restart), "
               "delete this TimestampOracle and create it again")


def check_ownership(found: Deployment | None, owner: Owner, schema: str,
                    status: Mapping[str, Any]) -> None:
    """Raise OwnershipProblem unless this pass may provision or use `found`."""
    # An epoch below the published one, same incarnation, is this deployment restored to an
    # earlier point: the rewind repair moves it forward (model.rewind_targets).
    known = str(status.get("incarnation") or "")
    if found is None:
        if known:
            raise OwnershipProblem(
                "BackendChanged",
                f"the backend has no tsoracle deployment in schema {schema!r}, but this "
                f"resource provisioned one there (incarnation {known}); the Secret may point at "
                f"another database, or the tables were dropped; {_START_OVER}")
        return
    if found.owner and found.owner != owner.tag:
        ns, _, rest = found.owner.partition("/")
        name = rest.partition("/")[0]
        same_name = (ns, name) == (owner.namespace, owner.name)
        raise OwnershipProblem(
            "SchemaInUse",
            f"schema {schema!r} belongs to TimestampOracle {ns}/{name}"
            + (" (an earlier resource of this name, deleted while its deletion could not "
               "reach the backend)" if same_name else "")
            + "; give this resource a schema of its own (spec.backend.schema)")
    if known and found.incarnation != known:
        raise OwnershipProblem(
            "BackendChanged",
            f"schema {schema!r} holds incarnation {found.incarnation or '-'}, not the "
            f"incarnation {known} this resource provisioned; {_START_OVER}")

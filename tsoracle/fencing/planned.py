"""Who planned a durable step, so that the database refuses it once the planner is out of date.

The operator plans a pass from what it read, then acts; between the two it may be paused (a
slow node, SIGSTOP, a long GC) while its resource is deleted and another resource adopts the
schema, or while a newer generation of the same resource is applied. Every durable step of a
pass names its planner, and each is checked under the deployment row's lock, in the
transaction that acts.
"""

from __future__ import annotations

from dataclasses import dataclass

from tsoracle.errors import OracleError


@dataclass(frozen=True)
class PlannedBy:
    """The resource (its owner tag, `<namespace>/<name>/<uid>`) and the generation of it that
    planned a step."""

    owner: str
    generation: int

    def refusal(self, owner: str, generation: int) -> str | None:
        """Why a deployment now owned by `owner` at `generation` refuses this planner's steps;
        None when it accepts them. Adoption gives the new owner a generation space of its own:
        no generation of an earlier owner enters it."""
        if owner != self.owner:
            return (f"the schema now belongs to {_resource(owner)}, not to "
                    f"{_resource(self.owner)}, which planned it")
        if self.generation < generation:
            return (f"this pass read generation {self.generation}, and the backend already "
                    f"applied generation {generation}")
        return None


class StalePlan(OracleError):
    """A step planned by a resource generation, or a resource, the deployment no longer
    follows: nothing was changed; the next pass plans again from what is."""


def _resource(tag: str) -> str:
    """`ns/name/uid` as a person reads it: a resource created again under its name has a new
    uid, and the uid is what tells the two apart."""
    parts = tag.split("/")
    if len(parts) < 3:
        return "nobody"
    return f"TimestampOracle {parts[0]}/{parts[1]} (uid {'/'.join(parts[2:])})"

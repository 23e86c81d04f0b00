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
                    f"{_resource(self.owner)} (uid {_uid(self.owner)}), which planned it")
        if self.generation < generation:
            return (f"this pass read generation {self.generation}, and the backend already "
                    f"applied generation {generation}")
        return None


class StalePlan(OracleError):
    """A step planned by a resource generation, or a resource, the deployment no longer
    follows: nothing was changed; the next pass plans again from what is."""


def _resource(tag: str) -> str:
    parts = tag.split("/")
    return "TimestampOracle " + "/".join(parts[:2]) if len(parts) >= 2 else "nobody"


def _uid(tag: str) -> str:
    return tag.split("/")[2] if tag.count("/") >= 2 else "-"

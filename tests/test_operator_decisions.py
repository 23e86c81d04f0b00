"""The operator's decisions outside a pass's plan, as pure functions (issue 34): deletionPolicy
and the adoption of a schema. tests/test_operator_deletion.py and test_operator_ownership.py run
them under kopf against a real API server and database."""

from __future__ import annotations

import pytest

from tsoracle.errors import ConfigError, OracleUnavailable
from tsoracle.fencing import Deployment
from tsoracle.operator.model import (
    SKIP_CLEANUP,
    DeletionStep,
    deletion_failure,
    deletion_start,
    deletion_step,
    warns_at,
)
from tsoracle.operator.ownership import Owner

OWNER = Owner("ns", "orders", "uid-1")
URL = "postgresql://tso:hunter2@db.internal:5432/app"


def spec(policy: str = "Delete") -> dict:
    return {"backend": {"urlSecretRef": {"name": "db"}, "schema": "s1"},
            "deletionPolicy": policy}


def found(owner: str = OWNER.tag) -> Deployment:
    return Deployment(4, "distributed", "Always", False, "inc", owner, 3)


def test_a_spec_that_never_parsed_ends_its_deletion_without_the_lease():
    start = deletion_start({"implementation": "sideways"}, {})
    assert start.spec is None and not start.warned and not start.needs_lease
    assert "never parsed" in start.said


@pytest.mark.parametrize("value", ["true", "True", "TRUE"])
def test_skip_cleanup_ends_the_deletion_with_a_warning(value):
    start = deletion_start(spec(), {SKIP_CLEANUP: value})
    assert start.spec is None and start.warned and start.needs_lease
    assert "'s1' is left as it is" in start.said


@pytest.mark.parametrize(("policy", "what"), [("Delete", "drop"), ("Retain", "release")])
def test_the_policy_names_what_is_done(policy, what):
    start = deletion_start(spec(policy), {SKIP_CLEANUP: "false"})
    assert start.spec is not None and start.what == what and start.needs_lease


def test_what_a_deletion_does_to_the_deployment_it_finds():
    assert deletion_step(None, OWNER, "drop") == DeletionStep("finish")
    assert deletion_step(None, OWNER, "release") == DeletionStep("nothing")
    assert deletion_step(found(), OWNER, "drop") == DeletionStep("drop", epoch=4)
    assert deletion_step(found(""), OWNER, "release") == DeletionStep("release", epoch=4)
    assert deletion_step(found("ns/other/uid-2"), OWNER, "drop") == \
        DeletionStep("foreign", "ns/other (uid uid-2)")


def test_only_a_drop_of_a_provisioned_schema_waits_for_its_database():
    down = OracleUnavailable(f"cannot connect to {URL}")
    provisioned = {"incarnation": "inc"}
    drop, keep = deletion_start(spec("Delete"), {}), deletion_start(spec("Retain"), {})
    blocked = deletion_failure(drop, down, URL, provisioned, 10)
    assert blocked.blocked and SKIP_CLEANUP in blocked.message and "every 10 s" in blocked.message
    released = deletion_failure(keep, down, URL, provisioned, 10)
    assert not released.blocked and released.warned
    never = deletion_failure(drop, down, URL, {}, 10)
    assert not never.blocked and not never.warned and "never provisioned" in never.message
    secret = deletion_failure(drop, ConfigError("Secret db is gone"), URL, provisioned, 10)
    assert not secret.blocked and secret.warned and "tables are kept" in secret.message
    for failure in (blocked, released, never, secret):
        assert "hunter2" not in failure.message and "db.internal" not in failure.message


def test_a_blocked_deletion_warns_at_a_backoff():
    assert [r for r in range(20) if warns_at(r)] == [0, 1, 3, 7, 15]

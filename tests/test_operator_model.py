"""The operator's decisions as pure functions, without an API server: the plan of a reconcile
pass, the spec, the conditions and the status patch. tests/test_operator.py runs them for real."""

from __future__ import annotations

import datetime as dt

import pytest

from tsoracle.errors import ConfigError
from tsoracle.fencing import Deployment
from tsoracle.operator.model import (
    Condition,
    Observation,
    Plan,
    merge_conditions,
    needs_provisioning,
    plan,
    status_patch,
)
from tsoracle.oracle.status import Status
from tsoracle.resource import parse_spec

NOW = dt.datetime(2026, 11, 23, 12, 0, 0, tzinfo=dt.UTC)
SPEC = parse_spec({"backend": {"urlSecretRef": {"name": "db"}}, "implementation": "distributed",
                   "fencing": "Rollout", "rolloutWindowSeconds": 30})


def dep(**changes: object) -> Deployment:
    base = {"epoch": 3, "implementation": "distributed", "fence": "Rollout", "rollout": False}
    return Deployment(**{**base, **changes})  # type: ignore[arg-type]


def status(epoch: int = 3, implementation: str = "distributed", **extra: object) -> dict:
    return {"epoch": epoch, "activeImplementation": implementation, **extra}


def test_a_deployment_as_specified_needs_nothing():
    assert plan(SPEC, dep(), status(), NOW) == Plan()


@pytest.mark.parametrize(("found", "has_timelines", "expected"),
                         [(None, False, True), (dep(), False, True), (dep(), True, False)])
def test_provisioning_is_needed_for_a_missing_deployment_or_timeline(found, has_timelines,
                                                                    expected):
    assert needs_provisioning(found, has_timelines) is expected


def test_a_changed_implementation_is_flipped_and_a_changed_mode_set():
    todo = plan(SPEC, dep(implementation="legacy", fence="Always"), status(), NOW)
    assert todo.flip_to == "distributed" and todo.set_fencing


def test_a_flip_that_committed_but_was_never_published_is_reported():
    # The operator died between the flip (epoch 4, legacy) and publishing it (still 3).
    todo = plan(SPEC, dep(epoch=4, implementation="legacy"),
                status(3, "distributed"), NOW)
    assert todo.resume_flip and not todo.finish_rollout
    assert not plan(SPEC, dep(epoch=4), status(3, "distributed"), NOW).resume_flip
    assert not plan(SPEC, dep(epoch=4, implementation="legacy"), {}, NOW).resume_flip


@pytest.mark.parametrize(("flipped_s_ago", "over"), [(10, False), (30, True), (300, True)])
def test_a_rollout_ends_when_its_window_has_passed(flipped_s_ago, over):
    since = (NOW - dt.timedelta(seconds=flipped_s_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")
    todo = plan(SPEC, dep(rollout=True), status(lastFlipTime=since), NOW)
    assert todo.finish_rollout is over


def test_leaving_rollout_mode_ends_the_rollout_without_a_separate_step():
    spec = parse_spec({"backend": {"urlSecretRef": {"name": "db"}}, "fencing": "Always"})
    assert plan(spec, dep(rollout=True), status(), NOW).set_fencing
    # The handler plans again from what set_fencing returned: the flag is already cleared.
    assert plan(spec, dep(fence="Always", rollout=False), status(), NOW) == Plan()


@pytest.mark.parametrize(("spec", "names"), [
    ({}, "spec.backend.urlSecretRef.name"),
    ({"backend": {"urlSecretRef": {"name": "db"}}, "implementation": "fast"},
     "spec.implementation"),
    ({"backend": {"urlSecretRef": {"name": "db"}}, "fencing": "Sometimes"}, "spec.fencing"),
    ({"backend": {"urlSecretRef": {"name": "db"}}, "timelines": ["counter:"]}, "spec.timelines"),
])
def test_a_bad_spec_names_the_field(spec, names):
    with pytest.raises(ConfigError, match=names.replace(".", r"\.")):
        parse_spec(spec)


def test_a_condition_keeps_its_transition_time_until_its_status_changes():
    first = merge_conditions(None, [Condition("Ready", "False", "Progressing")], 1, "t1")
    same = merge_conditions(first, [Condition("Ready", "False", "BadURL", "x")], 2, "t2")
    flipped = merge_conditions(same, [Condition("Ready", "True", "Reconciled")], 3, "t3")
    assert [c["lastTransitionTime"] for c in (first[0], same[0], flipped[0])] == \
        ["t1", "t1", "t3"]
    assert same[0]["reason"] == "BadURL" and flipped[0]["observedGeneration"] == 3


def test_a_degraded_pass_publishes_its_reason_and_is_not_ready():
    obs = Observation(provisioned=True, degraded_reason="SchemaInUse", degraded_message="m")
    patch = status_patch(obs, SPEC, {}, 7, "t")
    by_type = {c["type"]: c for c in patch["conditions"]}
    assert by_type["Ready"]["status"] == "False" and by_type["Ready"]["reason"] == "SchemaInUse"
    assert by_type["Degraded"]["status"] == "True" and by_type["Degraded"]["message"] == "m"
    assert patch["observedGeneration"] == 7 and "epoch" not in patch


def test_a_healthy_pass_publishes_the_deployment():
    st = Status(dep(epoch=5), [])
    patch = status_patch(Observation(provisioned=True, status=st, bootstrap={"a": 9}),
                         SPEC, {}, 2, "t")
    assert patch["epoch"] == 5 and patch["activeImplementation"] == "distributed"
    assert patch["bootstrapTimestamp"] == {"a": "9"}
    assert {c["type"]: c["status"] for c in patch["conditions"]}["Ready"] == "True"

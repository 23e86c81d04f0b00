"""The operator's decisions as pure functions, without an API server: the plan of a reconcile
pass, the spec, the Degraded reason of a failure, the conditions, the status patch and the
settings. tests/test_operator.py runs them for real."""

from __future__ import annotations

import datetime as dt

import pytest

from tsoracle.errors import ConfigError, Fenced, OracleUnavailable
from tsoracle.fencing import Deployment, FlipClock, PlannedBy
from tsoracle.operator.model import (
    Condition,
    FinishRollout,
    Flip,
    HighWater,
    Observation,
    Outcome,
    Plan,
    PublishFlip,
    RecordGeneration,
    SetFencing,
    StartRolloutClock,
    degraded,
    merge_conditions,
    needs_provisioning,
    plan,
    published_degraded_reason,
    rewind_targets,
    status_expectations,
    status_patch,
    still_due,
)
from tsoracle.operator.ownership import OwnershipProblem
from tsoracle.operator.settings import OperatorSettings, for_command, from_environment
from tsoracle.oracle.status import Status
from tsoracle.resource import SecretProblem, parse_spec

NOW = dt.datetime(2026, 11, 23, 12, 0, 0, tzinfo=dt.UTC)
SPEC = parse_spec({"backend": {"urlSecretRef": {"name": "db"}}, "implementation": "distributed",
                   "fencing": "Rollout", "rolloutWindowSeconds": 30})


OWNER = "ns/orders/uid-1"


def by(generation: int = 7) -> PlannedBy:
    return PlannedBy(OWNER, generation)


def dep(**changes: object) -> Deployment:
    base = {"epoch": 3, "implementation": "distributed", "fence": "Rollout", "rollout": False,
            "generation": 7, "owner": OWNER}
    return Deployment(**{**base, **changes})  # type: ignore[arg-type]


def status(epoch: int = 3, implementation: str = "distributed", **extra: object) -> dict:
    return {"epoch": epoch, "activeImplementation": implementation, **extra}


def steps(found: Deployment, published: dict, spec=SPEC, generation: int = 7,
          clock: FlipClock | None = None) -> tuple:
    return plan(Observation(spec, found, published, generation, NOW, flip_clock=clock)).steps


def test_a_deployment_as_specified_needs_nothing():
    assert plan(Observation(SPEC, dep(), status(), 7, NOW)) == Plan()


@pytest.mark.parametrize(("found", "has_timelines", "expected"),
                         [(None, False, True), (dep(), False, True), (dep(), True, False)])
def test_provisioning_is_needed_for_a_missing_deployment_or_timeline(found, has_timelines,
                                                                    expected):
    assert needs_provisioning(found, has_timelines) is expected


def test_a_newer_generation_is_recorded_first_even_when_nothing_else_changes():
    # A pass of generation 8 that changes nothing still records 8: a pass of 7 planned
    # earlier and resumed late (a paused operator) is then refused by the backend.
    assert steps(dep(), status(), generation=8) == (RecordGeneration(by(8)),)
    assert steps(dep(implementation="legacy"), status(), generation=8) == \
        (RecordGeneration(by(8)), Flip("distributed", by(8)))


def test_every_durable_step_names_the_owner_that_planned_it():
    other = dep(owner="ns/orders/uid-0", implementation="legacy", fence="Always")
    for step in steps(other, status(), generation=8):
        assert getattr(step, "by", None) == PlannedBy("ns/orders/uid-0", 8), step


def test_a_pass_older_than_the_generation_applied_does_nothing():
    todo = plan(Observation(SPEC, dep(implementation="legacy", generation=9), status(), 8, NOW))
    assert todo == Plan(stale=True)


def test_a_changed_mode_is_set_then_a_changed_implementation_flipped():
    # Both carry the resource's generation: the backend refuses an older one's request.
    assert steps(dep(implementation="legacy", fence="Always"), status()) == \
        (SetFencing("Rollout", by(7)), Flip("distributed", by(7)))


def test_a_flip_that_committed_but_was_never_published_is_reported():
    # The operator died between the flip (epoch 4, legacy) and publishing it (still 3).
    assert steps(dep(epoch=4, implementation="legacy"), status(3, "distributed")) == \
        (Flip("distributed", by(7)), PublishFlip(3))
    assert steps(dep(epoch=4), status(3, "distributed")) == ()
    assert steps(dep(epoch=4, implementation="legacy"), {}) == (Flip("distributed", by(7)),)


def test_an_unreported_flip_is_reported_before_its_rollout_ends():
    found = dep(epoch=4, implementation="legacy", rollout=True)
    spec = parse_spec({"backend": {"urlSecretRef": {"name": "db"}}, "implementation": "legacy",
                       "fencing": "Rollout"})
    assert steps(found, status(3, "distributed"), spec) == (PublishFlip(3),)


@pytest.mark.parametrize(("flipped_s_ago", "over"), [(10, False), (30, True), (300, True)])
def test_a_rollout_ends_when_its_window_has_passed(flipped_s_ago, over):
    at_ms = int((NOW - dt.timedelta(seconds=flipped_s_ago)).timestamp() * 1000)
    # The database's record times the window; status.lastFlipTime (here: none) does not.
    todo = steps(dep(rollout=True), status(), clock=FlipClock(3, at_ms))
    assert todo == ((FinishRollout(by(7), 3),) if over else ())


@pytest.mark.parametrize("clock", [None, FlipClock(0, 0), FlipClock(2, 1), FlipClock(3, 0),
                                   FlipClock(3, -5), FlipClock(3, 2**63 - 1),
                                   FlipClock(3, int(NOW.timestamp() * 1000) + 1)],
                         ids=["not-read", "never-recorded", "an-earlier-epoch", "no-time",
                              "negative", "beyond-year-9999", "ahead-of-this-clock"])
def test_a_rollout_window_nothing_times_starts_now_and_stays_open(clock):
    # A schema from an earlier release, or an epoch a repair moved: the window runs from now.
    long_ago = status(lastFlipTime="2026-01-01T00:00:00Z")
    assert steps(dep(rollout=True), long_ago, clock=clock) == \
        (StartRolloutClock(by(7), 3, NOW),)


def test_leaving_rollout_mode_ends_the_rollout_without_a_separate_step():
    spec = parse_spec({"backend": {"urlSecretRef": {"name": "db"}}, "fencing": "Always"})
    opened = FlipClock(3, int(NOW.timestamp() * 1000) - 3_600_000)
    assert steps(dep(rollout=True), status(), spec, clock=opened) == \
        (SetFencing("Always", by(7)), FinishRollout(by(7), 3))
    # The executor checks each step against the deployment the steps before it returned:
    # SetFencing cleared the flag, so there is no rollout left to finish...
    assert not still_due(FinishRollout(by(7), 3), dep(fence="Always", rollout=False), flipped=False)
    # ...unless the backend refused the change (an older generation): then it still is.
    assert still_due(FinishRollout(by(7), 3), dep(rollout=True), flipped=False)


def test_a_flip_published_in_a_pass_leaves_the_rest_to_the_next_pass():
    for step in (PublishFlip(3), FinishRollout(by(7), 3)):
        assert not still_due(step, dep(rollout=True), flipped=True)
    for step in (SetFencing("Always", by(1)), Flip("legacy", by(1))):  # dep() is on distributed
        assert still_due(step, dep(), flipped=True) and still_due(step, dep(), flipped=False)
    assert still_due(PublishFlip(3), dep(), flipped=False)


def test_a_flip_someone_else_finished_during_the_pass_is_not_done_again():
    # The plan saw distributed; by the time the flip was due, the backend was on legacy.
    assert still_due(Flip("legacy", by(1)), dep(implementation="distributed"), flipped=False)
    assert not still_due(Flip("legacy", by(1)), dep(implementation="legacy"), flipped=False)


URL = "postgresql://tso:hunter2@db.internal:5432/app"


@pytest.mark.parametrize(("exc", "url", "reason"), [
    (SecretProblem("SecretNotLabelled", "m"), None, "SecretNotLabelled"),
    (OwnershipProblem("SchemaInUse", "m"), URL, "SchemaInUse"),
    (ConfigError("bad spec"), None, "InvalidSpec"),
    (ConfigError("bad url"), URL, "BadURL"),
    (OracleUnavailable("down"), URL, "BackendUnavailable"),
    (Fenced("moved"), URL, "Fenced"),
])
def test_a_failure_is_published_as_its_reason(exc, url, reason):
    assert degraded(exc, url)[0] == reason


def test_a_failure_message_never_holds_the_url():
    reason, message = degraded(OracleUnavailable(f"cannot reach {URL} (db.internal)"), URL)
    assert reason == "BackendUnavailable"
    assert "hunter2" not in message and "db.internal" not in message and "<backend>" in message


def test_the_published_degraded_reason_is_read_from_the_conditions():
    conditions = [{"type": "Ready", "status": "False", "reason": "SchemaInUse"},
                  {"type": "Degraded", "status": "True", "reason": "SchemaInUse"}]
    assert published_degraded_reason({"conditions": conditions}) == "SchemaInUse"
    conditions[1]["status"] = "False"
    assert published_degraded_reason({"conditions": conditions}) == ""
    assert published_degraded_reason({}) == ""


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
    outcome = Outcome(provisioned=True, degraded_reason="SchemaInUse", degraded_message="m")
    patch = status_patch(outcome, SPEC, {}, 7, "t")
    by_type = {c["type"]: c for c in patch["conditions"]}
    assert by_type["Ready"]["status"] == "False" and by_type["Ready"]["reason"] == "SchemaInUse"
    assert by_type["Degraded"]["status"] == "True" and by_type["Degraded"]["message"] == "m"
    assert patch["observedGeneration"] == 7 and "epoch" not in patch


def test_a_healthy_pass_publishes_the_deployment():
    st = Status(dep(epoch=5), [])
    patch = status_patch(Outcome(provisioned=True, status=st, bootstrap={"a": 9},
                                 flip_time="2026-11-23T12:00:00Z"), SPEC, {}, 2, "t")
    assert patch["epoch"] == 5 and patch["activeImplementation"] == "distributed"
    assert patch["bootstrapTimestamp"] == {"a": "9"}
    assert patch["lastFlipTime"] == "2026-11-23T12:00:00Z"
    assert "lastFlipTime" not in status_patch(Outcome(provisioned=True, status=st), SPEC, {}, 2,
                                              "t")
    assert {c["type"]: c["status"] for c in patch["conditions"]}["Ready"] == "True"


def test_ready_needs_the_fencing_the_spec_asks_for_too():
    # An adopted schema left at fencing Always while the spec asks for Rollout: not Ready
    # until the mode is set (before, Ready compared the implementation only).
    st = Status(dep(fence="Always"), [])
    patch = status_patch(Outcome(provisioned=True, status=st), SPEC, {}, 2, "t")
    ready = {c["type"]: c for c in patch["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "Progressing")


def test_kopf_run_reads_its_settings_from_the_environment_alone():
    env = {"TSORACLE_LEASE_NAMESPACE": "ops", "TSORACLE_LEASE_OWNER": "tso",
           "TSORACLE_WATCH_NAMESPACES": "a,,b", "POD_NAMESPACE": "pod"}
    assert from_environment(env) == OperatorSettings(namespaces=("a", "b"),
                                                     lease_namespace="ops", lease_owner="tso")
    # Without the Lease's namespace it runs alone: POD_NAMESPACE is for `tsoracle operator`.
    assert from_environment({"POD_NAMESPACE": "pod"}).lease_namespace is None


@pytest.mark.parametrize(("flag", "env", "expected"), [
    ("flag", {"TSORACLE_LEASE_NAMESPACE": "env", "POD_NAMESPACE": "pod"}, "flag"),
    (None, {"TSORACLE_LEASE_NAMESPACE": "env", "POD_NAMESPACE": "pod"}, "env"),
    (None, {"POD_NAMESPACE": "pod"}, "pod"),
    (None, {}, None),
])
def test_tsoracle_operator_takes_the_lease_namespace_from_flag_then_environment(flag, env,
                                                                                 expected):
    got = for_command(namespaces=[], lease_namespace=flag, lease_name=None, environ=env)
    assert got.lease_namespace == expected and got.lease_name == "tsoracle-operator"


def test_tsoracle_operator_flags_win_over_the_environment():
    env = {"TSORACLE_LEASE_NAME": "env-lease", "TSORACLE_WATCH_NAMESPACES": "x",
           "TSORACLE_LEASE_OWNER": "tso"}  # the chart sets the owner
    got = for_command(namespaces=["a"], lease_namespace="ops", lease_name="flag-lease",
                      environ=env)
    assert got == OperatorSettings(namespaces=("a",), lease_namespace="ops",
                                   lease_name="flag-lease", lease_owner="tso")
    assert for_command(namespaces=[], lease_namespace=None, lease_name=None,
                       environ=env).lease_name == "env-lease"


def test_the_high_water_mark_only_rises_and_measures_the_fastest_advance():
    t0 = NOW
    mark = HighWater().after({"counter:c": 100}, t0)
    assert mark.positions == {"counter:c": 100} and mark.peaks == {}
    mark = mark.after({"counter:c": 300}, t0 + dt.timedelta(seconds=2))  # 100 per second
    mark = mark.after({"counter:c": 350}, t0 + dt.timedelta(seconds=3))  # 50 per second
    assert mark.positions == {"counter:c": 350} and mark.peaks == {"counter:c": 100.0}
    mark = mark.counted(12)
    assert HighWater.of({"highWater": mark.published()}) == mark


def test_a_backend_below_the_mark_is_moved_above_what_could_have_been_handed_out():
    mark = HighWater(NOW, {"counter:c": 1000, "EpochMilliseconds": 5000}, {"counter:c": 100.0},
                     passes=7)
    later = NOW + dt.timedelta(seconds=10)
    positions = {"counter:c": 1000, "EpochMilliseconds": 5000}
    assert rewind_targets(mark, positions, 3, 3, 7, later) == {}
    # One timeline below: the whole database was restored, every timeline moves. A counter by
    # what it could have handed out since the mark; EpochMilliseconds by the floor only (its
    # writers never go below the wall clock, which has moved on).
    want = {"counter:c": 1000 + 100 * 10 * 2 + 1000, "EpochMilliseconds": 5000 + 1000}
    assert rewind_targets(mark, {**positions, "counter:c": 400}, 3, 3, 7, later) == want
    # Fewer passes counted than published: restored, although writers (whose refused writes
    # still move the row) pushed the counter back above the mark.
    assert rewind_targets(mark, {**positions, "counter:c": 5000}, 3, 3, 5, later) == want
    # An epoch below the published one is a restore too.
    assert rewind_targets(mark, positions, 2, 3, 7, later) == want
    # No mark yet (the first pass): nothing to compare with.
    assert rewind_targets(HighWater(), {"counter:c": 0}, 1, 3, 0, later) == {}


def test_no_pace_is_measured_for_the_wall_clock_or_from_no_mark():
    # The newcomer saw EpochMilliseconds' peakPerSecond at 164865997959: its jump from 0.
    first = HighWater().after({"EpochMilliseconds": 0, "counter:c": 0}, NOW)
    assert first.peaks == {}  # one pass measures nothing
    mark = first.after({"EpochMilliseconds": 1_795_000_000_000, "counter:c": 50},
                       NOW + dt.timedelta(seconds=1))
    # A counter's move from 0 is a pace (issue 34); the wall clock's never is.
    assert mark.peaks == {"counter:c": 50.0}
    mark = mark.after({"EpochMilliseconds": 1_795_000_001_000, "counter:c": 150},
                      NOW + dt.timedelta(seconds=2))
    assert mark.peaks == {"counter:c": 100.0}


def test_a_status_patch_is_always_guarded():
    full = {"observedGeneration": 2, "epoch": 3, "highWater": {"passes": 4}, "fencing": "Always"}
    assert status_expectations(full, "77") == {
        "/status/observedGeneration": 2, "/status/epoch": 3, "/status/highWater": {"passes": 4}}
    # A field found missing cannot be tested as absent: the resourceVersion is tested instead.
    assert status_expectations({"epoch": 3}, "77") == {"/status/epoch": 3,
                                                       "/metadata/resourceVersion": "77"}
    assert status_expectations({}, "77") == {"/metadata/resourceVersion": "77"}

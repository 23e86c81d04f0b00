"""spec.catalog as pure functions, without an API server: the spec, the Deployment and Service
the operator builds, what a pass plans for them, and what it publishes.
tests/test_operator.py (an API server) and tests/test_node.py (real pods) run them for real."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from tsoracle.errors import ConfigError
from tsoracle.fencing import Deployment
from tsoracle.operator import catalog
from tsoracle.operator.model import (
    ApplyCatalog,
    CatalogObservation,
    Observation,
    Outcome,
    RemoveCatalog,
    catalog_outcome,
    plan,
    status_patch,
)
from tsoracle.operator.ownership import Owner
from tsoracle.resource import parse_spec
from tsoracle.store import parse_url

NOW = dt.datetime(2026, 11, 23, 12, 0, 0, tzinfo=dt.UTC)
OWNER = Owner("etl", "orders", "uid-1")
BASE = {"backend": {"urlSecretRef": {"name": "db"}, "schema": "tsoracle_orders"},
        "timelines": ["EpochMilliseconds", "counter:orders"]}
FILE_CATALOG = {"enabled": True, "warehouse": "file:///srv/warehouse/",
                "volume": {"hostPath": "/srv/warehouse"},
                "tokenSecretRef": {"name": "catalog-token"}}


def spec_with(**catalog_fields: object):
    return parse_spec({**BASE, "catalog": {**FILE_CATALOG, **catalog_fields}})


def dep(implementation: str = "distributed") -> Deployment:
    # generation 3: the resource generation the observations below read, already recorded.
    return Deployment(epoch=1, implementation=implementation, fence="Always", rollout=False,
                      generation=3)


def observed(found: catalog.Seen = catalog.Seen(), image: str = "tsoracle:1",
             suffix: str | None = "?schema=tsoracle_orders",
             token: tuple[str, str] | None = None) -> CatalogObservation:
    return CatalogObservation(OWNER, found, image, suffix, token)


def mine(desired: catalog.Desired, ready: int = 0, replicas: int | None = None,
         uid: str = OWNER.uid) -> catalog.SeenObject:
    return catalog.SeenObject(uid, desired.digest,
                              desired.deployment["spec"]["replicas"] if replicas is None
                              else replicas, ready)


def steps(spec, seen: CatalogObservation | None) -> tuple:
    return plan(Observation(spec, dep(), {"epoch": 1, "activeImplementation": "distributed"},
                            3, NOW, seen)).steps


# --- the spec -------------------------------------------------------------------------------


def test_the_catalog_is_off_unless_enabled():
    assert parse_spec(BASE).catalog is None
    assert parse_spec({**BASE, "catalog": {"enabled": False, "warehouse": "x"}}).catalog is None


def test_defaults_follow_the_resource():
    c = parse_spec({**BASE, "catalog": {"enabled": True, "warehouse": "s3://lake/tables"}}).catalog
    assert c is not None
    assert (c.timeline, c.replicas, c.token_secret, c.volume) == ("EpochMilliseconds", 1, "",
                                                                   None)
    assert c.retention_s is None  # not set: the catalog's own default, no --retention
    c = spec_with().catalog
    assert c is not None and c.warehouse == "file:///srv/warehouse"  # one spelling, no slash
    assert c.warehouse_path == "/srv/warehouse" and c.token_key == "token"


@pytest.mark.parametrize(("catalog_fields", "says"), [
    ({"warehouse": ""}, "spec.catalog.warehouse is required when spec.catalog.enabled"),
    ({"warehouse": "hdfs://nn/x"}, "must be a file:///… path or an s3://bucket/prefix"),
    ({"warehouse": "file://relative/x"}, "must name an absolute directory"),
    ({"warehouse": "file:///a/../etc"}, "must name an absolute directory"),
    ({"volume": None}, "spec.catalog.volume is required for a file:// warehouse"),
    ({"volume": {"hostPath": "/a", "claimName": "b"}}, "exactly one of hostPath and claimName"),
    ({"volume": {"hostPath": "a"}}, "spec.catalog.volume.hostPath 'a' must be an absolute"),
    ({"warehouse": "s3://lake/t"}, "spec.catalog.volume is only for file:// warehouses"),
    ({"timeline": "counter:other"}, "spec.catalog.timeline 'counter:other' is not one of "
                                    "spec.timelines"),
    ({"replicas": 0}, "spec.catalog.replicas must be 1 to 16"),
    ({"tokenSecretRef": {"key": "t"}}, "spec.catalog.tokenSecretRef.name is required"),
    ({"resources": {"limits": {"memory": "lots"}}},
     "spec.catalog.resources.limits.memory 'lots' is not a quantity"),
    ({"ioProperties": {"s3.endpoint": "http://minio:9000"}},
     "a file:// warehouse takes none"),
    ({"credentialsSecretRef": {"name": "s3"}}, "a file:// warehouse needs none"),
    ({"warehouse": "s3://lake/t", "volume": None,
      "ioProperties": {"s3.secret-access-key": "x"}},
     "spec.catalog.ioProperties.s3.secret-access-key would put a credential in the resource"),
    ({"warehouse": "s3://lake/t", "volume": None, "ioProperties": {"a=b": "x"}},
     "is not a FileIO setting's name"),
    # A key read as a flag made the catalog's pods crash-loop on a usage error.
    ({"warehouse": "s3://lake/t", "volume": None, "ioProperties": {"--port": "1"}},
     "is not a FileIO setting's name"),
    ({"warehouse": "s3://lake/t", "volume": None, "ioProperties": {"s3.access-key-id": "x"}},
     "would put a credential in the resource"),
    ({"warehouse": "s3://lake/t", "volume": None, "ioProperties": {"adls.account-key": "x"}},
     "would put a credential in the resource"),
    ({"warehouse": "s3://lake/t", "volume": None, "credentialsSecretRef": {"name": "Bad_Name"}},
     "spec.catalog.credentialsSecretRef.name 'Bad_Name' is not a Secret name"),
    ({"retentionSeconds": -1}, "spec.catalog.retentionSeconds must be a number of seconds "
                               "from 0 to 315360000 (ten years), not -1"),
    ({"retentionSeconds": 315360000.5}, "spec.catalog.retentionSeconds must be"),
    ({"retentionSeconds": float("nan")}, "spec.catalog.retentionSeconds must be"),
    ({"retentionSeconds": float("inf")}, "spec.catalog.retentionSeconds must be"),
    # Only a number: a string or a boolean would reach the pods' arguments as something else.
    ({"retentionSeconds": "3600"}, "spec.catalog.retentionSeconds must be"),
    ({"retentionSeconds": True}, "spec.catalog.retentionSeconds must be"),
])
def test_a_bad_catalog_spec_names_the_field(catalog_fields, says):
    with pytest.raises(ConfigError) as caught:
        spec_with(**catalog_fields)
    assert says in str(caught.value)


# --- the backend URL reaches the pods as the Secret holds it --------------------------------


@pytest.mark.parametrize(("stored", "suffix"), [
    ("postgresql://u:pw@db:5432/app", "?schema=s"),
    ("postgresql://u:pw@db:5432/app?sslmode=disable", "&schema=s"),
    ("postgresql://u:pw@db:5432/app?schema=s", ""),  # it names the resource's schema already
    ("host=db dbname=app user=u password=pw", " schema=s"),
    ("host=db dbname=app user=u password=pw\n", " schema=s"),  # blanks separate DSN items
    ("postgresql://u:pw@db:5432/app\n", None),  # the newline would end up in the database name
    ("sqlite:////var/lib/oracle.db", "?schema=s"),
])
def test_the_schema_is_appended_as_the_secrets_url_needs_it(stored, suffix):
    assert catalog.url_suffix(stored, "s") == suffix
    if suffix is not None:  # what the pod's TSORACLE_URL becomes addresses the schema
        assert parse_url(stored + suffix).schema == "s"


# --- the objects ----------------------------------------------------------------------------


def test_the_deployment_runs_the_catalog_with_the_secret_in_its_environment_only():
    want = catalog.desired(spec_with(replicas=2), OWNER, "tsoracle:1", "?schema=tsoracle_orders")
    d = want.deployment
    assert d["metadata"]["name"] == "orders-catalog" and d["metadata"]["namespace"] == "etl"
    [ref] = d["metadata"]["ownerReferences"]
    assert ref == {"apiVersion": "tsoracle.io/v1alpha1", "kind": "TimestampOracle",
                   "name": "orders", "uid": "uid-1", "controller": True,
                   "blockOwnerDeletion": True}
    assert d["spec"]["replicas"] == 2
    pod = d["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert c["image"] == "tsoracle:1"
    assert c["args"] == ["catalog", "serve", "--warehouse", "file:///srv/warehouse", "--host",
                         "0.0.0.0", "--port", "8181", "--metrics-port", "9090", "--timeline",
                         "EpochMilliseconds", "--token-file",
                         "/etc/tsoracle/catalog-token/token"]
    env = {e["name"]: e for e in c["env"]}
    assert env["TSORACLE_BACKEND_URL"]["valueFrom"] == {"secretKeyRef": {"name": "db",
                                                                         "key": "url"}}
    assert env["TSORACLE_URL"]["value"] == "$(TSORACLE_BACKEND_URL)?schema=tsoracle_orders"
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["warehouse"]["mountPath"] == "/srv/warehouse"
    assert volumes["warehouse"]["hostPath"] == {"path": "/srv/warehouse", "type": "Directory"}
    assert mounts["token"] == {"name": "token", "mountPath": "/etc/tsoracle/catalog-token",
                               "readOnly": True}
    assert volumes["token"]["secret"]["items"] == [{"key": "token", "path": "token"}]
    assert pod["securityContext"]["runAsUser"] == 65532 and not pod[
        "automountServiceAccountToken"]
    s = want.service
    assert s["spec"]["selector"] == d["spec"]["selector"]["matchLabels"]
    assert [(p["name"], p["port"]) for p in s["spec"]["ports"]] == [("http", 8181),
                                                                   ("metrics", 9090)]
    assert catalog.service_url(OWNER) == "http://orders-catalog.etl.svc:8181"


def test_a_claim_an_object_store_and_resources():
    want = catalog.desired(spec_with(volume={"claimName": "lake"}, resources={
        "requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": 1}}), OWNER,
        "img", "")
    pod = want.deployment["spec"]["template"]["spec"]
    assert {"name": "warehouse", "persistentVolumeClaim": {"claimName": "lake"}} in \
        pod["volumes"]
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "250m", "memory": "256Mi"},
                                                 "limits": {"memory": "1"}}
    s3 = parse_spec({**BASE, "catalog": {"enabled": True, "warehouse": "s3://lake/t"}})
    pod = catalog.desired(s3, OWNER, "img", "").deployment["spec"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]  # no warehouse volume, no token
    assert "--token-file" not in pod["containers"][0]["args"]


def test_the_digest_follows_what_is_applied():
    one = catalog.desired(spec_with(), OWNER, "img", "")
    assert one.digest == catalog.desired(spec_with(), OWNER, "img", "").digest
    assert one.deployment["metadata"]["annotations"] == {catalog.DIGEST_ANNOTATION: one.digest}
    others = [catalog.desired(spec_with(replicas=2), OWNER, "img", ""),
              catalog.desired(spec_with(), OWNER, "img2", ""),
              catalog.desired(spec_with(), OWNER, "img", "?schema=x")]
    assert len({one.digest, *(o.digest for o in others)}) == 4
    # The digest is not in the pod template: a new one alone restarts no pod.
    assert catalog.DIGEST_ANNOTATION not in json.dumps(one.deployment["spec"])


# --- the plan -------------------------------------------------------------------------------


def test_an_enabled_catalog_is_applied_until_it_is_as_specified():
    spec = spec_with()
    want = catalog.desired(spec, OWNER, "tsoracle:1", "?schema=tsoracle_orders")
    assert steps(spec, observed()) == (ApplyCatalog(want),)
    current = catalog.Seen(mine(want), mine(want))
    assert steps(spec, observed(current)) == ()
    scaled = catalog.Seen(mine(want, replicas=5), mine(want))  # `kubectl scale` by hand
    assert steps(spec, observed(scaled)) == (ApplyCatalog(want),)
    assert steps(spec_with(replicas=3), observed(current))[0].desired.deployment["spec"][
        "replicas"] == 3


def test_a_disabled_catalog_is_removed_and_only_this_resources():
    spec = parse_spec(BASE)
    want = catalog.desired(spec_with(), OWNER, "img", "")
    assert steps(spec, observed(catalog.Seen(mine(want), mine(want)))) == \
        (RemoveCatalog("etl", "orders-catalog", True, True),)
    assert steps(spec, observed(catalog.Seen(None, mine(want)))) == \
        (RemoveCatalog("etl", "orders-catalog", False, True),)
    theirs = catalog.Seen(mine(want, uid="someone-else"), None)
    assert steps(spec, observed(theirs)) == ()
    assert steps(spec, None) == ()  # nothing looked at: nothing to do


@pytest.mark.parametrize(("seen", "reason"), [
    (observed(catalog.Seen(catalog.SeenObject("other", "", 1, 1), None)), "CatalogNameInUse"),
    (observed(image=""), "NoCatalogImage"),
    (observed(suffix=None), "BackendURLNotUsable"),
])
def test_a_catalog_that_cannot_be_applied_is_left_alone_and_said_why(seen, reason):
    spec = spec_with()
    assert steps(spec, seen) == ()
    out = catalog_outcome(spec, seen, None, "", "distributed")
    assert out is not None and out.condition is not None
    assert (out.condition.status, out.condition.reason) == ("False", reason)
    assert out.status is not None and out.status["readyReplicas"] == 0


def test_a_resource_name_too_long_for_a_service():
    owner = Owner("etl", "o" * 60, "u")
    seen = CatalogObservation(owner, catalog.Seen(), "img", "")
    assert steps(spec_with(), seen) == ()
    out = catalog_outcome(spec_with(), seen, None, "", "distributed")
    assert out is not None and out.condition is not None and out.condition.reason == \
        "InvalidName"


# --- what a pass publishes ------------------------------------------------------------------


def outcome_of(spec, implementation: str = "distributed", ready: int = 1, **seen_fields):
    want = catalog.desired(spec, OWNER, "img", "")
    applied = catalog.SeenObject(OWNER.uid, want.digest, spec.catalog.replicas, ready)
    return catalog_outcome(spec, observed(**seen_fields), applied, "", implementation)


def test_ready_when_every_replica_serves():
    out = outcome_of(spec_with(replicas=2), ready=2)
    assert out.status == {"url": "http://orders-catalog.etl.svc:8181", "replicas": 2,
                          "readyReplicas": 2}
    assert (out.condition.status, out.condition.reason) == ("True", "Serving")
    out = outcome_of(spec_with(replicas=2), ready=1)
    assert (out.condition.status, out.condition.reason) == ("False", "ReplicasNotReady")
    assert out.condition.message == "1 of 2 replicas ready"


def test_more_than_one_replica_on_legacy_is_said_so():
    out = outcome_of(spec_with(replicas=2), "legacy", ready=1)
    assert (out.condition.status, out.condition.reason) == ("True", "LegacyServesOneReplica")
    assert "spec.catalog.replicas is 2" in out.condition.message
    assert "spec.implementation: distributed" in out.condition.message
    assert outcome_of(spec_with(), "legacy").condition.reason == "Serving"


def test_a_token_secret_problem_and_a_refusal_are_published():
    out = outcome_of(spec_with(), token=("TokenSecretNotFound", "Secret etl/t does not exist"))
    assert (out.condition.status, out.condition.reason) == ("False", "TokenSecretNotFound")
    spec = spec_with()
    out = catalog_outcome(spec, observed(), None, "422 spec.replicas: Invalid value",
                          "distributed")
    assert out is not None and out.condition is not None
    assert out.condition.reason == "CatalogRejected" and "422" in out.condition.message


def test_status_carries_the_catalog_and_drops_it_once_disabled():
    spec = spec_with()
    patch = status_patch(Outcome(provisioned=True, catalog=outcome_of(spec)), spec, {}, 1, "t")
    assert patch["catalog"]["url"] == "http://orders-catalog.etl.svc:8181"
    assert [c["type"] for c in patch["conditions"]][-1] == "CatalogReady"
    off = parse_spec(BASE)
    removed = catalog_outcome(off, observed(), None, "", "distributed")
    patch = status_patch(Outcome(provisioned=True, catalog=removed), off, {}, 2, "t")
    assert patch["catalog"] is None  # a merge patch's null: the field goes
    assert "CatalogReady" not in [c["type"] for c in patch["conditions"]]
    # A pass that never got to the catalog (the oracle degraded) leaves status.catalog alone
    # and says the catalog's state is unknown.
    patch = status_patch(Outcome(degraded_reason="BackendUnavailable"), spec, {}, 3, "t")
    assert "catalog" not in patch
    said = {c["type"]: c for c in patch["conditions"]}["CatalogReady"]
    assert (said["status"], said["reason"]) == ("Unknown", "BackendUnavailable")


def test_an_object_store_gets_its_settings_as_arguments_and_credentials_from_a_secret():
    spec = spec_with(warehouse="s3://lake/tables", volume=None,
                     ioProperties={"s3.region": "eu-west-1", "s3.endpoint": "http://minio:9000"},
                     credentialsSecretRef={"name": "lake-s3"})
    want = catalog.desired(spec, OWNER, "tsoracle:1", "?schema=tsoracle_orders")
    [container] = want.deployment["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    pairs = [args[i + 1] for i, a in enumerate(args) if a == "--io-property"]
    assert pairs == ["s3.endpoint=http://minio:9000", "s3.region=eu-west-1"]  # sorted: stable
    assert container["envFrom"] == [{"secretRef": {"name": "lake-s3"}}]
    assert not any(v["name"] == "warehouse" for v in
                   want.deployment["spec"]["template"]["spec"]["volumes"])
    # A changed setting is a changed Deployment (the digest moves, the pods roll).
    other = spec_with(warehouse="s3://lake/tables", volume=None,
                      ioProperties={"s3.region": "us-east-1"})
    assert catalog.desired(other, OWNER, "tsoracle:1", "?schema=tsoracle_orders").digest != \
        want.digest


def test_retention_is_passed_only_when_set_and_rolls_the_pods_when_changed():
    def args_of(spec) -> list[str]:
        want = catalog.desired(spec, OWNER, "img", "")
        return want.deployment["spec"]["template"]["spec"]["containers"][0]["args"]

    assert "--retention" not in args_of(spec_with())  # unset: the catalog's default (3600)
    for value, arg in [(7200, "7200"), (7200.0, "7200"), (0, "0"), (0.5, "0.5"),
                       (315360000, "315360000")]:
        spec = spec_with(retentionSeconds=value)
        assert spec.catalog is not None and spec.catalog.retention_s == value
        args = args_of(spec)
        assert args[args.index("--retention") + 1] == arg
        assert float(arg) == value  # as `catalog serve --retention` (a float) reads it
    # One spelling per value; any other value (or setting it at all) is another Deployment:
    # the digest moves and the pod template with it, so the pods roll.
    digest = {v: catalog.desired(spec_with(retentionSeconds=v), OWNER, "img", "").digest
              for v in (7200, 7200.0, 3600)}
    unset = catalog.desired(spec_with(), OWNER, "img", "").digest
    assert digest[7200] == digest[7200.0]
    assert len({digest[7200], digest[3600], unset}) == 3
    assert catalog.DIGEST_ANNOTATION not in json.dumps(
        catalog.desired(spec_with(retentionSeconds=7200), OWNER, "img", "").deployment["spec"])

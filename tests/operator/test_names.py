"""Object names an InferenceService derives (NAME, NAME-router) are checked before anything is
applied: invalid or too long names are refused by the CRD's rules and the operator alike
(tests/operator/invalid/names.yaml), and a name another object already holds is never taken
over: NameConflict in status, one Warning event, nothing applied."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from tests.operator.conftest import _make_body

from radixserve_operator import handlers

CPU = {"gpu": {"enabled": False}}
ROUTED = {**CPU, "router": {"enabled": True}}


def _ready(cluster, name: str) -> dict[str, Any]:
    (c,) = [c for c in cluster.resource(name)["status"]["conditions"] if c["type"] == "Ready"]
    return c


def _create(cluster, memo, name: str, spec: dict[str, Any]) -> None:
    handlers.on_create(body=cluster.create(_make_body(spec, name=name)), memo=memo, logger=None)


def _owned_by(cluster, kind: str, name: str) -> str:
    (ref,) = cluster.objects[(kind, "serving", name)]["metadata"]["ownerReferences"]
    return ref["name"]


@pytest.mark.parametrize("name", ["a.b", "1model", "m" * 100, "r" * 57], ids=len)
def test_a_bad_name_is_refused_before_anything_is_applied(cluster, memo, name: str) -> None:
    with pytest.raises(kopf.PermanentError, match="metadata.name"):
        _create(cluster, memo, name, ROUTED)
    assert cluster.applied == []
    assert _ready(cluster, name)["reason"] == "InvalidSpec"


def test_the_longest_names_that_fit_are_built(cluster, memo, validate_k8s) -> None:
    for name, spec in (("s" * 63, CPU), ("r" * 56, ROUTED)):
        _create(cluster, memo, name, spec)
    for obj in cluster.applied:
        validate_k8s(obj)
    assert ("Service", "serving", "r" * 56 + "-router") in cluster.objects


def test_a_router_name_held_by_another_resource_is_refused(cluster, memo) -> None:
    _create(cluster, memo, "foo", ROUTED)
    before = len(cluster.applied)
    with pytest.raises(kopf.PermanentError, match="NameConflict"):
        _create(cluster, memo, "foo-router", CPU)
    assert len(cluster.applied) == before  # not even its own Deployment
    ready = _ready(cluster, "foo-router")
    assert ready["reason"] == "NameConflict"
    assert "Deployment foo-router belongs to InferenceService foo" in ready["message"]
    assert cluster.events[-1][:2] == ("Warning", "NameConflict")
    assert _owned_by(cluster, "Service", "foo-router") == "foo"


def test_a_resource_whose_router_would_take_anothers_name_is_refused(cluster, memo) -> None:
    _create(cluster, memo, "foo-router", CPU)
    before = len(cluster.applied)
    with pytest.raises(kopf.PermanentError, match="NameConflict"):
        _create(cluster, memo, "foo", ROUTED)
    assert len(cluster.applied) == before
    assert ("Deployment", "serving", "foo") not in cluster.objects
    assert _owned_by(cluster, "Deployment", "foo-router") == "foo-router"


def test_an_object_of_no_owner_is_not_taken_over(cluster, memo) -> None:
    mine = {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "llm", "namespace": "serving"}, "spec": {"selector": {"a": "b"}}}
    cluster.objects[("Service", "serving", "llm")] = mine
    with pytest.raises(kopf.PermanentError, match="Service llm exists and was not created"):
        _create(cluster, memo, "llm", CPU)
    assert cluster.applied == [] and cluster.objects[("Service", "serving", "llm")] == mine


def test_a_recreated_resource_takes_over_its_former_children(cluster, memo) -> None:
    _create(cluster, memo, "llm", CPU)
    del cluster.objects[("InferenceService", "serving", "llm")]
    again = _make_body(CPU, name="llm")
    again["metadata"]["uid"] = "uid-llm-2"  # the same name, a new object
    handlers.on_create(body=cluster.create(again), memo=memo, logger=None)
    (ref,) = cluster.objects[("Deployment", "serving", "llm")]["metadata"]["ownerReferences"]
    assert ref["uid"] == "uid-llm-2"

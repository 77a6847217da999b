"""The operator's optional allow-list of image registries: a resource's spec.image and
spec.router.image must start with an allowed prefix at a path boundary; its default images are
the admin's; without a list any image reference goes."""

from __future__ import annotations

import kopf
import pytest

from radixserve_operator import handlers
from radixserve_operator.images import ImageNotAllowed
from radixserve_operator.reconcile import plan
from radixserve_operator.settings import OperatorSettings

ALLOWED = OperatorSettings(allowed_registries=("registry.example.com/ml", "ghcr.io/radixserve/"))
CPU = {"gpu": {"enabled": False}}


@pytest.mark.parametrize(
    "spec",
    [
        {"image": "registry.example.com/ml/radixserve:1"},
        {"image": "ghcr.io/radixserve/radixserve@sha256:" + "a" * 64},
        {"router": {"enabled": True, "image": "registry.example.com/ml/router:2"}},
        {},  # the operator's own defaults
    ],
    ids=["under-a-prefix", "digest", "router", "defaults"],
)
def test_images_under_an_allowed_prefix_pass(make_body, fetch, spec) -> None:
    _, _, objects, _ = plan(make_body({**CPU, **spec}), fetch, ALLOWED)
    assert objects


@pytest.mark.parametrize(
    "field, spec",
    [
        ("spec.image", {"image": "docker.io/evil/radixserve:1"}),
        ("spec.image", {"image": "registry.example.com/ml-evil/radixserve:1"}),  # not a boundary
        ("spec.image", {"image": "registry.example.com/ml"}),  # the prefix itself, no image
        ("spec.image", {"image": "ghcr.io/radixserve"}),
        ("spec.router.image", {"router": {"enabled": True, "image": "quay.io/x/router:1"}}),
    ],
)
def test_images_elsewhere_are_refused(make_body, fetch, field: str, spec) -> None:
    with pytest.raises(ImageNotAllowed, match=rf"^{field}: image .* is not under"):
        plan(make_body({**CPU, **spec}), fetch, ALLOWED)


def test_without_a_list_any_reference_goes_but_not_a_malformed_one(make_body, fetch) -> None:
    plan(make_body({**CPU, "image": "docker.io/anyone/anything:1"}), fetch, OperatorSettings())
    with pytest.raises(ImageNotAllowed, match="not an image reference"):
        plan(make_body({**CPU, "image": "ghcr.io/radixserve/../evil:1"}), fetch, OperatorSettings())


def test_a_refused_image_is_a_status_and_an_event(cluster, memo, make_body, monkeypatch) -> None:
    monkeypatch.setenv("RADIXSERVE_ALLOWED_REGISTRIES", "registry.example.com/ml")
    with pytest.raises(kopf.PermanentError, match="ImageNotAllowed"):
        handlers.on_create(body=cluster.create(make_body({**CPU, "image": "docker.io/x/y:1"})),
                           memo=memo, logger=None)
    assert cluster.applied == []
    (ready,) = [c for c in cluster.resource()["status"]["conditions"] if c["type"] == "Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "ImageNotAllowed")
    assert cluster.reasons() == ["ImageNotAllowed"]

"""The node tier's images, built for real: every archive from `buildah bud` of the Dockerfile,
the CPU image answering a prompt with the embedded model in a network-less container, the
operator image importing its operator, the router image running the gateway. Minutes cold,
seconds when the archives are current."""

from __future__ import annotations

import json
import tarfile

import pytest
from scripts.images import IMAGES, archives, build, unavailable_reason, verify

pytestmark = [
    pytest.mark.node,
    pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or ""),
]


@pytest.fixture(scope="module")
def built() -> dict:
    return {name: build(name) for name in IMAGES}


def _repo_tags(archive) -> list[str]:
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
    return [tag for entry in manifest for tag in entry["RepoTags"]]


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_archive_names_its_image(built: dict, name: str) -> None:
    assert archives()[name] == built[name]
    assert _repo_tags(built[name]) == [IMAGES[name].tag]


def test_cpu_image_answers_offline_with_the_embedded_model(built: dict) -> None:
    imports, completion = verify("radixserve-cpu")
    assert imports.startswith("torch "), imports
    assert "Paris" in completion, completion


def test_operator_image_has_the_operator_and_no_torch(built: dict) -> None:
    imports, _, usage = verify("radixserve-operator")  # the second check fails if torch is there
    assert imports.startswith("kopf "), imports
    assert "--all-namespaces" in usage, usage


def test_router_image_runs_the_pinned_gateway(built: dict) -> None:
    from scripts.images.lock import dockerfile_arg

    (version,) = verify("radixserve-router")
    assert dockerfile_arg("SMG_VERSION") in version, version

"""The chart's optional sample is the same InferenceService as manifests/samples/."""

from __future__ import annotations

import pytest
import yaml

from tests.deploy.support import REPO, of_kind, one

SAMPLES = REPO / "manifests" / "samples"


def test_no_sample_by_default(render) -> None:
    assert not of_kind(render(), "InferenceService")


@pytest.mark.parametrize(
    "variant, file", [("cpu", "inferenceservice-cpu.yaml"), ("gpu", "inferenceservice.yaml")]
)
def test_sample_equals_the_manifest_sample(render, variant: str, file: str) -> None:
    expected = yaml.safe_load((SAMPLES / file).read_text())
    got = one(
        render({"sample": {"enabled": True, "variant": variant}}, namespace="llm"),
        "InferenceService",
    )
    assert got["apiVersion"] == expected["apiVersion"] == "radixserve.dev/v1alpha1"
    assert got["spec"] == expected["spec"]
    assert got["metadata"]["name"] == expected["metadata"]["name"]
    assert got["metadata"]["namespace"] == "llm"


def test_cpu_sample_requests_no_gpu(render) -> None:
    spec = one(render({"sample": {"enabled": True}}), "InferenceService")["spec"]
    assert spec["gpu"]["enabled"] is False and spec["parallelism"]["tensor"] == 1
    assert spec["image"].endswith("-cpu")


def test_sample_name_override(render) -> None:
    got = one(
        render({"sample": {"enabled": True, "variant": "gpu", "name": "my-llm"}}),
        "InferenceService",
    )
    assert got["metadata"]["name"] == "my-llm"

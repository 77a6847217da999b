"""The chart's optional sample is the same InferenceService as manifests/samples/."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.deploy.support import CHART_DIR, REPO, of_kind, one

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


def test_sample_serves_the_lora_adapters_of_the_values(render) -> None:
    from radixserve_operator.builders import build_workload
    from radixserve_operator.spec import parse_spec

    adapters = [{"name": "sql", "source": "org/sql-lora"}, {"name": "chat", "source": "pvc://ads/chat"}]
    got = one(render({"sample": {"enabled": True, "loraAdapters": adapters}}), "InferenceService")
    expected = yaml.safe_load((SAMPLES / "inferenceservice-cpu.yaml").read_text())["spec"]
    assert got["spec"] == expected | {"lora": {"adapters": adapters}}
    pod = build_workload(parse_spec(got), 1, 1)["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--lora-paths") + 1:] == ["sql=org/sql-lora", "chat=/lora/ads/chat"]


def test_sample_decodes_speculatively_as_the_values_say(render) -> None:
    from radixserve_operator.builders import build_workload
    from radixserve_operator.spec import parse_spec

    speculative = {"algorithm": "draft", "numDraftTokens": 6, "draftModel": {"source": "org/small-draft"}}
    got = one(render({"sample": {"enabled": True, "speculative": speculative}}), "InferenceService")
    expected = yaml.safe_load((SAMPLES / "inferenceservice-cpu.yaml").read_text())["spec"]
    assert got["spec"] == expected | {"speculative": speculative}
    pod = build_workload(parse_spec(got), 1, 1)["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--speculative-algorithm"):] == [
        "--speculative-algorithm", "draft", "--speculative-num-draft-tokens", "6",
        "--speculative-draft-model-path", "org/small-draft"]
    assert [c["name"] for c in pod["initContainers"]] == ["draft-download"]


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


def test_the_samples_speculative_values_take_the_crds_fields() -> None:
    """values.schema.json's sample.speculative declares what spec.speculative has: each field and
    each algorithm of the CRD can be set through the chart."""
    from radixserve_operator.crd import crd

    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    values = schema["properties"]["sample"]["properties"]["speculative"]["properties"]
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    fields = spec["properties"]["speculative"]["properties"]
    assert set(values) == set(fields)
    assert values["algorithm"]["enum"] == fields["algorithm"]["enum"]

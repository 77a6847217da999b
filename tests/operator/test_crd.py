"""The CRD: a valid apiextensions.k8s.io/v1 object, a structural schema, the chart's YAML in sync,
samples accepted and invalid samples refused by its openAPIV3Schema (through jsonschema).

Its CEL rules (x-kubernetes-validations), read from the chart's CRD file, run here through
cel-python as the API server would run them; the operator's parser, which evaluates the same
table (`rules.py`), must refuse the same resources with the same field and message, and accept
the near misses."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import pytest
import yaml

from radixserve_operator import rules
from radixserve_operator.crd import crd, openapi_schema, to_yaml
from radixserve_operator.rules import RULES
from radixserve_operator.spec import SpecError, apply_defaults, parse_spec

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "charts/radixserve/crds/inferenceservices.radixserve.dev.yaml"
SAMPLES = sorted((ROOT / "manifests/samples").glob("inferenceservice*.yaml"))
HERE = Path(__file__).parent


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def to_json_schema(node: Any) -> Any:
    """A Kubernetes structural schema as Draft-4 JSON Schema (whose boolean exclusiveMinimum it
    shares): objects with properties refuse unknown fields, as `kubectl apply` (strict field
    validation) does, unless they preserve unknown fields; x-kubernetes-* keys are dropped."""
    if isinstance(node, list):
        return [to_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: to_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if "properties" in node:
        out["properties"] = {k: to_json_schema(v) for k, v in node["properties"].items()}
        if (
            not node.get("x-kubernetes-preserve-unknown-fields")
            and "additionalProperties" not in node
        ):
            out["additionalProperties"] = False
    return out


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft4Validator:
    schema = to_json_schema(openapi_schema())
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


def test_crd_is_a_valid_apiextensions_v1_object(validate_k8s) -> None:
    validate_k8s(crd())


def test_chart_crd_file_matches_crd_py() -> None:
    assert CRD_FILE.read_text() == to_yaml(), (
        "regenerate: python -m radixserve_operator.crd > " + str(CRD_FILE)
    )
    assert yaml.safe_load(CRD_FILE.read_text()) == crd()


def test_module_prints_the_yaml() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "radixserve_operator.crd"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == to_yaml()


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield path, node
        for k, v in node.get("properties", {}).items():
            yield from _walk(v, f"{path}.{k}")
        if isinstance(node.get("items"), dict):
            yield from _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural() -> None:
    for path, node in _walk(openapi_schema()):
        if node.get("x-kubernetes-int-or-string"):
            # the only anyOf a structural schema allows for int-or-string
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
            assert "type" not in node, path
        else:
            assert "type" in node, f"{path} has no type"
            assert "anyOf" not in node and "oneOf" not in node, path
        if "default" in node and node.get("type") == "object":
            assert isinstance(node["default"], dict), path


def test_subresources_and_columns() -> None:
    version = crd()["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert version["subresources"]["status"] == {}
    names = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert names[:1] == ["Ready"] and {"Replicas", "TP", "Model", "Age"} <= set(names)
    assert crd()["spec"]["names"]["shortNames"] == ["rsvc"]
    assert crd()["spec"]["scope"] == "Namespaced"


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_samples_validate_and_parse(sample: Path, validator) -> None:
    for doc in _docs(sample):
        validator.validate(doc)
        validator.validate(
            apply_defaults(openapi_schema(), copy.deepcopy(doc))
        )  # defaults are valid too
        assert cel_refusals(doc) == [], sample.name
        assert operator_refusal(doc) is None, sample.name


def test_cpu_sample_asks_for_no_gpu_and_gpu_sample_sizes_tp(validate_k8s, fetch) -> None:
    from radixserve_operator.reconcile import plan

    by_name = {d["metadata"]["name"]: d for s in SAMPLES for d in _docs(s)}
    assert set(by_name) == {"qwen3-0-6b", "smollm2-cpu"}
    for name, doc in by_name.items():
        body = {
            **doc,
            "metadata": {**doc["metadata"], "namespace": "default", "uid": "u", "generation": 1},
        }
        spec, tp, objects, _ = plan(body, fetch)
        for obj in objects:
            validate_k8s(obj)
        res = objects[0]["spec"]["template"]["spec"]["containers"][0]["resources"]
        if name == "smollm2-cpu":
            assert not any("gpu" in k for part in res.values() for k in part)
        else:
            assert (spec.tensor, tp, res["limits"]["nvidia.com/gpu"]) == ("auto", 1, 1)


@pytest.mark.parametrize(
    "doc", _docs(HERE / "invalid/schema.yaml"), ids=lambda d: d["metadata"]["name"]
)
def test_schema_refuses_invalid_samples(doc: dict[str, Any], validator) -> None:
    errors = list(validator.iter_errors(doc))
    assert errors, f"{doc['metadata']['name']} was accepted"
    assert all(e.absolute_path and e.absolute_path[0] == "spec" for e in errors)


# --- CEL: the rules of the CRD file (what the API server gets), evaluated by cel-python here,
# against the operator's parser, which evaluates rules.py's table.
def _file_rules() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(path under spec, the node's schema, the validation) of every rule in the CRD file; the
    rules on the resource itself (which may read metadata.name) at path ROOT."""
    root = yaml.safe_load(CRD_FILE.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return [(rules.ROOT, root, v) for v in root.get("x-kubernetes-validations", ())] + [
        (path, node, v)
        for path, node in _walk(root["properties"]["spec"])
        for v in node.get("x-kubernetes-validations", ())
    ]


def _as_api_server_types(schema: dict[str, Any], value: Any) -> Any:
    """JSON as the API server hands it to CEL: a `number` field is a double even when written 80."""
    if isinstance(value, dict):
        extra = schema.get("additionalProperties")
        props = schema.get("properties") or {}
        return {
            k: _as_api_server_types(props.get(k) or (extra if isinstance(extra, dict) else {}), v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_as_api_server_types(schema.get("items") or {}, v) for v in value]
    if schema.get("type") == "number" and type(value) is int:
        return float(value)
    return value


def _at(obj: dict[str, Any], path: str) -> Any:
    for key in filter(None, path.split(".")):
        if key not in obj:
            return None
        obj = obj[key]
    return obj


def cel_refusals(doc: dict[str, Any]) -> list[str]:
    """"FIELD: message" of each CRD rule the (defaulted) resource breaks, FIELD as the API server
    names it; a rule on an absent field does not run."""
    spec = apply_defaults(openapi_schema(), copy.deepcopy(doc))["spec"]
    env = celpy.Environment()
    out = []
    for path, node, v in _file_rules():
        if path == rules.ROOT:  # the API server shows the resource only its name of the metadata
            value = {"metadata": {"name": doc["metadata"]["name"]}, "spec": spec}
        else:
            value = _at(spec, path)
        if value is None:
            continue
        self_ = celpy.json_to_cel(_as_api_server_types(node, value))
        if not env.program(env.compile(v["rule"])).evaluate({"self": self_}):
            if path == rules.ROOT:  # the message names metadata.name itself
                out.append(v["message"])
            else:
                out.append(f"spec{path}{v.get('fieldPath', '')}: {v['message']}")
    return out


def operator_refusal(doc: dict[str, Any]) -> str | None:
    try:
        parse_spec({**doc, "metadata": {**doc["metadata"], "namespace": "default"}})
    except SpecError as e:
        return str(e)
    return None


CEL_INVALID = _docs(HERE / "invalid/cel.yaml") + _docs(HERE / "invalid/names.yaml")


def test_crd_file_carries_the_rules_table_each_at_its_path() -> None:
    in_file = [(path if path == rules.ROOT else path.lstrip("."), v) for path, _, v in _file_rules()]
    in_table = [(r.path, r.validation()) for r in RULES]
    assert sorted(in_file, key=repr) == sorted(in_table, key=repr)
    assert len(RULES) == 34 and len({r.rule for r in RULES}) == len(RULES)


def test_every_rule_has_a_sample_that_breaks_it() -> None:
    broken = {d["metadata"]["annotations"]["rule"] for d in CEL_INVALID}
    assert {r.message for r in RULES} <= broken


@pytest.mark.parametrize("doc", CEL_INVALID, ids=lambda d: d["metadata"]["name"])
def test_each_rule_refuses_its_sample_in_the_crd_and_in_the_operator(doc, validator) -> None:
    validator.validate(doc)  # the OpenAPI part alone would accept it
    refused = cel_refusals(doc)
    assert [r.split(": ", 1)[1] if r.startswith("spec") else r for r in refused] == [
        doc["metadata"]["annotations"]["rule"]
    ]
    said = operator_refusal(doc)
    assert said is not None, "the operator accepted what the CRD refuses"
    assert said.startswith(refused[0]), said  # the same field and message
    assert said.count("; ") == 0, said  # and no other rule


@pytest.mark.parametrize("doc", CEL_INVALID, ids=lambda d: d["metadata"]["name"])
def test_without_the_rules_table_the_operator_accepts_the_samples(doc, monkeypatch) -> None:
    """The operator's refusals above come from the table, not from a Python copy of a rule."""
    monkeypatch.setattr(rules, "RULES", ())
    assert operator_refusal(doc) is None


NEAR_MISSES = [
    {"model": {"source": "pvc://weights/llama-3"}},
    {"rollout": {"maxSurge": 1, "maxUnavailable": 0}},
    {"rollout": {"strategy": "Recreate", "maxSurge": 0, "maxUnavailable": "0%"}},
    {"parallelism": {"tensor": "auto"}, "gpu": {"memoryGiB": 80}},
    {"parallelism": {"tensor": "auto"}, "gpu": {"enabled": False}},
    {"parallelism": {"tensor": 1}, "gpu": {"enabled": False}},
    {"modelCache": {"pvc": {"claimName": "weights"}}},
    {"model": {"cache": {"type": "emptyDir", "sizeLimit": "20Gi"}}},
    {"model": {"cache": {"type": "sharedPVC", "claimName": "weights", "readOnly": True}}},
    {"model": {"cache": {"type": "pvcPerReplica", "size": "50Gi", "storageClassName": "fast",
                         "accessModes": ["ReadWriteOnce"]}}},
    {"model": {"cache": {"type": "pvcPerReplica", "size": "50Gi"}},
     "rollout": {"maxSurge": "0%", "maxUnavailable": 1}},
    {"template": {"metadata": {"labels": {"app.kubernetes.io/part-of": "llm"}}}},
    {"template": {"spec": {"container": {"resources": {"limits": {"cpu": "4"}}}}}},
    {"gpu": {"resourceName": "amd.com/gpu"},
     "template": {"spec": {"container": {"resources": {"limits": {"nvidia.com/gpu": 1}}}}}},
    {"autoscaling": {"minReplicas": 2, "maxReplicas": 2}},
    {"autoscaling": {"engine": "keda", "minReplicas": 0, "maxReplicas": 2}},
    {"autoscaling": {"maxReplicas": 2, "metric": "kvCache", "target": 1}},  # an integer: a double
    {"autoscaling": {"maxReplicas": 2, "metric": "tokens", "target": 800}},
    {"speculative": {"algorithm": "ngram", "ngram": {"minMatchWindow": 8}}},  # max: the runtime's 8
    {"speculative": {"algorithm": "ngram", "ngram": {"maxMatchWindow": 2}}},  # min: the runtime's 2
    {"speculative": {"algorithm": "ngram", "numDraftTokens": 16, "ngram": {"minMatchWindow": 64,
                                                                            "maxMatchWindow": 64}}},
    {"model": {"source": "Qwen/Qwen3-8B", "revision": "v1.0"},
     "speculative": {"algorithm": "draft", "draftModel": {"source": "pvc://drafts/qwen3-0.6b"}}},
    {"speculative": {"algorithm": "draft", "draftModel": {"source": "/opt/draft"}}},
    {"speculative": {"algorithm": "draft", "draftModel": {"source": "Qwen/Qwen3-0.6B"}}},
    # trees: numSteps below numDraftTokens (left out: the runtime's 4), page size 1 said or not
    {"speculative": {"algorithm": "eagle3", "eagleTopk": 4, "numSteps": 2,
                     "draftModel": {"source": "/opt/eagle3"}}},
    {"runtime": {"pageSize": 1},
     "speculative": {"algorithm": "ngram", "numDraftTokens": 16, "numSteps": 16,
                     "ngram": {"maxBfsBreadth": 8}}},
    # chains: numSteps equal to numDraftTokens, eagleTopk 1 beside ngram, any page size
    {"runtime": {"pageSize": 16},
     "speculative": {"algorithm": "ngram", "numSteps": 4, "eagleTopk": 1,
                     "ngram": {"maxBfsBreadth": 1}}},
    {"speculative": {"algorithm": "draft", "numDraftTokens": 6, "numSteps": 6, "eagleTopk": 1,
                     "draftModel": {"source": "/opt/draft"}}},
]  # fmt: skip


@pytest.mark.parametrize("spec", NEAR_MISSES, ids=lambda s: json.dumps(s)[:60])
def test_near_misses_pass_the_crd_and_the_operator(spec, make_body, validator) -> None:
    doc = make_body(spec)
    validator.validate(doc)
    assert cel_refusals(doc) == []
    assert operator_refusal(doc) is None


def test_a_value_under_a_rule_is_named_in_the_operators_message(make_body) -> None:
    said = operator_refusal(make_body({"model": {"source": "pvc://Bad_Claim"}}))
    assert said == "spec.model.source: a pvc source is pvc://CLAIM/path, got 'pvc://Bad_Claim'"


def test_a_value_of_the_wrong_type_is_refused_before_any_rule_runs(make_body) -> None:
    """A value of the wrong type (from an older CRD or no API server) is refused by the schema's
    type, as the API server's OpenAPI validation refuses it before its CEL rules run."""
    said = operator_refusal(make_body({"autoscaling": {"minReplicas": "two", "maxReplicas": 2}}))
    assert said == "spec.autoscaling.minReplicas: must be of type integer"


def test_docs_describe_every_spec_field() -> None:
    doc = (ROOT / "docs/operator.md").read_text()
    spec = openapi_schema()["properties"]["spec"]["properties"]
    for key, node in spec.items():
        assert f"`{key}`" in doc or f"`{key}." in doc, key
        if key in (
            "model", "gpu", "runtime", "rollout", "service", "parallelism", "probes",
            "disruptionBudget", "autoscaling", "speculative",
        ):  # fmt: skip
            for sub in node["properties"]:
                assert f"`{key}.{sub}`" in doc, f"{key}.{sub}"
    cache = spec["model"]["properties"]["cache"]["properties"]
    for sub in cache:
        assert f"`{sub}`" in doc, f"model.cache.{sub}"
    for kind in cache["type"]["enum"]:
        assert f"`{kind}`" in doc, kind


def test_the_worked_example_is_the_gpu_sample() -> None:
    """docs/operator.md's worked example shows manifests/samples/inferenceservice.yaml as it is."""
    doc = (ROOT / "docs/operator.md").read_text()
    head = "# manifests/samples/inferenceservice.yaml\n"
    shown = doc[doc.index(head) :].split("```", 1)[0]
    sample = ROOT / "manifests/samples/inferenceservice.yaml"
    assert yaml.safe_load(shown) == yaml.safe_load(sample.read_text())


def test_every_bound_survives_the_api_servers_float64() -> None:
    """The API server keeps minimum/maximum as float64 and writes back the shortest decimal: a
    bound it would rewrite (2**60 comes back as 1152921504606847000) makes the stored CRD differ
    from the chart's, which Helm's server-side apply then reports as a conflict."""
    from decimal import Decimal

    for path, node in _walk(openapi_schema()):
        for key in ("minimum", "maximum"):
            if key in node:
                assert Decimal(repr(float(node[key]))) == node[key], (path, key, node[key])

"""The CRD: a valid apiextensions.k8s.io/v1 object, a structural schema, the chart's YAML in sync,
samples accepted and invalid samples refused by its openAPIV3Schema (through jsonschema).

CEL rules (x-kubernetes-validations) cannot run here: each is translated to Python below, the
translation is checked against samples, and the operator's parser must refuse the same resources."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from radixserve_operator.crd import (
    _NO_TEMPLATE_GPU,
    _PER_REPLICA_ROLLOUT,
    crd,
    openapi_schema,
    to_yaml,
)
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
        for rule, check in _cel_rules(doc):
            assert check(doc), f"{sample.name} breaks CEL rule {rule!r}"
        parse_spec({**doc, "metadata": {**doc["metadata"], "namespace": "default"}})


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


# --- CEL: each rule of the CRD, translated to Python by hand (same operators, same order).
def _z(v: Any) -> bool:
    return str(v) in ("0", "0%")  # CEL: string(x) in ['0', '0%']


CEL_TWINS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "!self.startsWith('pvc://') || self.matches('^pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/.+$')": lambda s: (
        not s.startswith("pvc://")
        or __import__("re").search(r"^pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/.+$", s) is not None
    ),
    "has(self.pvc) != has(self.emptyDir)": lambda s: ("pvc" in s) != ("emptyDir" in s),
    "self.strategy != 'RollingUpdate' || !(string(self.maxSurge) in ['0', '0%'] && string(self.maxUnavailable) in ['0', '0%'])": lambda s: (
        s["strategy"] != "RollingUpdate" or not (_z(s["maxSurge"]) and _z(s["maxUnavailable"]))
    ),
    "string(self.parallelism.tensor) != 'auto' || !self.gpu.enabled || has(self.gpu.memoryGiB)": lambda s: (
        str(s["parallelism"]["tensor"]) != "auto"
        or not s["gpu"]["enabled"]
        or "memoryGiB" in s["gpu"]
    ),
    "self.gpu.enabled || string(self.parallelism.tensor) in ['1', 'auto']": lambda s: (
        s["gpu"]["enabled"] or str(s["parallelism"]["tensor"]) in ("1", "auto")
    ),
    "!has(self.labels) || !self.labels.exists(k, k in ['app.kubernetes.io/name', 'app.kubernetes.io/instance'])": lambda s: (
        not set(s.get("labels") or {}) & {"app.kubernetes.io/name", "app.kubernetes.io/instance"}
    ),
    "!has(self.command) && !has(self.args)": lambda s: "command" not in s and "args" not in s,
    _NO_TEMPLATE_GPU: lambda s: not any(
        s["gpu"]["resourceName"]
        in ((s.get("template") or {}).get("spec") or {}).get("container", {}).get("resources", {}).get(part, {})
        for part in ("limits", "requests")
    ),
    _PER_REPLICA_ROLLOUT: lambda s: (
        "cache" not in s["model"]
        or s["model"]["cache"]["type"] != "pvcPerReplica"
        or (s["rollout"]["strategy"] == "RollingUpdate" and _z(s["rollout"]["maxSurge"]))
    ),
    "self.type != 'sharedPVC' || has(self.claimName)": lambda s: (
        s["type"] != "sharedPVC" or "claimName" in s
    ),
    "self.type == 'sharedPVC' || (!has(self.claimName) && !has(self.readOnly))": lambda s: (
        s["type"] == "sharedPVC" or ("claimName" not in s and "readOnly" not in s)
    ),
    "self.type == 'pvcPerReplica' || (!has(self.size) && !has(self.storageClassName) && !has(self.accessModes))": lambda s: (
        s["type"] == "pvcPerReplica"
        or ("size" not in s and "storageClassName" not in s and "accessModes" not in s)
    ),
    "self.type != 'pvcPerReplica' || has(self.size)": lambda s: (
        s["type"] != "pvcPerReplica" or "size" in s
    ),
    "self.type == 'emptyDir' || !has(self.sizeLimit)": lambda s: (
        s["type"] == "emptyDir" or "sizeLimit" not in s
    ),
    "self.minReplicas <= self.maxReplicas": lambda s: s["minReplicas"] <= s["maxReplicas"],
    "self.minReplicas > 0 || self.engine == 'keda'": lambda s: (
        s["minReplicas"] > 0 or s["engine"] == "keda"
    ),
    "self.metric != 'kvCache' || !has(self.target) || self.target <= 1.0": lambda s: (
        s["metric"] != "kvCache" or "target" not in s or s["target"] <= 1.0
    ),
}


def _rules() -> list[tuple[str, str, str]]:
    """(path under spec, rule, message) of every CEL rule in the schema."""
    spec = openapi_schema()["properties"]["spec"]
    return [
        (p, r["rule"], r["message"])
        for p, node in _walk(spec)
        for r in node.get("x-kubernetes-validations", ())
    ]


def _at(obj: dict[str, Any], path: str) -> Any:
    for key in filter(None, path.split(".")):
        if key not in obj:
            return None
        obj = obj[key]
    return obj


def _cel_rules(doc: dict[str, Any]) -> list[tuple[str, Callable[[dict[str, Any]], bool]]]:
    """Each rule bound to the (defaulted) value it guards; rules on absent fields don't run."""
    spec = apply_defaults(openapi_schema(), copy.deepcopy(doc))["spec"]
    out = []
    for path, rule, message in _rules():
        value = _at(spec, path)
        if value is not None:
            out.append((message, lambda _d, v=value, r=rule: CEL_TWINS[r](v)))
    return out


def test_every_cel_rule_has_a_python_twin() -> None:
    assert {r for _, r, _ in _rules()} == set(CEL_TWINS)


@pytest.mark.parametrize(
    "doc", _docs(HERE / "invalid/cel.yaml"), ids=lambda d: d["metadata"]["name"]
)
def test_cel_rules_refuse_what_the_schema_lets_through(doc: dict[str, Any], validator) -> None:
    validator.validate(doc)  # the OpenAPI part alone would accept it
    failed = [message for message, check in _cel_rules(doc) if not check(doc)]
    assert failed == [doc["metadata"]["annotations"]["rule"]]
    with pytest.raises(SpecError):  # and the operator refuses it as well
        parse_spec({**doc, "metadata": {**doc["metadata"], "namespace": "default"}})


def test_docs_describe_every_spec_field() -> None:
    doc = (ROOT / "docs/operator.md").read_text()
    spec = openapi_schema()["properties"]["spec"]["properties"]
    for key, node in spec.items():
        assert f"`{key}`" in doc or f"`{key}." in doc, key
        if key in (
            "model", "gpu", "runtime", "rollout", "service", "parallelism", "probes",
            "disruptionBudget", "autoscaling",
        ):  # fmt: skip
            for sub in node["properties"]:
                assert f"`{key}.{sub}`" in doc, f"{key}.{sub}"
    cache = spec["model"]["properties"]["cache"]["properties"]
    for sub in cache:
        assert f"`{sub}`" in doc, f"model.cache.{sub}"
    for kind in cache["type"]["enum"]:
        assert f"`{kind}`" in doc, kind

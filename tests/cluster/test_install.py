"""Installing as users do, judged by the real API server: the CRD is accepted (structural schema,
CEL within its cost limits) with its printer columns; the chart installs, upgrades and uninstalls
through the Helm library; every bad spec is refused at admission with the rule's message."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from radixserve_operator.spec import SpecError, parse_spec
from tests.cluster.scenario import (
    REPO,
    Stack,
    apply,
    cpu_spec,
    delete_and_wait,
    rsvc,
    try_apply,
    wait_ready,
)
from tests.e2e.kind_cluster import wait_for

pytestmark = pytest.mark.cluster
INVALID = REPO / "tests" / "operator" / "invalid"


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_crd_is_established_with_printer_columns_outside_all(stack: Stack, namespace: str) -> None:
    crd = stack.kubectl.json("get", "crd", "inferenceservices.radixserve.dev")
    established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert established == {**established, "Established": "True", "NamesAccepted": "True"}
    apply(stack, namespace, rsvc("columns", cpu_spec()))
    wait_ready(stack, namespace, "columns", 1)
    header, row = stack.kubectl("get", "rsvc", "-n", namespace).splitlines()
    assert header.split() == ["NAME", "READY", "REPLICAS", "AVAILABLE", "TP", "MODEL", "AGE"]
    assert row.split()[:6] == ["columns", "True", "1", "1", "1", "default"]
    wide = stack.kubectl("get", "rsvc", "columns", "-n", namespace, "-o", "wide")
    assert "RolloutComplete" in wide and f"http://columns.{namespace}.svc:8000/v1" in wide
    # `kubectl delete all` must not take the models: the CRD is not in the `all` category
    everything = stack.kubectl("get", "all", "-n", namespace, "-o", "name")
    assert "deployment.apps/columns" in everything and "inferenceservice" not in everything
    assert "columns" in stack.kubectl("get", "radixserve", "-n", namespace, "-o", "name")
    delete_and_wait(stack, namespace, "columns")


def _refusal_cases() -> list[tuple[str, dict, str]]:
    cases = [(d["metadata"]["name"], d, "") for d in _docs(INVALID / "schema.yaml")]
    cases += [
        (d["metadata"]["name"], d, d["metadata"]["annotations"]["rule"])
        for d in _docs(INVALID / "cel.yaml") + _docs(INVALID / "names.yaml")
    ]
    env = [{"name": "MY_FLAG", "value": "1"}, {"name": "MY_FLAG", "value": "2"}]
    cases.append(("env-repeated", rsvc("env-repeated", {"env": env}), "Duplicate value"))
    adapters = [{"name": "sql", "source": "org/a"}, {"name": "sql", "source": "org/b"}]
    cases.append(("lora-repeated", rsvc("lora-repeated", {"lora": {"adapters": adapters}}),
                  "Duplicate value"))
    return cases


@pytest.mark.parametrize("name, doc, says", _refusal_cases(), ids=lambda c: c if isinstance(c, str) else "")
def test_bad_specs_are_refused_at_admission(stack: Stack, namespace: str, name, doc, says) -> None:
    doc = {**doc, "metadata": {"name": name}}  # the annotation only names the rule for the tests
    accepted, output = try_apply(stack, namespace, doc)
    assert not accepted, f"the API server accepted {name}: {output}"
    assert "spec." in output or "metadata.name" in output, output  # names the offending field
    assert stack.kubectl.get("rsvc", name, namespace) is None
    if says:  # a CEL rule (or the env map): its message, and the operator agrees
        assert says in output, output
        with pytest.raises(SpecError):
            parse_spec({**doc, "metadata": {"name": name, "namespace": namespace}})


def test_chart_installs_upgrades_and_uninstalls_with_helm(stack: Stack) -> None:
    import helm_python as helm

    release, ns = "rs-helm", "rs-helm"
    operator = f"{release}-operator"
    values = {
        "fullnameOverride": release,
        "operator": {"replicas": 2, "peering": "rs-helm-peers"},
    }
    chart = str(REPO / "charts" / "radixserve")
    with helm.Config(kubeconfig_path=str(stack.kubeconfig), namespace=ns) as cfg:
        cfg.install(chart, release, values, namespace=ns, create_namespace=True, wait="watcher",
                    timeout=180)  # fmt: skip
        dep = stack.kubectl.json("get", "deployment", operator, "-n", ns)
        assert dep["status"].get("readyReplicas") == 2  # KWOK runs the operator pods
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--peering=rs-helm-peers" in args and "--verbose" not in args
        # peering enabled: kopf's peering CRD and the object the replicas join ship with it
        assert stack.kubectl.get("clusterkopfpeering", "rs-helm-peers", "") is not None

        cfg.upgrade(chart, release, {**values, "operator": {**values["operator"], "verbose": True}},
                    namespace=ns, wait="watcher", timeout=180)  # fmt: skip
        args = stack.kubectl.json("get", "deployment", operator, "-n", ns)["spec"]["template"][
            "spec"
        ]["containers"][0]["args"]
        assert "--verbose" in args

        cfg.uninstall(release, wait="watcher", timeout=120)
    wait_for(
        "the release's objects to go",
        lambda: stack.kubectl("get", "deployment,serviceaccount,role,rolebinding", "-n", ns,
                              "-l", f"app.kubernetes.io/instance={release}", "-o", "name") == ""
        and stack.kubectl.get("clusterrole", operator, "") is None
        and stack.kubectl("get", "validatingadmissionpolicy,validatingadmissionpolicybinding",
                          "-l", f"app.kubernetes.io/instance={release}", "-o", "name") == "",
        timeout=60,
    )  # fmt: skip
    # the CRD stays (Helm never deletes crds/): InferenceServices survive an uninstall
    assert stack.kubectl.get("crd", "inferenceservices.radixserve.dev", "") is not None
    stack.kubectl("delete", "namespace", ns, "--wait=false", check=False)

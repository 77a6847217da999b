"""manifests/ is what scripts/gen_manifests.py makes from the chart, and it installs a working
operator with plain `kubectl apply -f manifests/`."""

from __future__ import annotations

import shutil

import kubernetes_validate
import pytest
import yaml

from tests.deploy.support import CHART_DIR, CRD_FILE, K8S_VERSION, REPO, of_kind, one

MANIFESTS = REPO / "manifests"
CLUSTER_SCOPED = (
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
)
needs_crd = pytest.mark.skipif(not CRD_FILE.exists(), reason=f"{CRD_FILE.name} not generated yet")


@needs_crd
def test_generated_files_match_the_chart(gen) -> None:
    for path, text in gen.expected_files().items():
        assert path.exists(), f"{path} missing: run python scripts/gen_manifests.py"
        assert path.read_text() == text, (
            f"{path} drifted from the chart: run python scripts/gen_manifests.py"
        )


@needs_crd
def test_check_mode_reports_drift_and_a_rerun_fixes_it(gen, tmp_path, monkeypatch, capsys) -> None:
    shutil.copytree(MANIFESTS, tmp_path / "manifests")
    shutil.copytree(CHART_DIR, tmp_path / "chart")
    monkeypatch.setattr(gen, "MANIFESTS_DIR", tmp_path / "manifests")
    monkeypatch.setattr(gen, "CHART_DIR", tmp_path / "chart")
    operator_yaml = tmp_path / "manifests" / "operator.yaml"
    operator_yaml.write_text(operator_yaml.read_text().replace("replicas: 1", "replicas: 3"))
    (tmp_path / "chart" / "samples" / "inferenceservice-cpu.yaml").unlink()

    assert gen.main(["--check"]) == 1
    assert "operator.yaml" in capsys.readouterr().err
    assert gen.main([]) == 0
    assert gen.main(["--check"]) == 0
    assert "replicas: 1" in operator_yaml.read_text()
    assert (tmp_path / "chart" / "samples" / "inferenceservice-cpu.yaml").exists()


@needs_crd
def test_crd_manifest_is_the_chart_crd(gen) -> None:
    header_lines = gen.HEADER.count("\n")
    assert (MANIFESTS / "crd.yaml").read_text().split("\n", header_lines)[
        -1
    ] == CRD_FILE.read_text()
    crd = yaml.safe_load((MANIFESTS / "crd.yaml").read_text())
    kubernetes_validate.validate(crd, K8S_VERSION, strict=True)
    assert crd["spec"]["names"]["kind"] == "InferenceService"
    assert "rsvc" in crd["spec"]["names"]["shortNames"]
    (version,) = crd["spec"]["versions"]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"  # kubectl scale


def test_operator_manifest_is_a_complete_valid_install() -> None:
    objects = [o for o in yaml.safe_load_all((MANIFESTS / "operator.yaml").read_text()) if o]
    assert objects[0]["kind"] == "Namespace"
    ns = objects[0]["metadata"]["name"]
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        labels = obj["metadata"]["labels"]
        assert "helm.sh/chart" not in labels and labels["app.kubernetes.io/managed-by"] == "kubectl"
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"]["namespace"] == ns, obj["kind"]
    sa = one(objects, "ServiceAccount")["metadata"]["name"]
    dep = one(objects, "Deployment")
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == sa
    assert "--all-namespaces" in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    bound = {
        (s["namespace"], s["name"])
        for b in of_kind(objects, "ClusterRoleBinding")
        for s in b["subjects"]
    }
    assert bound == {(ns, sa)}
    assert not of_kind(objects, "InferenceService") and not of_kind(objects, "DaemonSet")

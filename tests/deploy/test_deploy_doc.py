"""docs/deploy.md (and the contributor guide, docs/development.md) say what the code does: every
command that reaches radixserve parses with its CLI (a pod of the runtime image that runs anything
but a radixserve subcommand passes `--command`), the curl examples name a model the samples
serve, and the RBAC paragraph names every grant of the chart and says which of them delete."""

from __future__ import annotations

import json
import re
import shlex

import pytest
import yaml

from radixserve.models.default_model import EMBEDDED_NAME
from tests.deploy.support import CHART_DIR, REPO
from tests.doc_commands import bad_commands, fenced_commands, radixserve_argv

DOCS = [REPO / "docs" / "deploy.md", REPO / "docs" / "development.md", REPO / "README.md"]
DEPLOY = REPO / "docs" / "deploy.md"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_commands_parse_with_the_cli(path) -> None:
    bad = bad_commands(path)
    assert not bad, "commands radixserve's CLI refuses:\n" + "\n".join(bad)


def test_a_pod_running_python_in_the_runtime_image_needs_command() -> None:
    """The image's entrypoint is `tini -- radixserve`: without `--command`, kubectl passes
    `python -c ...` to radixserve as its arguments."""
    run = ("kubectl run ask --rm -i --restart=Never --image=ghcr.io/radixserve/radixserve:0.1.0-cpu "
           "--image-pull-policy=Never{} -- python -c 'print(1)'")
    assert radixserve_argv(shlex.split(run.format(""))) == ["python", "-c", "print(1)"]
    assert radixserve_argv(shlex.split(run.format(" --command"))) is None


def _served_names() -> set[str]:
    """The model name each sample serves: servedName, else the source (`--model`), else the
    embedded model's directory name."""
    names = set()
    for path in (REPO / "manifests" / "samples").glob("*.yaml"):
        model = yaml.safe_load(path.read_text())["spec"]["model"]
        source = model.get("source", "default")
        names.add(model.get("servedName") or (EMBEDDED_NAME if source == "default" else source))
    return names


@pytest.mark.parametrize("path", [DEPLOY, REPO / "README.md"], ids=lambda p: p.name)
def test_curl_examples_name_a_served_model(path) -> None:
    served = _served_names()
    models = []
    for argv in fenced_commands(path.read_text()):
        if argv[:1] == ["curl"] and "-d" in argv:
            body = json.loads(argv[argv.index("-d") + 1])
            if "model" in body:
                models.append(body["model"])
    assert models, f"{path.name}: no curl with a model"
    assert set(models) <= served, f"{path.name}: {set(models) - served} is not served ({served})"


# each resource of the chart's RBAC rules as the paragraph names it
WORDS = {
    "inferenceservices": "InferenceServices", "inferenceservices/status": "`status`",
    "inferenceservices/finalizers": "`finalizers`", "deployments": "Deployments",
    "statefulsets": "StatefulSets", "services": "Services", "serviceaccounts": "ServiceAccounts",
    "roles": "Roles", "rolebindings": "RoleBindings", "pods": "Pods",
    "persistentvolumeclaims": "PersistentVolumeClaims", "events": "Events",
    "poddisruptionbudgets": "PodDisruptionBudgets",
    "horizontalpodautoscalers": "HorizontalPodAutoscalers", "scaledobjects": "ScaledObjects",
    "networkpolicies": "NetworkPolicies", "nodes": "nodes", "customresourcedefinitions": "CRDs",
    "clusterkopfpeerings": "`clusterkopfpeerings`", "kopfpeerings": "`kopfpeerings`",
}


def _chart_rules() -> dict[str, set[str]]:
    """resource -> verbs, over every rule the chart's RBAC templates can render."""
    rules: dict[str, set[str]] = {}
    for tpl in ("_rbac_rules.tpl", "rbac.yaml"):
        text = (CHART_DIR / "templates" / tpl).read_text()
        for res, verbs in re.findall(r"resources: \[(.*?)\]\n\s*verbs: \[(.*?)\]", text):
            for r in re.findall(r'"([a-z/]+)"', re.sub(r"\{\{.*?\}\}", " ", res)):
                rules.setdefault(r, set()).update(re.findall(r'"(\w+)"', verbs))
    return rules


def _rbac_paragraph() -> str:
    text = DEPLOY.read_text()
    start = text.index("**RBAC is least-privilege**")
    return text[start:text.index("```", start)]


def test_rbac_paragraph_names_every_grant_and_its_deletes() -> None:
    rules, para = _chart_rules(), _rbac_paragraph()
    assert {"services", "serviceaccounts", "roles", "rolebindings"} <= set(rules)
    bullets = para.split("\n- ")[1:]
    for resource, verbs in rules.items():
        word = WORDS.get(resource)
        assert word, f"the chart grants {resource}: name it in deploy.md's RBAC paragraph and here"
        named = re.compile(rf"(?<![\w`]){re.escape(word)}(?![\w`])")
        assert named.search(para), f"{word} not named"
        if "delete" in verbs:
            bullet = next((b for b in bullets
                           if named.search(" ".join(re.findall(r"\*\*(.+?)\*\*", b)))), None)
            assert bullet, f"no bullet names {word} in bold"
            assert "delete" in bullet and "never deleted" not in bullet, (
                f"{word}: the chart grants delete; say when the operator deletes them")


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_python_one_liners_compile(path) -> None:
    for argv in fenced_commands(path.read_text()):
        for i, tok in enumerate(argv[:-1]):
            if tok == "-c" and i and argv[i - 1] in ("python", "python3"):
                compile(argv[i + 1], f"{path.name}: python -c", "exec")

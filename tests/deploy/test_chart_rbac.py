"""RBAC is least-privilege: exactly what the operator uses, where it uses it. Grants are computed
from the rendered bindings (following roleRef), so a rule that is written but never bound, or
bound to another account, does not count."""

from __future__ import annotations

import pytest

from tests.deploy.support import REPO, VALUE_SETS, of_kind, one

CLUSTER = "*"  # grant on every namespace (or on a cluster-scoped resource)

# What the operator calls (docs/operator.md, "API access"; checked against it below).
WORKLOAD_ACCESS = {
    ("radixserve.dev", "inferenceservices"): {"get", "list", "watch", "patch"},
    ("radixserve.dev", "inferenceservices/status"): {"patch"},
    ("radixserve.dev", "inferenceservices/finalizers"): {"update"},  # blockOwnerDeletion
    # the workload: a Deployment, or a StatefulSet for a PVC per replica; the one the cache mode
    # no longer uses is deleted (and a StatefulSet whose claim template changed, pods kept)
    ("apps", "deployments"): {"get", "list", "watch", "create", "patch", "delete"},
    ("apps", "statefulsets"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "persistentvolumeclaims"): {"get"},  # a shared cache claim's access modes
    # watched: a deleted one returns; delete: spec.router's NAME-router when the router is turned off
    ("", "services"): {"get", "list", "watch", "create", "patch", "delete"},
    # spec.router: its account and a Role that lists and watches pods (held by the operator too)
    ("", "serviceaccounts"): {"get", "create", "patch", "delete"},
    ("rbac.authorization.k8s.io", "roles"): {"get", "create", "patch", "delete"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"get", "create", "patch", "delete"},
    ("", "pods"): {"list", "watch"},
    ("", "events"): {"create"},
    # optional children: server-side apply, and get + delete when the spec stops asking for one
    ("policy", "poddisruptionbudgets"): {"get", "create", "patch", "delete"},
    ("autoscaling", "horizontalpodautoscalers"): {"get", "create", "patch", "delete"},
    ("keda.sh", "scaledobjects"): {"get", "create", "patch", "delete"},
    # the pods' NetworkPolicy, deleted (its own only) when the operator's settings turn it off
    ("networking.k8s.io", "networkpolicies"): {"get", "create", "patch", "delete"},
}
# The only objects the operator ever deletes (its own, when the spec no longer asks for them).
DELETABLE = {
    ("apps", "deployments"),
    ("apps", "statefulsets"),
    ("policy", "poddisruptionbudgets"),
    ("autoscaling", "horizontalpodautoscalers"),
    ("keda.sh", "scaledobjects"),
    ("networking.k8s.io", "networkpolicies"),
    ("", "services"),  # the router's objects, when spec.router is turned off
    ("", "serviceaccounts"),
    ("rbac.authorization.k8s.io", "roles"),
    ("rbac.authorization.k8s.io", "rolebindings"),
}
NODE_READ = {("", "nodes"): {"list"}}
CRD_READ = {("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"}}
PEERING_VERBS = ("get", "list", "watch", "patch")


def _expand(where: str, access: dict) -> set[tuple[str, str, str, str]]:
    return {(where, group, res, verb) for (group, res), verbs in access.items() for verb in verbs}


def grants(objects: list[dict], account: tuple[str, str]) -> set[tuple[str, str, str, str]]:
    """(namespace or CLUSTER, apiGroup, resource, verb) the service account may use."""
    roles = {
        (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o["rules"]
        for o in objects
        if o["kind"] in ("Role", "ClusterRole")
    }
    out: set[tuple[str, str, str, str]] = set()
    for binding in of_kind(objects, "RoleBinding") + of_kind(objects, "ClusterRoleBinding"):
        subjects = {
            (s["namespace"], s["name"])
            for s in binding["subjects"]
            if s["kind"] == "ServiceAccount"
        }
        if account not in subjects:
            continue
        ref = binding["roleRef"]
        where = binding["metadata"].get("namespace", CLUSTER)
        role_ns = where if ref["kind"] == "Role" else None
        for rule in roles[(ref["kind"], role_ns, ref["name"])]:
            for group in rule["apiGroups"]:
                for res in rule["resources"]:
                    out |= {(where, group, res, verb) for verb in rule["verbs"]}
    return out


def operator_account(objects: list[dict]) -> tuple[str, str]:
    dep = one(objects, "Deployment")
    return dep["metadata"]["namespace"], dep["spec"]["template"]["spec"]["serviceAccountName"]


def test_cluster_scope_grants_exactly_what_the_operator_uses(render) -> None:
    objects = render()
    got = grants(objects, operator_account(objects))
    assert got == _expand(CLUSTER, WORKLOAD_ACCESS | NODE_READ | CRD_READ)


@pytest.mark.parametrize("ns", ["radixserve-system", "ml-serving"])
def test_namespaced_scope_defaults_to_the_release_namespace(render, ns: str) -> None:
    objects = render(VALUE_SETS["namespaced"], namespace=ns)
    got = grants(objects, operator_account(objects))
    assert got == _expand(ns, WORKLOAD_ACCESS) | _expand(CLUSTER, NODE_READ | CRD_READ)
    args = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--namespace={ns}" in args and "--all-namespaces" not in args


def test_namespaced_scope_without_cluster_reads_has_nothing_cluster_scoped(render) -> None:
    objects = render(VALUE_SETS["namespaced-strict"])
    assert not of_kind(objects, "ClusterRole") and not of_kind(objects, "ClusterRoleBinding")
    got = grants(objects, operator_account(objects))
    assert got == _expand("team-a", WORKLOAD_ACCESS) | _expand("team-b", WORKLOAD_ACCESS)
    args = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == [
        "--namespace=team-a",
        "--namespace=team-b",
    ]


@pytest.mark.parametrize(
    "values, where, resource",
    [
        (VALUE_SETS["peering"], CLUSTER, "clusterkopfpeerings"),
        (
            {"operator": {"scope": "namespaced", "peering": "radixserve"}},
            "radixserve-system",
            "kopfpeerings",
        ),
    ],
)
def test_peering_adds_only_the_peering_objects_of_the_scope(
    render, values, where, resource
) -> None:
    objects = render(values)
    got = grants(objects, operator_account(objects))
    peering = {g for g in got if g[1] == "kopf.dev"}
    assert peering == {(where, "kopf.dev", resource, v) for v in PEERING_VERBS}
    assert not {g for g in grants(render(), operator_account(render())) if g[1] == "kopf.dev"}


@pytest.mark.parametrize("name", VALUE_SETS)
def test_no_wildcards_secrets_privilege_verbs_or_deletes_but_optional_children(
    render, name: str
) -> None:
    for role in of_kind(render(VALUE_SETS[name]), "Role") + of_kind(
        render(VALUE_SETS[name]), "ClusterRole"
    ):
        for rule in role["rules"]:
            assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"], rule
            assert "secrets" not in rule["resources"], rule
            assert not {"deletecollection", "escalate", "bind", "impersonate"} & set(rule["verbs"])
            if "delete" in rule["verbs"]:
                pairs = {(g, r) for g in rule["apiGroups"] for r in rule["resources"]}
                assert pairs <= DELETABLE, rule


def test_rbac_create_false_renders_no_rbac(render) -> None:
    objects = render(VALUE_SETS["customised"])
    assert not [o for o in objects if o["apiVersion"].startswith("rbac.authorization.k8s.io/")]
    assert not of_kind(objects, "ServiceAccount")
    assert operator_account(objects) == ("radixserve-system", "existing-sa")


def test_every_resource_the_operator_handlers_watch_is_granted(render) -> None:
    """Read from kopf's registry, so a handler added for a new resource without RBAC fails here."""
    import kopf

    import radixserve_operator.handlers  # noqa: F401 -- registers the kopf handlers

    registry = kopf.get_default_registry()
    watched = {
        (h.selector.group, h.selector.plural or h.selector.any_name)
        for sub in (registry._watching, registry._changing, registry._spawning, registry._indexing)
        for h in sub.get_all_handlers()
    }
    changed = {
        (h.selector.group, h.selector.plural or h.selector.any_name)
        for h in registry._changing.get_all_handlers()
    }
    assert ("radixserve.dev", "inferenceservices") in changed
    for values, where in ((VALUE_SETS["defaults"], CLUSTER), (VALUE_SETS["namespaced"], "ns1")):
        objects = render(values, namespace="ns1")
        got = grants(objects, operator_account(objects))
        for group, plural in watched:
            assert {(where, group, plural, v) for v in ("list", "watch")} <= got, plural
        for group, plural in changed:  # kopf keeps handler progress in annotations
            assert (where, group, plural, "patch") in got, plural


def _documented_access() -> dict[tuple[str, str], set[str]]:
    """The operator's own list of API calls: the table under "API access" in docs/operator.md."""
    text = (REPO / "docs" / "operator.md").read_text()
    table = text.split("### API access", 1)[1].split("\n\n")[2]
    access: dict[tuple[str, str], set[str]] = {}
    for row in table.splitlines()[2:]:
        group_cell, resource_cell, verbs_cell = (c.strip() for c in row.strip("|").split("|")[:3])
        group = group_cell.split("`")[1].strip('"')
        for resource in resource_cell.split("`")[1::2]:
            access[(group, resource)] = {v.strip() for v in verbs_cell.split(",")}
    return access


def test_rbac_matches_the_operators_documented_api_access(render) -> None:
    documented = _documented_access()
    optional = {("", "namespaces")}  # only for --namespace globs; the chart passes exact names
    peering = {("kopf.dev", "clusterkopfpeerings"), ("kopf.dev", "kopfpeerings")}
    expected = {k: documented[k] for k in documented.keys() - optional - peering}
    assert expected == WORKLOAD_ACCESS | NODE_READ | CRD_READ
    for key in peering:
        assert documented[key] == set(PEERING_VERBS)

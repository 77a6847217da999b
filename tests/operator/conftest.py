"""Shared fixtures for the operator tests: real config.json shapes of well-known models (copied
from their hub repos), custom-resource bodies, and a fake of the small `ClusterClient`."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from radixserve_operator import API_VERSION, KIND

K8S_VERSION = "1.37.0"  # newest Kubernetes schema kubernetes-validate 1.37 ships

_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "vocab_size": 151936,
    "head_dim": 128,
    "torch_dtype": "bfloat16",
}
CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-0.6B": {
        **_QWEN3,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen3-14B": {
        **_QWEN3,
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "num_hidden_layers": 40,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
    },
    "Qwen/Qwen3-32B": {
        **_QWEN3,
        "hidden_size": 5120,
        "intermediate_size": 25600,
        "num_hidden_layers": 64,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
    },
    "meta-llama/Llama-3.1-70B-Instruct": {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 128256,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "Qwen/Qwen3-30B-A3B": {
        **_QWEN3,
        "architectures": ["Qwen3MoeForCausalLM"],
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "tie_word_embeddings": False,
    },
    "Qwen/Qwen3-235B-A22B": {
        **_QWEN3,
        "architectures": ["Qwen3MoeForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "moe_intermediate_size": 1536,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_hidden_layers": 94,
        "num_attention_heads": 64,
        "num_key_value_heads": 4,
        "tie_word_embeddings": False,
    },
}


def fake_fetch(repo_id: str, revision: str | None = None) -> dict[str, Any]:
    from radixserve_operator.modelconfig import ModelConfigNotFound

    if repo_id not in CONFIGS:
        raise ModelConfigNotFound(f"no config.json for {repo_id!r}")
    return copy.deepcopy(CONFIGS[repo_id])


def _make_body(
    spec: dict[str, Any], name: str = "llm", namespace: str = "serving", generation: int = 1
) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "generation": generation,
        },
        "spec": copy.deepcopy(spec),
    }


class FakeCluster:
    """An in-memory `ClusterClient`: applied objects are stored, a Deployment's
    metadata.generation moves when its spec changes (as the API server does), and the test plays
    the Deployment controller and the scheduler."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
        self.events: list[tuple[str, str, str]] = []
        self.applied: list[dict[str, Any]] = []
        self.status_patches: list[dict[str, Any]] = []
        self.gpu_nodes: int | None = 2
        self.node_lists = 0  # how often the handlers listed nodes
        self.deleted: list[tuple[str, str, str]] = []
        self.orphaned: list[tuple[str, str, str]] = []  # deleted leaving their dependents
        # API versions the cluster does not serve (a CRD not installed): apply raises
        self.missing_apis: set[str] = {"keda.sh/v1alpha1"}
        self.refused_kinds: set[str] = set()  # kinds the API server refuses as invalid
        self.dry_runs: list[dict[str, Any]] = []

    # -- ClusterClient
    def apply(self, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        from radixserve_operator.client import APIUnavailable, ApplyRejected

        if obj["apiVersion"] in self.missing_apis:
            raise APIUnavailable(f"{obj['apiVersion']} {obj['kind']} is not served by this cluster")
        if obj["kind"] in self.refused_kinds:
            raise ApplyRejected(f"{obj['kind']} {obj['metadata']['name']} rejected: invalid")
        if dry_run:
            self.dry_runs.append(copy.deepcopy(obj))
            return copy.deepcopy(obj)
        self.applied.append(copy.deepcopy(obj))
        key = (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        new, old = copy.deepcopy(obj), self.objects.get(key)
        generation = (
            1
            if old is None
            else old["metadata"]["generation"] + (old.get("spec") != new.get("spec"))
        )
        new["metadata"]["generation"] = generation
        new["status"] = copy.deepcopy(old.get("status", {})) if old else {}
        self.objects[key] = new
        return copy.deepcopy(new)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((kind, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def delete(
        self, api_version: str, kind: str, namespace: str, name: str, orphan: bool = False
    ) -> None:
        if self.objects.pop((kind, namespace, name), None) is not None:
            self.deleted.append((kind, namespace, name))
            if orphan:
                self.orphaned.append((kind, namespace, name))

    def list_pods(self, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(p)
            for p in self.pods
            if p["metadata"]["namespace"] == namespace
            and all(p["metadata"]["labels"].get(k) == v for k, v in selector.items())
        ]

    def count_gpu_nodes(self, resource_name: str) -> int | None:
        self.node_lists += 1
        return self.gpu_nodes

    def patch_status(
        self,
        namespace: str,
        name: str,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> None:
        self.status_patches.append(copy.deepcopy(status))
        self.objects[(KIND, namespace, name)].setdefault("status", {}).update(copy.deepcopy(status))

    def event(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    # -- test helpers
    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        self.objects[(KIND, body["metadata"]["namespace"], body["metadata"]["name"])] = (
            copy.deepcopy(body)
        )
        return self.resource(body["metadata"]["name"], body["metadata"]["namespace"])

    def resource(self, name: str = "llm", namespace: str = "serving") -> dict[str, Any]:
        return copy.deepcopy(self.objects[(KIND, namespace, name)])

    def edit_spec(
        self,
        change: Callable[[dict[str, Any]], None],
        name: str = "llm",
        namespace: str = "serving",
    ) -> dict[str, Any]:
        obj = self.objects[(KIND, namespace, name)]
        change(obj["spec"])
        obj["metadata"]["generation"] += 1
        return self.resource(name, namespace)

    def deployment(self, name: str = "llm", namespace: str = "serving") -> dict[str, Any]:
        return copy.deepcopy(self.objects[("Deployment", namespace, name)])

    def set_rollout(
        self,
        *,
        observed: bool,
        updated: int,
        ready: int,
        total: int,
        name: str = "llm",
        namespace: str = "serving",
    ) -> dict[str, Any]:
        dep = self.objects[("Deployment", namespace, name)]
        gen = dep["metadata"]["generation"]
        dep["status"] = {
            "observedGeneration": gen if observed else gen - 1,
            "replicas": total,
            "updatedReplicas": updated,
            "readyReplicas": ready,
        }
        return copy.deepcopy(dep)

    def reasons(self) -> list[str]:
        return [r for _, r, _ in self.events]


@pytest.fixture
def cluster() -> FakeCluster:
    from radixserve_operator import reconcile

    reconcile._gpu_nodes.clear()  # the operator's process-wide memories start empty per test
    reconcile._applied.clear()
    reconcile._validated.clear()
    return FakeCluster()


@pytest.fixture
def memo(cluster: FakeCluster) -> Any:
    import kopf

    return kopf.Memo(client=cluster, fetch_config=fake_fetch)


@pytest.fixture
def make_body() -> Callable[..., dict[str, Any]]:
    return _make_body


@pytest.fixture
def fetch() -> Callable[..., dict[str, Any]]:
    return fake_fetch


@pytest.fixture
def model_configs() -> dict[str, dict[str, Any]]:
    return copy.deepcopy(CONFIGS)


@pytest.fixture
def validate_k8s() -> Callable[[dict[str, Any]], None]:
    """Validate against the real Kubernetes OpenAPI schema, unknown fields rejected."""
    import kubernetes_validate

    def check(obj: dict[str, Any]) -> None:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)

    return check

"""An `InferenceService` custom resource -> a frozen, validated `ServiceSpec`.

Defaults come from the CRD schema itself (`apply_defaults`), as the API server applies them, so a
resource read before the CRD's defaults existed, or built by hand in a test, means the same thing.
The CRD's CEL rules are evaluated here too (`rules.py`), so an older CRD's resources are judged
by the rules of this operator."""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field
from typing import Any

from radixserve_operator.crd import PAGE_SIZES, ROUTER_POLICIES, TP_SIZES, spec_schema
from radixserve_operator.quantity import quantity_bytes
from radixserve_operator.rules import violations
from radixserve_operator.schema_check import schema_problems
from radixserve_operator.settings import OperatorSettings

DEFAULT_MODEL = "default"
_PVC_SOURCE = re.compile(r"^pvc://([a-z0-9]([-a-z0-9]*[a-z0-9])?)/(.+)$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
# --api-key and every prefix argparse would expand to it (--api, --api-k...), with or without =.
API_KEY_FLAG = re.compile(r"^--a(p(i(-(k(ey?)?)?)?)?)?(=.*)?$")
API_KEY_ENV = "RADIXSERVE_API_KEY"
# Flags the operator writes itself: a second one in extraArgs (argparse takes the last, and
# expands a prefix) would move the port the probes and Service use, the GPUs the pod was given,
# or the model, adapters and draft model that were downloaded (spec.lora, spec.speculative); help
# and version make the server exit at once.
OWNED_FLAGS = ("--model", "--tp", "--tp-size", "--host", "--port", "--device", "--help",
               "--version", "--lora-paths", "--enable-lora", "--max-loras-per-batch",
               "--max-lora-rank", "--speculative-algorithm", "--speculative-num-draft-tokens",
               "--speculative-num-steps", "--speculative-eagle-topk",
               "--speculative-draft-model-path", "--speculative-ngram-min-match-window-size",
               "--speculative-ngram-max-match-window-size",
               "--speculative-ngram-max-bfs-breadth",
               "--speculative-disable-by-batch-size")  # fmt: skip
# The spec field that sets an owned flag, where it is not the model, TP size or service port
_OWNED_BY = (("--speculative-", "spec.speculative"), ("--lora-", "spec.lora"),
             ("--enable-lora", "spec.lora"), ("--max-lora", "spec.lora"))  # fmt: skip
EXPOSED_SERVICE_TYPES = ("NodePort", "LoadBalancer")


class SpecError(ValueError):
    """The resource's spec is invalid; the message names the field."""


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting as the API server does it: missing properties take their schema
    default, then defaulting recurses into them."""
    if isinstance(value, dict) and "properties" in schema:
        for key, sub in schema["properties"].items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(sub, value[key])
    elif isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], v) for v in value]
    return value


def pvc_source(source: str) -> tuple[str, str] | None:
    """(claim, path inside the claim) of a pvc://CLAIM/path source, else None."""
    m = _PVC_SOURCE.match(source)
    return (m.group(1), m.group(3).strip("/")) if m else None


@dataclass(frozen=True)
class ModelSpec:
    source: str
    served_name: str | None
    revision: str | None
    hints: dict[str, Any] | None
    hf_token_secret: tuple[str, str] | None = None  # (Secret name, key) -> env HF_TOKEN

    @property
    def is_default(self) -> bool:
        return self.source == DEFAULT_MODEL

    @property
    def pvc(self) -> tuple[str, str] | None:
        """(claim, path inside the claim) for a pvc:// source."""
        return pvc_source(self.source)

    @property
    def hub_id(self) -> str | None:
        if self.is_default or self.source.startswith(("/", ".", "pvc://")):
            return None
        return self.source


DEFAULT_CACHE_SIZE = "100Gi"


@dataclass(frozen=True)
class CacheSpec:
    """The model cache at /models-cache: an emptyDir per pod, a PVC per replica (the workload is
    then a StatefulSet with a volumeClaimTemplate), or one existing claim shared by every pod."""

    type: str  # emptyDir | pvcPerReplica | sharedPVC (crd.CACHE_TYPES)
    size: str | int | None = DEFAULT_CACHE_SIZE  # emptyDir sizeLimit, or the per-replica PVC size
    storage_class: str | None = None  # pvcPerReplica ("" is a class too: static binding)
    access_modes: tuple[str, ...] = ("ReadWriteOnce",)  # pvcPerReplica
    claim_name: str | None = None  # sharedPVC
    read_only: bool = False  # sharedPVC: a claim filled beforehand, mounted read-only
    deprecated_field: bool = False  # read from spec.modelCache

    @property
    def per_replica(self) -> bool:
        return self.type == "pvcPerReplica"


@dataclass(frozen=True)
class GpuSpec:
    enabled: bool
    resource_name: str
    memory_gib: float | None


@dataclass(frozen=True)
class HierarchicalCacheSpec:
    """spec.runtime.hierarchicalCache: the runtime's host KV tier."""

    size_bytes: int | None  # per GPU (TP rank)
    ratio: float | None
    write_policy: str | None


@dataclass(frozen=True)
class RuntimeSpec:
    dtype: str | None
    page_size: int | None
    max_running_requests: int | None
    max_prefill_length: int | None
    memory_ratio: float
    cuda_graph_max_bs: int | None
    attention: str | None
    cache: str | None
    shutdown_timeout: int
    extra_args: tuple[str, ...]
    pre_stop_seconds: int = 0
    startup_timeout: int = 1800  # seconds from the container's start until it serves
    kv_cache_dtype: str | None = None
    context_length: int | None = None
    sampling_defaults: str | None = None
    prefill_graph_max_tokens: int | None = None
    hierarchical_cache: HierarchicalCacheSpec | None = None


@dataclass(frozen=True)
class ProbeTiming:
    initial_delay: int
    period: int
    timeout: int
    failure_threshold: int

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> ProbeTiming:
        return cls(
            raw["initialDelaySeconds"],
            raw["periodSeconds"],
            raw["timeoutSeconds"],
            raw["failureThreshold"],
        )

    @property
    def window_seconds(self) -> int:
        return self.initial_delay + self.period * self.failure_threshold


def startup_timing(raw: dict[str, Any], timeout: int) -> ProbeTiming:
    """The startup probe from spec.runtime.startupTimeoutSeconds: its window (initial delay +
    period x failures) covers the timeout; a failureThreshold given (or stored by an older CRD's
    default) can lengthen the window, never shorten it below the timeout."""
    delay, period = raw["initialDelaySeconds"], raw["periodSeconds"]
    needed = max(1, math.ceil(max(timeout - delay, 0) / period))
    return ProbeTiming(
        delay, period, raw["timeoutSeconds"], max(needed, raw.get("failureThreshold") or 0)
    )


@dataclass(frozen=True)
class RolloutSpec:
    strategy: str
    max_surge: int | str
    max_unavailable: int | str


def _is_zero(count: int | str) -> bool:
    return str(count) in ("0", "0%")


def effective_rollout(raw: dict[str, Any], per_replica: bool) -> RolloutSpec:
    """spec.rollout with the operator's defaults: surge first (maxSurge 1, maxUnavailable 0), so
    the last ready replica stays until its replacement is ready; maxSurge 0 alone means in place
    (maxUnavailable 1). A StatefulSet cannot surge: in place, maxUnavailable 1 unless given."""
    surge, unavailable = raw.get("maxSurge"), raw.get("maxUnavailable")
    if per_replica:
        return RolloutSpec(raw["strategy"], 0, 1 if unavailable is None else unavailable)
    surge = 1 if surge is None else surge
    if unavailable is None:
        unavailable = 1 if _is_zero(surge) else 0
    return RolloutSpec(raw["strategy"], surge, unavailable)


@dataclass(frozen=True)
class DisruptionBudgetSpec:
    enabled: bool
    max_unavailable: int | str


# metric -> (the per-pod custom metric the Prometheus Adapter serves, default target)
AUTOSCALING_METRICS: dict[str, tuple[str, float]] = {
    "requests": ("radixserve_requests_in_flight", 16),
    "kvCache": ("radixserve_kv_cache_usage_ratio", 0.8),
    "tokens": ("radixserve_generation_tokens_per_second", 500),
}


@dataclass(frozen=True)
class AutoscalingSpec:
    engine: str  # hpa | keda
    min_replicas: int
    max_replicas: int
    metric: str  # requests | kvCache | tokens
    target: float
    prometheus_url: str  # KEDA's Prometheus
    query: str | None  # KEDA: the user's PromQL instead of the metric's

    @property
    def metric_name(self) -> str:
        return AUTOSCALING_METRICS[self.metric][0]


@dataclass(frozen=True)
class NetworkSpec:
    """spec.networkPolicy: None where the resource leaves the operator's default."""

    ingress_from: tuple[dict[str, Any], ...] | None = None  # NetworkPolicyPeers
    egress: tuple[dict[str, Any], ...] | None = None  # NetworkPolicyEgressRules


def _hub_id(source: str) -> str | None:
    """A side source's hub id (a LoRA adapter's, a draft model's): neither a path nor pvc://."""
    return None if source.startswith(("/", "pvc://")) else source


@dataclass(frozen=True)
class SourceSpec:
    """Weights the pod reads beside the model's (a draft model's, an adapter's)."""

    source: str  # a hub id, pvc://CLAIM/path, or an absolute path in the pod

    @property
    def pvc(self) -> tuple[str, str] | None:
        """(claim, path inside the claim) for a pvc:// source."""
        return pvc_source(self.source)

    @property
    def hub_id(self) -> str | None:
        return _hub_id(self.source)


@dataclass(frozen=True)
class AdapterSpec(SourceSpec):
    name: str = ""


@dataclass(frozen=True)
class LoraSpec:
    """spec.lora: LoRA adapters served beside the model."""

    adapters: tuple[AdapterSpec, ...] = ()
    max_loras_per_batch: int | None = None
    max_lora_rank: int | None = None


@dataclass(frozen=True)
class SpeculativeSpec:
    """spec.speculative: speculative decoding; a field left None keeps the runtime's default."""

    algorithm: str  # crd.SPECULATIVE_ALGORITHMS
    num_draft_tokens: int | None = None
    draft_model: SourceSpec | None = None  # algorithms draft and eagle3
    min_match_window: int | None = None  # algorithm ngram
    max_match_window: int | None = None
    disable_by_batch_size: int | None = None
    num_steps: int | None = None
    eagle_topk: int | None = None  # algorithms draft and eagle3
    max_bfs_breadth: int | None = None  # algorithm ngram


@dataclass(frozen=True)
class RouterSpec:
    """spec.router: the SGLang model gateway in front of the replicas (`router.py`)."""

    enabled: bool = False
    policy: str = "cache_aware"  # ROUTER_POLICIES
    replicas: int = 1
    resources: dict[str, Any] = field(default_factory=dict)
    image: str | None = None  # default: the operator's router image


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    namespace: str
    model: ModelSpec
    image: str
    image_pull_policy: str
    replicas: int
    tensor: int | str  # an int, or "auto"
    gpu: GpuSpec
    runtime: RuntimeSpec
    resources: dict[str, Any]
    node_selector: dict[str, str]
    tolerations: tuple[dict[str, Any], ...]
    affinity: dict[str, Any] | None
    cache: CacheSpec
    shm_size: str | int
    rollout: RolloutSpec
    startup: ProbeTiming
    readiness: ProbeTiming
    liveness: ProbeTiming
    service_type: str
    service_port: int
    api_key_secret: tuple[str, str] | None
    env: tuple[dict[str, Any], ...]
    pod_labels: dict[str, str]
    pod_annotations: dict[str, str]
    pod_template: dict[str, Any] = field(default_factory=dict)  # spec.template.spec, as given
    disruption_budget: DisruptionBudgetSpec = DisruptionBudgetSpec(True, 1)
    autoscaling: AutoscalingSpec | None = None
    allow_unauthenticated: bool = False  # spec.service.allowUnauthenticated
    network: NetworkSpec = NetworkSpec()
    router: RouterSpec = RouterSpec()
    lora: LoraSpec | None = None  # None: LoRA off
    speculative: SpeculativeSpec | None = None  # None: no speculative decoding

    @property
    def exposed(self) -> bool:
        """Reachable from outside the cluster (a NodePort or LoadBalancer Service)."""
        return self.service_type in EXPOSED_SERVICE_TYPES

    @property
    def may_run_replicas(self) -> int:
        """The most replicas this resource may run: spec.replicas, or the autoscaler's maximum."""
        top = self.autoscaling.max_replicas if self.autoscaling else 0
        return max(self.replicas, top)


def _check(raw: dict[str, Any], schema: dict[str, Any], name: str) -> None:
    """The CRD's CEL rules, its OpenAPI checks (an older CRD may lack them), and what no schema
    says. `raw`: the defaulted spec; `schema`: the CRD's for spec; `name`: metadata.name. The
    OpenAPI part first, as the API server judges: a rule never sees a value of the wrong type or
    beyond its bounds."""
    problems = schema_problems(raw, schema)
    if problems:
        raise SpecError("; ".join(problems[:5]) + (" ..." if len(problems) > 5 else ""))
    failed = violations(raw, schema, name)
    if failed:
        raise SpecError("; ".join(failed))
    source, tensor = raw["model"]["source"], raw["parallelism"]["tensor"]
    if (
        source != DEFAULT_MODEL
        and not source.startswith(("/", ".", "pvc://"))
        and not _HUB_ID.match(source)
    ):
        raise SpecError(
            f"spec.model.source: not a hub id (org/name), path or pvc:// source: {source!r}"
        )
    if tensor != "auto" and (isinstance(tensor, bool) or tensor not in TP_SIZES):
        raise SpecError(
            f"spec.parallelism.tensor must be auto or one of {TP_SIZES}, got {tensor!r}"
        )
    if raw["replicas"] < 0:
        raise SpecError(f"spec.replicas must be >= 0, got {raw['replicas']}")
    # lists keyed by name (x-kubernetes-list-type map): the API server refuses a repeated name
    # before any rule runs ("Duplicate value"); here for a resource it never judged
    for where, items in (("spec.env", raw.get("env")),
                         ("spec.lora.adapters", (raw.get("lora") or {}).get("adapters"))):
        names = [e.get("name") for e in items or ()]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise SpecError(f"{where}: each name once, repeated: {', '.join(map(str, repeated))}")
    _check_key_in_clear(raw)
    _check_exposure(raw)
    rt = raw["runtime"]
    if not 0.0 < rt["memoryRatio"] <= 1.0:
        raise SpecError(f"spec.runtime.memoryRatio must be in (0, 1], got {rt['memoryRatio']}")
    if rt.get("pageSize") is not None and rt["pageSize"] not in PAGE_SIZES:
        raise SpecError(f"spec.runtime.pageSize must be a power of two, got {rt['pageSize']}")
    _check_owned_flags(rt.get("extraArgs") or ())


def _check_owned_flags(args: Any) -> None:
    for i, arg in enumerate(args):
        flag = str(arg).split("=", 1)[0]
        owned = [f for f in OWNED_FLAGS if len(flag) > 2 and f.startswith(flag)]
        if owned or flag == "-h":
            field = next((f for prefix, f in _OWNED_BY if owned and owned[0].startswith(prefix)), None)
            raise SpecError(
                f"spec.runtime.extraArgs[{i}]: {flag[:64]} is the operator's ({owned[0] if owned else '-h'}): "
                + (f"set it through {field}" if field else
                   "set the model, TP size and service port through their spec fields")
            )


def _cache(model: dict[str, Any], legacy: dict[str, Any] | None) -> CacheSpec:
    """spec.model.cache; else the deprecated spec.modelCache ({pvc: {claimName}} is a shared claim,
    {emptyDir: {sizeLimit}} an emptyDir); else an emptyDir of DEFAULT_CACHE_SIZE."""
    c = model.get("cache")
    if c is not None:
        kind = c["type"]
        return CacheSpec(
            type=kind,
            size=c.get("sizeLimit" if kind == "emptyDir" else "size", DEFAULT_CACHE_SIZE)
            if kind != "sharedPVC"
            else None,
            storage_class=c.get("storageClassName"),
            access_modes=tuple(c.get("accessModes") or ("ReadWriteOnce",)),
            claim_name=c.get("claimName"),
            read_only=bool(c.get("readOnly", False)),
        )
    if legacy is not None and "pvc" in legacy:
        return CacheSpec(
            "sharedPVC", None, claim_name=legacy["pvc"]["claimName"], deprecated_field=True
        )
    if legacy is not None:
        size = (legacy.get("emptyDir") or {}).get("sizeLimit", DEFAULT_CACHE_SIZE)
        return CacheSpec("emptyDir", size, deprecated_field=True)
    return CacheSpec("emptyDir")


def _check_key_in_clear(raw: dict[str, Any]) -> None:
    """The API key only from a Secret: a flag or a literal env value would show it to everyone
    who may read the pod spec (and in `ps`)."""
    for i, arg in enumerate(raw["runtime"].get("extraArgs") or ()):
        if API_KEY_FLAG.match(str(arg)):
            raise SpecError(
                f"spec.runtime.extraArgs[{i}]: {str(arg).split('=', 1)[0]} would put the API key "
                "in the pod spec in clear: put it in a Secret and name it in spec.apiKeySecretRef"
            )
    container = ((raw.get("template") or {}).get("spec") or {}).get("container") or {}
    template_env = ("spec.template.spec.container.env", container.get("env"))
    lists = (("spec.env", raw.get("env")), template_env)
    for where, env in lists:
        for i, e in enumerate(env or ()):
            if not isinstance(e, dict) or e.get("name") != API_KEY_ENV:
                continue
            if "value" in e:
                raise SpecError(
                    f"{where}[{i}]: {API_KEY_ENV} as a literal value is the API key in clear: "
                    "put it in a Secret and name it in spec.apiKeySecretRef"
                )
            # NOTE: any other source (a fieldRef to a missing annotation, an optional ConfigMap)
            # would replace the Secret's key with an empty one, which the server takes for none.
            raise SpecError(
                f"{where}[{i}]: {API_KEY_ENV} is set by the operator from spec.apiKeySecretRef "
                "only: remove this entry and name the Secret there"
            )


def _check_exposure(raw: dict[str, Any]) -> None:
    service = raw["service"]
    if (
        service["type"] in EXPOSED_SERVICE_TYPES
        and not raw.get("apiKeySecretRef")
        and not service.get("allowUnauthenticated")
    ):
        raise SpecError(
            f"spec.service.type {service['type']} exposes the server outside the cluster without "
            "an API key: set spec.apiKeySecretRef, or spec.service.allowUnauthenticated: true to "
            "serve anyone who can reach it"
        )


def _autoscaling(a: dict[str, Any] | None, settings: OperatorSettings) -> AutoscalingSpec | None:
    if a is None:
        return None
    prom = a.get("prometheus") or {}
    target = a.get("target")
    return AutoscalingSpec(
        engine=a["engine"],
        min_replicas=int(a["minReplicas"]),
        max_replicas=int(a["maxReplicas"]),
        metric=a["metric"],
        target=float(target if target is not None else AUTOSCALING_METRICS[a["metric"]][1]),
        prometheus_url=prom.get("serverAddress") or settings.prometheus_url,
        query=prom.get("query"),
    )


def _runtime(rt: dict[str, Any]) -> RuntimeSpec:
    return RuntimeSpec(
        dtype=rt.get("dtype"),
        page_size=rt.get("pageSize"),
        max_running_requests=rt.get("maxRunningRequests"),
        max_prefill_length=rt.get("maxPrefillLength"),
        memory_ratio=float(rt["memoryRatio"]),
        cuda_graph_max_bs=rt.get("cudaGraphMaxBs"),
        attention=rt.get("attention"),
        cache=rt.get("cache"),
        shutdown_timeout=int(rt["shutdownTimeoutSeconds"]),
        extra_args=tuple(str(a) for a in rt.get("extraArgs", ())),
        pre_stop_seconds=int(rt["preStopSeconds"]),
        startup_timeout=int(rt["startupTimeoutSeconds"]),
        kv_cache_dtype=rt.get("kvCacheDtype"),
        context_length=rt.get("contextLength"),
        sampling_defaults=rt.get("samplingDefaults"),
        prefill_graph_max_tokens=rt.get("prefillGraphMaxTokens"),
        hierarchical_cache=_hierarchical_cache(rt.get("hierarchicalCache")),
    )


def _hierarchical_cache(h: dict[str, Any] | None) -> HierarchicalCacheSpec | None:
    if h is None:
        return None
    size = h.get("size")
    return HierarchicalCacheSpec(None if size is None else quantity_bytes(size),
                                 None if h.get("ratio") is None else float(h["ratio"]),
                                 h.get("writePolicy"))


def parse_spec(body: dict[str, Any], settings: OperatorSettings | None = None) -> ServiceSpec:
    """Parse a custom resource (`body`: apiVersion, kind, metadata, spec) into a `ServiceSpec`;
    raises `SpecError` naming the offending field. `settings`: the operator's defaults (default:
    from its environment)."""
    settings = settings or OperatorSettings.from_env()
    schema = spec_schema()
    raw = apply_defaults(schema, copy.deepcopy(dict(body.get("spec") or {})))
    meta = body["metadata"]
    _check(raw, schema, str(meta["name"]))
    model, gpu, probes = raw["model"], raw["gpu"], raw["probes"]
    key_ref, hf_token = raw.get("apiKeySecretRef"), model.get("hfTokenSecret")
    cache = _cache(model, raw.get("modelCache"))
    pod_meta = (raw.get("template") or {}).get("metadata") or {}
    return ServiceSpec(
        name=meta["name"],
        namespace=meta.get("namespace") or "default",
        model=ModelSpec(
            model["source"],
            model.get("servedName"),
            model.get("revision"),
            model.get("parameters"),
            (hf_token["name"], hf_token["key"]) if hf_token else None,
        ),
        image=raw.get("image") or (settings.image if gpu["enabled"] else settings.cpu_image),
        image_pull_policy=raw["imagePullPolicy"],
        replicas=int(raw["replicas"]),
        tensor=raw["parallelism"]["tensor"],
        gpu=GpuSpec(gpu["enabled"], gpu["resourceName"], gpu.get("memoryGiB")),
        runtime=_runtime(raw["runtime"]),
        resources=raw.get("resources") or {},
        node_selector=raw.get("nodeSelector") or {},
        tolerations=tuple(raw.get("tolerations") or ()),
        affinity=raw.get("affinity"),
        cache=cache,
        shm_size=raw["shmSize"],
        rollout=effective_rollout(raw["rollout"], cache.per_replica),
        startup=startup_timing(probes["startup"], int(raw["runtime"]["startupTimeoutSeconds"])),
        readiness=ProbeTiming.parse(probes["readiness"]),
        liveness=ProbeTiming.parse(probes["liveness"]),
        service_type=raw["service"]["type"],
        service_port=int(raw["service"]["port"]),
        api_key_secret=(key_ref["name"], key_ref["key"]) if key_ref else None,
        env=tuple(raw.get("env") or ()),
        pod_labels=dict(pod_meta.get("labels") or {}),
        pod_annotations=dict(pod_meta.get("annotations") or {}),
        pod_template=copy.deepcopy((raw.get("template") or {}).get("spec") or {}),
        disruption_budget=DisruptionBudgetSpec(
            raw["disruptionBudget"]["enabled"], raw["disruptionBudget"]["maxUnavailable"]
        ),
        autoscaling=_autoscaling(raw.get("autoscaling"), settings),
        allow_unauthenticated=bool(raw["service"].get("allowUnauthenticated", False)),
        network=_network(raw.get("networkPolicy")),
        router=_router(raw.get("router")),
        lora=_lora(raw.get("lora")),
        speculative=_speculative(raw.get("speculative")),
    )


def _lora(raw: dict[str, Any] | None) -> LoraSpec | None:
    if raw is None:
        return None
    return LoraSpec(
        tuple(AdapterSpec(a["source"], a["name"]) for a in raw.get("adapters") or ()),
        raw.get("maxLorasPerBatch"),
        raw.get("maxLoraRank"),
    )


def _speculative(raw: dict[str, Any] | None) -> SpeculativeSpec | None:
    if raw is None:
        return None
    draft, ngram = raw.get("draftModel"), raw.get("ngram") or {}
    return SpeculativeSpec(
        raw["algorithm"],
        raw.get("numDraftTokens"),
        SourceSpec(draft["source"]) if draft else None,
        ngram.get("minMatchWindow"),
        ngram.get("maxMatchWindow"),
        raw.get("disableByBatchSize"),
        raw.get("numSteps"),
        raw.get("eagleTopk"),
        ngram.get("maxBfsBreadth"),
    )


def _router(raw: dict[str, Any] | None) -> RouterSpec:
    raw = raw or {}
    policy = raw.get("policy", "cache_aware")
    if policy not in ROUTER_POLICIES:
        raise SpecError(f"spec.router.policy must be one of {', '.join(ROUTER_POLICIES)}, got {policy!r}")
    if int(raw.get("replicas", 1)) < 1:
        raise SpecError(f"spec.router.replicas must be at least 1, got {raw['replicas']}")
    return RouterSpec(
        enabled=bool(raw.get("enabled", False)),
        policy=policy,
        replicas=int(raw.get("replicas", 1)),
        resources=copy.deepcopy(raw.get("resources") or {}),
        image=raw.get("image"),
    )


def _network(raw: dict[str, Any] | None) -> NetworkSpec:
    raw = raw or {}
    peers, egress = raw.get("ingressFrom"), raw.get("egress")
    return NetworkSpec(
        tuple(copy.deepcopy(peers)) if peers is not None else None,
        tuple(copy.deepcopy(egress)) if egress is not None else None,
    )

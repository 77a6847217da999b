"""The `InferenceService` CRD, the one source of its schema: the chart's YAML is generated from it
(`python -m radixserve_operator.crd`) and `spec.py` applies its defaults, so they never disagree.

Its CEL rules come from `rules.py`, whose table the operator evaluates too."""

from __future__ import annotations

import sys
from typing import Any

from radixserve_operator import (
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAME,
    SINGULAR,
    VERSION,
)
from radixserve_operator.rules import DRAFT_TOKENS_DEFAULT, NGRAM_WINDOW_DEFAULTS, ROOT, validations

# Kubernetes' quantity grammar with bounded digits and exponent and no sign: parsing one is cheap
# (`quantity.py`) and a negative size or a 10^1000000 never reaches the operator.
QUANTITY_PATTERN = (
    r"^\+?([0-9]{1,18}(\.[0-9]{0,9})?|\.[0-9]{1,9})(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]{1,2})?$"
)
QUANTITY_MAX_LENGTH = 32
MAX_QUANTITY = 10**18  # units (bytes, cores): an exabyte of memory is beyond any node
# NOTE: a power of ten: the API server keeps a maximum as a float64 and writes it back in
# decimal; 2**60 came back as 1152921504606847000, and Helm saw a conflicting CRD.
MAX_REPLICAS = 1000  # one resource's server pods, its autoscaler's maximum included
MAX_ROUTER_REPLICAS = 100
MAX_PARAMETERS = 10**15  # a model's weights: three orders of magnitude beyond the largest
MAX_HEADS = 4096  # attention heads, KV heads, layers, head size
MAX_TOKENS = 2**24  # context, prefill and graph token counts
MAX_RUNNING_REQUESTS = 2**16
MAX_GRAPH_BATCH = 4096
MAX_AUTOSCALING_TARGET = 10**6
# Names and references: DNS-1123 subdomains (Secrets, claims, classes, accounts) and keys.
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
SECRET_KEY = r"^[-._a-zA-Z0-9]+$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# An image reference: no leading '-' (it is an argument to the runtime), no spaces or controls.
IMAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$"
# What becomes one argument of a flag (--served-model-name, --revision): never a flag itself.
ARG_VALUE = r"^[A-Za-z0-9_][A-Za-z0-9._:/@+-]*$"
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# A LoRA adapter's name as clients give it in `model`: the runtime's rule (radixserve.config's
# adapter_name_fault; a test keeps the two equal)
ADAPTER_NAME = r"^[A-Za-z0-9][A-Za-z0-9._/-]*$"
MAX_ADAPTERS = 64
MAX_LORA_RANK = 256  # the runtime's --max-lora-rank bound
# Speculative decoding: the runtime's bounds of --speculative-num-draft-tokens (and of
# --speculative-num-steps, a path of at most that many), of the ngram match windows and of a tree's
# breadth (a test keeps them, and rules.NGRAM_WINDOW_DEFAULTS and DRAFT_TOKENS_DEFAULT, equal to
# radixserve.config's)
MAX_DRAFT_TOKENS = 16
MAX_NGRAM_WINDOW = 64
MAX_TREE_BREADTH = 8
SPECULATIVE_ALGORITHMS = ["ngram", "draft", "eagle3"]
# A source a pod fetches or mounts beside the model (a LoRA adapter, a draft model): never a flag,
# no control characters; its forms (hub id, pvc://, absolute path) are a rule's (rules.py)
SOURCE_PATTERN = r"^[^-\x00-\x20][^\x00-\x1f]*$"
TP_SIZES = [1, 2, 4, 8]  # one replica is one pod: no node holds more than 8 GPUs
PAGE_SIZES = [2**i for i in range(11)]  # the runtime wants a power of two


def _obj(props: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, **extra}


def _int(minimum: int | None = None, maximum: int | None = None, **extra: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "integer", **extra}
    if minimum is not None:
        s["minimum"] = minimum
    if maximum is not None:
        s["maximum"] = maximum
    return s


def _str(**extra: Any) -> dict[str, Any]:
    return {"type": "string", **extra}


def _int_or_string(**checks: Any) -> dict[str, Any]:
    # NOTE: a structural schema allows exactly this anyOf for int-or-string; checks on either
    # branch sit beside it (minimum only binds integers, pattern only strings).
    return {
        "x-kubernetes-int-or-string": True,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        **checks,
    }


def _quantity(**extra: Any) -> dict[str, Any]:
    return _int_or_string(
        minimum=0, maximum=MAX_QUANTITY, pattern=QUANTITY_PATTERN, maxLength=QUANTITY_MAX_LENGTH,
        **extra,
    )


PERCENT_PATTERN = r"^([0-9]|[1-9][0-9]|100)%$"


def _percent_or_count(default: int | None = None) -> dict[str, Any]:
    extra = {} if default is None else {"default": default}
    return _int_or_string(minimum=0, maximum=MAX_REPLICAS, pattern=PERCENT_PATTERN, **extra)


def _name_ref(**extra: Any) -> dict[str, Any]:
    """The name of an object in the resource's namespace (a Secret, a claim, an account)."""
    return _str(minLength=1, maxLength=253, pattern=DNS_SUBDOMAIN, **extra)


def _free_object(description: str) -> dict[str, Any]:
    return {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "description": description,
    }


def _probe(period: int, failures: int | None, timeout: int, delay: int = 0) -> dict[str, Any]:
    threshold = (
        _int(1, 100000, default=failures)
        if failures is not None
        else _int(
            1,
            100000,
            description="Default: enough periods to cover runtime.startupTimeoutSeconds; a "
            "larger value lengthens the window, a smaller one is raised to cover it.",
        )
    )
    return _obj(
        {
            "initialDelaySeconds": _int(0, 86400, default=delay),
            "periodSeconds": _int(1, 3600, default=period),
            "timeoutSeconds": _int(1, 3600, default=timeout),
            "failureThreshold": threshold,
        },
        default={},
    )


CACHE_TYPES = ["emptyDir", "pvcPerReplica", "sharedPVC"]
ACCESS_MODES = ["ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany"]  # the pod writes the cache


def _cache() -> dict[str, Any]:
    # NOTE: no defaults on the type-specific fields: a default would be present for every type and
    # break the rules that keep each field to its type.
    return _obj(
        {
            "type": _str(
                enum=CACHE_TYPES,
                default="emptyDir",
                description="emptyDir: per pod, gone with it. pvcPerReplica: a PVC per replica "
                "(volumeClaimTemplate of a StatefulSet), kept across restarts and rollouts. "
                "sharedPVC: an existing claim every replica mounts (ReadWriteMany, or ReadOnlyMany "
                "with readOnly).",
            ),
            "sizeLimit": _quantity(description="emptyDir: its sizeLimit (default 100Gi)."),
            "size": _quantity(description="pvcPerReplica (required): each PVC's storage request."),
            "storageClassName": _str(
                maxLength=253,
                pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$",  # "" too: static binding
                description="pvcPerReplica: the StorageClass (default: the cluster's default).",
            ),
            "accessModes": {
                "type": "array",
                "items": _str(enum=ACCESS_MODES),
                "minItems": 1,
                "x-kubernetes-list-type": "set",
                "description": "pvcPerReplica: the PVCs' access modes (default [ReadWriteOnce]).",
            },
            "claimName": _name_ref(
                description="sharedPVC: the existing claim (in the resource's namespace).",
            ),
            "readOnly": {
                "type": "boolean",
                "description": "sharedPVC: mount it read-only (a ReadOnlyMany claim filled "
                "beforehand); the init container then only checks that the model is there.",
            },
        },
        description="Where the weights are cached (/models-cache). Default: an emptyDir of 100Gi.",
        **validations("model.cache"),
    )


def _model() -> dict[str, Any]:
    hints = _obj(
        {
            "parameterCount": _int_or_string(
                minimum=1,
                maximum=MAX_PARAMETERS,
                maxLength=24,
                pattern=r"^[0-9]{1,15}(\.[0-9]{1,6})?[KMBT]?$",
                description='Total weights, e.g. 14800000000 or "14.8B" (MoE: all experts); '
                f"at most {MAX_PARAMETERS:.0e}.",
            ),
            "numAttentionHeads": _int(1, MAX_HEADS),
            "numKeyValueHeads": _int(1, MAX_HEADS, description="Defaults to numAttentionHeads."),
            "numHiddenLayers": _int(1, MAX_HEADS),
            "headDim": _int(1, MAX_HEADS),
            "dtype": _str(enum=["bfloat16", "float16", "float32"], default="bfloat16"),
        },
        required=["parameterCount", "numAttentionHeads", "numHiddenLayers", "headDim"],
        description="Shape hints for TP sizing when the operator cannot read config.json "
        "(a path or pvc:// source, or no hub access). They replace the hub lookup.",
    )
    return _obj(
        {
            "source": _str(
                default="default",
                minLength=1,
                maxLength=1024,  # bounds the CEL rule's estimated cost
                pattern=r"^[^-\x00-\x20][^\x00-\x1f]*$",  # never a flag, no control characters
                description="`default` (the image's embedded SmolLM2-135M-Instruct), a Hugging "
                "Face model id, a path inside the pod, or pvc://CLAIM/path.",
                **validations("model.source"),
            ),
            "servedName": _str(
                maxLength=256,
                pattern=ARG_VALUE,
                description="Model name in the OpenAI API (default: the source).",
            ),
            "revision": _str(
                maxLength=256,
                pattern=r"^[A-Za-z0-9_][A-Za-z0-9._/-]*$",
                description="Hub revision (branch, tag or commit) of the model.",
            ),
            "parameters": hints,
            "cache": _cache(),
            "hfTokenSecret": _obj(
                {
                    "name": _name_ref(),
                    "key": _str(minLength=1, maxLength=253, pattern=SECRET_KEY, default="HF_TOKEN"),
                },
                required=["name"],
                description="A Secret key set as HF_TOKEN in the download init container only "
                "(gated or private hub models); the server runs offline without it.",
            ),
        },
        default={},
    )


def _gpu() -> dict[str, Any]:
    return _obj(
        {
            "enabled": {
                "type": "boolean",
                "default": True,
                "description": "false: a CPU replica, no GPU requested.",
            },
            "resourceName": _str(
                default="nvidia.com/gpu",
                maxLength=253,
                pattern=r"^([a-z0-9.-]+/)?[a-zA-Z0-9._-]+$",
            ),
            "memoryGiB": {
                "type": "number",
                "minimum": 1,
                "maximum": 4096,
                "description": "Memory per GPU, for TP sizing (e.g. 80 for H100, 141 for H200).",
            },
        },
        default={},
    )


def _runtime() -> dict[str, Any]:
    return _obj(
        {
            "dtype": _str(enum=["auto", "bfloat16", "float16", "float32"]),
            "kvCacheDtype": _str(
                enum=["auto", "bfloat16", "float16", "fp8_e4m3"],
                description="KV-cache storage (--kv-cache-dtype); fp8_e4m3 holds twice the "
                "tokens (GPUs of compute capability 8.9 or newer). auto: the model dtype.",
            ),
            "pageSize": _int(
                enum=PAGE_SIZES,
                description="KV page size in tokens (--page-size; runtime default 1, which a "
                "speculative tree needs).",
            ),
            "contextLength": _int(
                2,
                MAX_TOKENS,
                description="Longest prompt + reply served (--context-length), at most the "
                "model's; shorter also shrinks each replica's page table.",
            ),
            "samplingDefaults": _str(
                enum=["model", "openai"],
                description="Sampling fields a request leaves out: the model's "
                "generation_config.json values (model, the runtime's default) or OpenAI's.",
            ),
            "maxRunningRequests": _int(1, MAX_RUNNING_REQUESTS),
            "maxPrefillLength": _int(1, MAX_TOKENS),
            "memoryRatio": {
                "type": "number",
                "exclusiveMinimum": True,
                "minimum": 0,
                "maximum": 1,
                "default": 0.9,
                "description": "Share of GPU memory for weights + KV cache (also used for sizing).",
            },
            "cudaGraphMaxBs": _int(0, MAX_GRAPH_BATCH, description="0 disables CUDA graphs."),
            "prefillGraphMaxTokens": _int(
                0, MAX_TOKENS, description="Prefill batches up to this many tokens replayed as CUDA graphs "
                               "(runtime default 8192); 0 disables."),
            "attention": _str(
                maxLength=64,
                pattern=r"^[a-z_]+(,[a-z_]+)?$",
                description="auto | NAME | PREFILL,DECODE",
            ),
            "cache": _str(enum=["radix", "naive"]),
            "hierarchicalCache": _obj(
                {
                    "size": _quantity(description="Host memory of the tier per GPU (per TP "
                                      "rank; --hicache-size), e.g. 64Gi."),
                    "ratio": {
                        "type": "number",
                        "minimum": 1,
                        "maximum": 64,
                        "description": "The tier as a multiple of each GPU's KV pool "
                        "(--hicache-ratio); the pod's memory grows by ratio x memoryRatio x "
                        "gpu.memoryGiB per GPU, a bound of that pool.",
                    },
                    "writePolicy": _str(
                        enum=["write_through", "write_back"],
                        description="When KV is copied to the tier (--hicache-write-policy): as "
                        "soon as it is computed (runtime default) or when the GPU evicts it.",
                    ),
                },
                description="A host-memory tier for the prefix cache (HiCache, "
                "--enable-hierarchical-cache): KV evicted from the GPU stays in (pinned) host "
                "memory and is loaded back on a hit. Present enables it, sized by exactly one of size, "
                "ratio. The pod's memory request (and limit, if set) grows by the tier; a CPU "
                "replica's tier sized by ratio shares the runtime's CPU KV budget instead.",
                **validations("runtime.hierarchicalCache"),
            ),
            "shutdownTimeoutSeconds": _int(
                0, 3600, default=30, description="Drain time on SIGTERM."
            ),
            "preStopSeconds": _int(
                0,
                300,
                default=5,
                description="preStop sleep before SIGTERM, so endpoints stop sending new "
                "requests first (0: no hook).",
            ),
            "startupTimeoutSeconds": _int(
                60,
                86400,
                default=1800,
                description="From the server container's start until it serves (the model is "
                "already downloaded by then): the startup probe's window covers it, and the "
                "runtime gives up a little earlier with a clear log line.",
            ),
            "extraArgs": {
                "type": "array",
                "maxItems": 64,
                "items": _str(maxLength=4096),
                "description": "Appended to the server's command line; flags the operator sets "
                "(--model, --tp, --host, --port, --device, --api-key, and those of lora and "
                "speculative) are refused.",
            },
        },
        default={},
        **validations("runtime"),
    )


def _model_cache() -> dict[str, Any]:
    return _obj(
        {
            "pvc": _obj({"claimName": _name_ref()}, required=["claimName"]),
            "emptyDir": _obj({"sizeLimit": _quantity(default="100Gi")}),
        },
        description="Deprecated: use model.cache (pvc is {type: sharedPVC, claimName}, emptyDir "
        "{type: emptyDir, sizeLimit}); read only when model.cache is not set.",
        **validations("modelCache"),
    )


def _rollout() -> dict[str, Any]:
    return _obj(
        {
            "strategy": _str(enum=["RollingUpdate", "Recreate"], default="RollingUpdate"),
            "maxSurge": _percent_or_count(),
            "maxUnavailable": _percent_or_count(),
            "whenSurgeBlocked": _str(
                enum=["Wait", "ReplaceInPlace"],
                default="Wait",
                description="When no node has room for a surge pod: Wait (the previous replicas "
                "keep serving; status SurgeBlocked) or ReplaceInPlace (this rollout then takes "
                "pods down one at a time first: an outage for one replica).",
            ),
        },
        # NOTE: no defaults for the counts: the operator's depend on the workload (`spec.py`,
        # effective_rollout), and the API server checks the CEL rules (rules.py) against a
        # default itself, before nested defaults fill it in.
        default={"strategy": "RollingUpdate"},
        description="Default: surge first (maxSurge 1, maxUnavailable 0), so a rollout never "
        "takes down the last ready replica; a surge pod that cannot be scheduled is reported "
        "(reason SurgeBlocked) and waited for. maxSurge 0 with maxUnavailable 1 replaces pods in "
        "place instead (an outage for one replica). A StatefulSet (pvcPerReplica) always "
        "replaces in place (maxUnavailable, default 1).",
        **validations("rollout"),
    )


def _toleration() -> dict[str, Any]:
    return _obj(
        {
            "key": _str(maxLength=317),  # a label key: prefix (253) / name (63)
            "operator": _str(enum=["Exists", "Equal"]),
            "value": _str(maxLength=63),
            "effect": _str(enum=["NoSchedule", "PreferNoSchedule", "NoExecute"]),
            "tolerationSeconds": _int(0, 2**31 - 1),
        }
    )


def _env_var() -> dict[str, Any]:
    return _obj(
        {
            "name": _str(minLength=1, maxLength=256, pattern=ENV_NAME),
            "value": _str(),
            "valueFrom": _free_object(
                "As in a container's env (secretKeyRef, configMapKeyRef, fieldRef...)."
            ),
        },
        required=["name"],
    )


def _env_list() -> dict[str, Any]:
    return {
        "type": "array",
        "maxItems": 256,
        "items": _env_var(),
        # NOTE: a map keyed by name, as a container's env is: the API server rejects a
        # repeated name with a clear message instead of a pod that cannot be applied.
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["name"],
    }


def _resources(description: str) -> dict[str, Any]:
    return _obj(
        {
            "limits": {"type": "object", "additionalProperties": _quantity()},
            "requests": {"type": "object", "additionalProperties": _quantity()},
        },
        description=description,
    )


def _named_free_list(description: str, key: str = "name") -> dict[str, Any]:
    """A list of free-form Kubernetes objects keyed by `key` (volumes, volume mounts)."""
    return {
        "type": "array",
        "maxItems": 64,
        "items": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "properties": {key: _str(minLength=1, maxLength=4096)},
            "required": [key],
        },
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": [key],
        "description": description,
    }


def _pod_template_spec() -> dict[str, Any]:
    container = _obj(
        {
            "env": _env_list(),
            "volumeMounts": _named_free_list(
                "Mounts of the server container, as in a container (name, mountPath, readOnly, "
                "subPath...); one with the mountPath of one of the operator's replaces it.",
                key="mountPath",
            ),
            "resources": _resources(
                "Merged over spec.resources and the operator's defaults, key by key; the GPU "
                "count is the operator's (parallelism.tensor)."
            ),
            # NOTE: declared only to refuse them with a clear message (its rule in rules.py): the
            # operator writes the runtime's command line from spec.runtime.
            "command": {"type": "array", "items": _str()},
            "args": {"type": "array", "items": _str()},
        },
        description="The server container: env, volumeMounts and resources merged over the "
        "operator's (yours win).",
        **validations("template.spec.container"),
    )
    return _obj(
        {
            "nodeSelector": {
                "type": "object",
                "maxProperties": 64,
                "additionalProperties": _str(maxLength=63, pattern=LABEL_VALUE),
            },
            "tolerations": {"type": "array", "maxItems": 64, "items": _toleration()},
            "affinity": _free_object("A pod affinity, as in a PodSpec (replaces spec.affinity)."),
            "topologySpreadConstraints": {
                "type": "array",
                "maxItems": 32,
                "items": _free_object("As in a PodSpec."),
                "description": "Replaces the operator's default spread over nodes.",
            },
            "runtimeClassName": _name_ref(),
            "priorityClassName": _name_ref(),
            "serviceAccountName": _name_ref(),
            "imagePullSecrets": {
                "type": "array",
                "maxItems": 64,
                "items": _obj({"name": _name_ref()}, required=["name"]),
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
            },
            "volumes": _named_free_list(
                "Pod volumes, as in a PodSpec; one named like one of the operator's (dshm, "
                "model-cache, tmp, model-source) replaces it."
            ),
            "container": container,
        },
        description="A partial pod spec merged over the one the operator builds (yours wins).",
    )


def _network_policy() -> dict[str, Any]:
    return _obj(
        {
            "ingressFrom": {
                "type": "array",
                "maxItems": 64,
                "items": _free_object(
                    "As a NetworkPolicyPeer: podSelector, namespaceSelector (both: those pods of "
                    "those namespaces) or ipBlock."
                ),
                "description": "Who may reach the server port besides the resource's router and "
                "the monitoring namespace. Default: the pods of the resource's namespace; [] "
                "lets no one else in.",
            },
            "egress": {
                "type": "array",
                "maxItems": 64,
                "items": _free_object("As a NetworkPolicyEgressRule: to, ports."),
                "description": "Where the pods may connect (DNS is always allowed). Default: "
                "anywhere (model downloads); set it to restrict egress.",
            },
        },
        description="The NetworkPolicy the operator writes for the pods (unless its chart turns "
        "NetworkPolicies off).",
    )


ROUTER_POLICIES = ["cache_aware", "round_robin", "power_of_two"]


def _lora() -> dict[str, Any]:
    adapter = _obj(
        {
            "name": _str(
                minLength=1,
                maxLength=128,
                pattern=ADAPTER_NAME,
                description="The name clients give as the request's `model` (or BASE:NAME).",
            ),
            "source": _str(
                minLength=1,
                maxLength=1024,
                pattern=SOURCE_PATTERN,
                description="A Hugging Face hub id (org/name; fetched by the pod's init "
                "container into the model cache, as the model), pvc://CLAIM/path (mounted "
                "read-only), or an absolute path inside the pod. A PEFT LoRA adapter: "
                "adapter_config.json and adapter_model.safetensors.",
            ),
        },
        required=["name", "source"],
    )
    return _obj(
        {
            "adapters": {
                "type": "array",
                "maxItems": MAX_ADAPTERS,
                "items": adapter,
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "description": "Served from the start by every replica (--lora-paths); a change "
                "of the list rolls the replicas, surge first.",
            },
            "maxLorasPerBatch": _int(
                1, MAX_ADAPTERS, description="Adapter slots on each GPU: the most adapters the "
                "running requests use at once (--max-loras-per-batch; runtime default 8)."
            ),
            "maxLoraRank": _int(
                1, MAX_LORA_RANK, description="The largest adapter rank served (--max-lora-rank; "
                "default: the largest among the adapters, at least 16)."
            ),
        },
        description="PEFT LoRA adapters served beside the model (--enable-lora): a request picks "
        "one with `model: NAME` or `BASE:NAME`, or SGLang's `lora_path` field beside the base "
        "model's name (what the router passes through). More can be loaded at run time through "
        "the server's /load_lora_adapter.",
        **validations("lora"),
    )


def _speculative() -> dict[str, Any]:
    window = f"1-{MAX_NGRAM_WINDOW}"
    return _obj(
        {
            "algorithm": _str(
                enum=SPECULATIVE_ALGORITHMS,
                description="ngram: drafts looked up in the request's own prompt and output; "
                "draft: drafts from a smaller model sharing the target's tokenizer (draftModel); "
                "eagle3: drafts from an EAGLE-3 head trained for the model (draftModel), which "
                "runs it without CUDA graphs (--speculative-algorithm).",
            ),
            "numDraftTokens": _int(
                1, MAX_DRAFT_TOKENS, description="The most tokens drafted for a request in one "
                "step, a tree's nodes (--speculative-num-draft-tokens; runtime default "
                f"{DRAFT_TOKENS_DEFAULT})."
            ),
            "numSteps": _int(
                1, MAX_DRAFT_TOKENS, description="The deepest a drafted path goes, a draft "
                "model's steps a round (--speculative-num-steps; runtime default numDraftTokens): "
                "at most numDraftTokens, and equal to it for a chain (eagleTopk and "
                "ngram.maxBfsBreadth absent or 1)."
            ),
            "eagleTopk": _int(
                1, MAX_TREE_BREADTH, description="algorithms draft and eagle3: each draft step's "
                "k likeliest tokens, verified together as a tree of at most numDraftTokens nodes "
                "(--speculative-eagle-topk; runtime default 1, a chain); above 1 needs "
                "runtime.pageSize 1, the runtime's default."
            ),
            "disableByBatchSize": _int(
                1, MAX_RUNNING_REQUESTS, description="No request drafts while more than this "
                "many requests decode (--speculative-disable-by-batch-size; runtime default: no "
                "limit): past a batch of a few requests a verification step costs about what its "
                "kept drafts save."
            ),
            "draftModel": _obj(
                {
                    "source": _str(
                        minLength=1,
                        maxLength=1024,
                        pattern=SOURCE_PATTERN,
                        description="A Hugging Face hub id (org/name; fetched by the pod's init "
                        "container into the model cache, as the model), pvc://CLAIM/path "
                        "(mounted read-only), or an absolute path inside the pod "
                        "(--speculative-draft-model-path).",
                        **validations("speculative.draftModel.source"),
                    ),
                },
                required=["source"],
                description="algorithms draft and eagle3 (required there, and only there): the "
                "draft model, a smaller model with the target's vocabulary, or the EAGLE-3 head.",
            ),
            "ngram": _obj(
                {
                    "minMatchWindow": _int(
                        1, MAX_NGRAM_WINDOW, description="The shortest suffix of a request's "
                        f"tokens looked up earlier in them ({window}; "
                        "--speculative-ngram-min-match-window-size; runtime default "
                        f"{NGRAM_WINDOW_DEFAULTS[0]})."
                    ),
                    "maxMatchWindow": _int(
                        1, MAX_NGRAM_WINDOW, description="The longest suffix looked up "
                        f"({window}; --speculative-ngram-max-match-window-size; runtime default "
                        f"{NGRAM_WINDOW_DEFAULTS[1]})."
                    ),
                    "maxBfsBreadth": _int(
                        1, MAX_TREE_BREADTH, description="Up to this many matches' continuations "
                        "a step, verified together as a tree of at most numDraftTokens nodes "
                        f"(1-{MAX_TREE_BREADTH}; --speculative-ngram-max-bfs-breadth; runtime "
                        "default 1, a chain); above 1 needs runtime.pageSize 1, the runtime's "
                        "default."
                    ),
                },
                description="algorithm ngram only: the match windows, min <= max (a bound left "
                "out is the runtime's default), and the tree's breadth.",
                **validations("speculative.ngram"),
            ),
        },
        required=["algorithm"],
        description="Speculative decoding: each decode step the model verifies the tokens a "
        "drafter proposes and keeps those it would have produced (greedy output unchanged, "
        "sampled output from the same distribution).",
        **validations("speculative"),
    )


def _router() -> dict[str, Any]:
    return _obj(
        {
            "enabled": {"type": "boolean", "default": False},
            "policy": _str(
                enum=ROUTER_POLICIES,
                default="cache_aware",
                description="cache_aware: a request goes to the replica whose cache holds the "
                "longest part of its prompt (load permitting); round_robin: in turn; "
                "power_of_two: the less loaded of two replicas drawn at random.",
            ),
            "replicas": _int(1, MAX_ROUTER_REPLICAS, default=1),
            "resources": _resources("The router container's; default: 500m CPU, 512Mi memory."),
            "image": _str(
                minLength=1,
                maxLength=512,
                pattern=IMAGE_PATTERN,
                description="Default: the operator's router image.",
            ),
        },
        default={},
        description="A cache-aware router (the SGLang model gateway) in front of the replicas, "
        "as NAME-router (Deployment, Service and a ServiceAccount that may list and watch pods); "
        "status.endpoint then names it. It routes only to Ready replicas.",
    )


def _disruption_budget() -> dict[str, Any]:
    return _obj(
        {
            "enabled": {"type": "boolean", "default": True},
            "maxUnavailable": _percent_or_count(1),
        },
        default={"enabled": True, "maxUnavailable": 1},
        description="A PodDisruptionBudget while more than one replica serves (or may serve).",
    )


AUTOSCALING_METRICS = ("requests", "kvCache", "tokens")


def _autoscaling() -> dict[str, Any]:
    return _obj(
        {
            "engine": _str(enum=["hpa", "keda"], default="hpa"),
            "minReplicas": _int(0, MAX_REPLICAS, default=1),
            "maxReplicas": _int(1, MAX_REPLICAS),
            "metric": _str(enum=list(AUTOSCALING_METRICS), default="requests"),
            "target": {
                "type": "number",
                "exclusiveMinimum": True,
                "minimum": 0,
                "maximum": MAX_AUTOSCALING_TARGET,
                "description": "Per-pod average to hold: requests in flight (default 16), KV "
                "cache usage ratio (default 0.8, at most 1) or generated tokens/s (default 500).",
            },
            "prometheus": _obj(
                {
                    "serverAddress": _str(
                        minLength=1,
                        maxLength=2048,
                        pattern=r"^https?://[^\s]+$",
                        description="KEDA only; default: the operator's --prometheus-url.",
                    ),
                    "query": _str(
                        minLength=1,
                        maxLength=8192,
                        description="KEDA only: a PromQL query whose value is summed over the "
                        "replicas (replaces the one built from metric).",
                    ),
                }
            ),
        },
        required=["maxReplicas"],
        description="Scale spec.replicas with a HorizontalPodAutoscaler (through the Prometheus "
        "Adapter) or a KEDA ScaledObject, on a per-pod runtime metric.",
        **validations("autoscaling"),
    )


def _spec() -> dict[str, Any]:
    return _obj(
        {
            "model": _model(),
            "image": _str(
                minLength=1,
                maxLength=512,
                pattern=IMAGE_PATTERN,
                description="Default: the GPU runtime image, or its -cpu variant when gpu.enabled "
                "is false. Its ENTRYPOINT must run radixserve (ours: tini -- radixserve): the pods "
                "set only args, a radixserve subcommand first."
            ),
            "imagePullPolicy": _str(
                enum=["Always", "IfNotPresent", "Never"], default="IfNotPresent"
            ),
            "replicas": _int(0, MAX_REPLICAS, default=1),
            "parallelism": _obj(
                {
                    "tensor": _int_or_string(
                        enum=[*TP_SIZES, "auto"],
                        default=1,
                        description="GPUs per replica (one pod, so at most one node's 8), or auto: the smallest of 1, 2, 4, 8 that fits.",
                    )
                },
                default={},
            ),
            "gpu": _gpu(),
            "runtime": _runtime(),
            "resources": _resources(
                "CPU/memory for the server container; the GPU limit is set from the TP size."
            ),
            "nodeSelector": {
                "type": "object",
                "maxProperties": 64,
                "additionalProperties": _str(maxLength=63, pattern=LABEL_VALUE),
            },
            "tolerations": {"type": "array", "maxItems": 64, "items": _toleration()},
            "affinity": _free_object("A pod affinity, as in a PodSpec."),
            "modelCache": _model_cache(),
            "shmSize": _quantity(
                default="8Gi", description="/dev/shm (memory emptyDir) size, for NCCL."
            ),
            "rollout": _rollout(),
            "probes": _obj(
                {
                    "startup": _probe(period=10, failures=None, timeout=5),
                    "readiness": _probe(period=10, failures=3, timeout=5),
                    "liveness": _probe(period=20, failures=3, timeout=5),
                },
                default={},
                description="Timing of the /health probes; the startup probe's window covers runtime.startupTimeoutSeconds.",
            ),
            "service": _obj(
                {
                    "type": _str(
                        enum=["ClusterIP", "NodePort", "LoadBalancer"], default="ClusterIP"
                    ),
                    "port": _int(1, 65535, default=8000),
                    "allowUnauthenticated": {
                        "type": "boolean",
                        "description": "A NodePort or LoadBalancer Service without apiKeySecretRef "
                        "is refused unless this is true (then a Warning event says it is open).",
                    },
                },
                default={},
            ),
            "apiKeySecretRef": _obj(
                {
                    "name": _name_ref(),
                    "key": _str(minLength=1, maxLength=253, pattern=SECRET_KEY, default="api-key"),
                },
                required=["name"],
                description="Secret key set as RADIXSERVE_API_KEY (the Secret must exist and hold "
                "the key: the pods do not start without it); no env entry may set that name.",
            ),
            "template": _obj(
                {
                    "metadata": _obj(
                        {
                            "labels": {
                                "type": "object",
                                "maxProperties": 64,
                                "additionalProperties": _str(maxLength=63, pattern=LABEL_VALUE),
                            },
                            "annotations": {
                                "type": "object",
                                "maxProperties": 128,
                                "additionalProperties": _str(maxLength=65536),
                            },
                        },
                        **validations("template.metadata"),
                    ),
                    "spec": _pod_template_spec(),
                },
                description="Merged over the pods the operator builds: labels and annotations "
                "(e.g. for a service mesh or a scraper), and a partial pod spec.",
            ),
            "env": _env_list(),
            "lora": _lora(),
            "speculative": _speculative(),
            "networkPolicy": _network_policy(),
            "router": _router(),
            "disruptionBudget": _disruption_budget(),
            "autoscaling": _autoscaling(),
        },
        **validations(""),
    )


def _condition() -> dict[str, Any]:
    return _obj(
        {
            "type": _str(),
            "status": _str(enum=["True", "False", "Unknown"]),
            "reason": _str(),
            "message": _str(),
            "lastTransitionTime": _str(format="date-time"),
            "observedGeneration": _int(0),
        },
        required=["type", "status"],
    )


def _status() -> dict[str, Any]:
    return _obj(
        {
            "conditions": {
                "type": "array",
                "items": _condition(),
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
            "observedGeneration": _int(0),
            "replicas": _int(0),
            "readyReplicas": _int(0),
            "updatedReplicas": _int(0),
            "tensorParallelSize": _int(1),
            "gpusPerReplica": _int(0),
            "endpoint": _str(),
            "selector": _str(),
        }
    )


def openapi_schema() -> dict[str, Any]:
    return _obj(
        {
            "apiVersion": _str(),
            "kind": _str(),
            "metadata": {"type": "object"},
            "spec": _spec(),
            "status": _status(),
        },
        required=["spec"],
        **validations(ROOT),  # on metadata.name, the only metadata a CRD's rules may read
    )


def _column(name: str, path: str, type_: str = "string", priority: int = 0) -> dict[str, Any]:
    col: dict[str, Any] = {"name": name, "type": type_, "jsonPath": path}
    if priority:
        col["priority"] = priority
    return col


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {
                "app.kubernetes.io/name": "radixserve",
                "app.kubernetes.io/part-of": "radixserve",
            },
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": [SHORT_NAME],
                "categories": ["radixserve"],  # not "all": `kubectl delete all` must not take models
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": [
                        _column("Ready", '.status.conditions[?(@.type=="Ready")].status'),
                        _column("Replicas", ".spec.replicas", "integer"),
                        _column("Available", ".status.readyReplicas", "integer"),
                        _column("TP", ".status.tensorParallelSize", "integer"),
                        _column("Model", ".spec.model.source"),
                        _column("Age", ".metadata.creationTimestamp", "date"),
                        _column(
                            "Reason", '.status.conditions[?(@.type=="Ready")].reason', priority=1
                        ),
                        _column("Endpoint", ".status.endpoint", priority=1),
                    ],
                }
            ],
        },
    }


def spec_schema() -> dict[str, Any]:
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def to_yaml() -> str:
    import yaml

    header = "# Generated by `python -m radixserve_operator.crd` from operator/radixserve_operator/crd.py; do not edit.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=120)


def main() -> int:
    sys.stdout.write(to_yaml())
    return 0


if __name__ == "__main__":
    sys.exit(main())

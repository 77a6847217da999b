"""Pure builders: a parsed `ServiceSpec` (+ its TP size and generation) -> the workload (a
Deployment; a StatefulSet when each replica has its own cache PVC) and the Service that serve it.
No cluster access; owner references are added by the handlers.

A hub model is downloaded by an init container (`radixserve download`, the same image, env and
cache mount, and the hub token, which only it gets) before the server starts; the server then runs
with HF_HUB_OFFLINE=1, so its startup window is spent loading, never downloading. So are the LoRA
adapters of spec.lora from the hub, one init container each; a pvc:// adapter's claim is mounted
read-only; the server gets them all in --lora-paths. And so is the draft model of spec.speculative
(by its own init container from the hub, or on a read-only mount of its claim), which the server
gets in --speculative-draft-model-path.

Every pod meets the Pod Security Standard `restricted` (non-root, no privilege escalation, every
capability dropped, the runtime's seccomp profile); what a resource adds is checked against the
operator's level by `podsecurity` before anything is applied."""

from __future__ import annotations

import re
from typing import Any

from radixserve_operator import (
    ANNOTATION_GENERATION,
    ANNOTATION_GPUS,
    ANNOTATION_IN_PLACE,
    ANNOTATION_TP,
    APP_NAME,
    FIELD_MANAGER,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_PART_OF,
    LABEL_VERSION,
    SERVER_PORT,
)
from radixserve_operator.quantity import quantity_bytes
from radixserve_operator.spec import API_KEY_ENV, AdapterSpec, ProbeTiming, ServiceSpec, pvc_source

CONTAINER = "server"
INIT_CONTAINER = "model-download"
CACHE_VOLUME = "model-cache"
CACHE_DIR = "/models-cache"
SOURCE_DIR = "/models"  # pvc:// sources mount at /models/CLAIM
LORA_DIR = "/lora"  # pvc:// adapters' claims mount at /lora/CLAIM
LORA_INIT_CONTAINER = "lora-download"  # one a hub adapter: lora-download-0, -1, …
DRAFT_DIR = "/draft"  # a pvc:// draft model's claim mounts at /draft/CLAIM (unless mounted already)
DRAFT_INIT_CONTAINER = "draft-download"
DRAFT_VOLUME = "draft-source"
RUN_AS = 1000
# NOTE: containers set `args` only, never `command`, so they run through the image's ENTRYPOINT:
# ours is this (tini as PID 1 forwards SIGTERM to the server and reaps the scheduler, tokenizer and
# compiler processes it leaves). A `command` would bypass it; naming tini there would break a
# spec.image without tini. Any image whose ENTRYPOINT runs `radixserve` works.
IMAGE_ENTRYPOINT = ("tini", "--", "radixserve")
GRACE_MARGIN_S = 15  # beyond preStop + the server's drain timeout, before SIGKILL
# A GPU replica's CPU/memory requests when the resource gives none (per GPU; plus /dev/shm, which
# is memory the pod uses): tokenizer workers and one scheduler process per rank, and host memory
# to stage the weights.
CPU_PER_GPU = 4
MEMORY_PER_GPU_GIB = 16
SPREAD_KEY = "kubernetes.io/hostname"
# The runtime's own startup timeout (RADIXSERVE_STARTUP_TIMEOUT) is the startup window less this
# (at most a quarter of it): the time a container needs before the runtime starts waiting for its
# processes (imports, checks). So the runtime gives up, with a log line saying why, before the
# kubelet's probe would kill it without one.
STARTUP_MARGIN_S = 60
# A Deployment's progress deadline also covers the init container's download (not in the window).
DOWNLOAD_ALLOWANCE_S = 3600
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def selector_labels(name: str) -> dict[str, str]:
    return {LABEL_NAME: APP_NAME, LABEL_INSTANCE: name}


def selector_string(name: str) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(name).items()))


def labels(spec: ServiceSpec) -> dict[str, str]:
    out = {
        **selector_labels(spec.name),
        LABEL_COMPONENT: "inference",
        LABEL_PART_OF: APP_NAME,
        LABEL_MANAGED_BY: FIELD_MANAGER,
    }
    tag = spec.image.rsplit(":", 1)[-1] if ":" in spec.image.rsplit("/", 1)[-1] else ""
    if _LABEL_VALUE.match(tag):
        out[LABEL_VERSION] = tag
    return out


def endpoint(spec: ServiceSpec) -> str:
    return f"http://{spec.name}.{spec.namespace}.svc:{spec.service_port}/v1"


def model_arg(spec: ServiceSpec) -> str | None:
    """What `--model` gets: None for the embedded default, the path inside the pod for pvc://."""
    if spec.model.is_default:
        return None
    pvc = spec.model.pvc
    return f"{SOURCE_DIR}/{pvc[0]}/{pvc[1]}" if pvc else spec.model.source


def server_args(spec: ServiceSpec, tp: int) -> list[str]:
    rt = spec.runtime
    args = ["serve"]
    model = model_arg(spec)
    if model is not None:
        args += ["--model", model]
    args += ["--tp", str(tp), "--host", "0.0.0.0", "--port", str(SERVER_PORT)]
    if not spec.gpu.enabled:
        args += ["--device", "cpu"]
    optional = [
        ("--served-model-name", spec.model.served_name),
        ("--dtype", rt.dtype),
        ("--kv-cache-dtype", rt.kv_cache_dtype),
        ("--page-size", rt.page_size),
        ("--context-length", rt.context_length),
        ("--sampling-defaults", rt.sampling_defaults),
        ("--max-running-requests", rt.max_running_requests),
        ("--max-prefill-length", rt.max_prefill_length),
        ("--memory-ratio", rt.memory_ratio),
        ("--cuda-graph-max-bs", rt.cuda_graph_max_bs),
        ("--prefill-graph-max-tokens", rt.prefill_graph_max_tokens),
        ("--attn", rt.attention),
        ("--cache", rt.cache),
        ("--shutdown-timeout", rt.shutdown_timeout),
    ]
    tier = rt.hierarchical_cache
    if tier is not None:
        args.append("--enable-hierarchical-cache")
        optional += [
            ("--hicache-size", None if tier.size_bytes is None else repr(tier.size_bytes / 2**30)),
            ("--hicache-ratio", tier.ratio),
            ("--hicache-write-policy", tier.write_policy),
        ]
    for flag, value in optional:
        if value is not None:
            args += [flag, str(value)]
    return args + lora_args(spec) + speculative_args(spec) + list(rt.extra_args)


def claim_root(spec: ServiceSpec, claim: str) -> str:
    """Where a claim of a pvc:// source is mounted: once, as the model's, else as an adapter's,
    else as the draft model's."""
    model_pvc = spec.model.pvc
    if model_pvc is not None and model_pvc[0] == claim:
        return SOURCE_DIR
    return LORA_DIR if claim in adapter_claims(spec) else DRAFT_DIR


def source_arg(spec: ServiceSpec, source: str) -> str:
    """Where the server reads a side source (an adapter, a draft model): its hub id (found in the
    cache the init container filled), its claim's mount, or its path."""
    pvc = pvc_source(source)
    return source if pvc is None else f"{claim_root(spec, pvc[0])}/{pvc[0]}/{pvc[1]}"


def lora_args(spec: ServiceSpec) -> list[str]:
    lora = spec.lora
    if lora is None:
        return []
    args = ["--enable-lora"]
    if lora.max_loras_per_batch is not None:
        args += ["--max-loras-per-batch", str(lora.max_loras_per_batch)]
    if lora.max_lora_rank is not None:
        args += ["--max-lora-rank", str(lora.max_lora_rank)]
    if lora.adapters:
        args += ["--lora-paths", *(f"{a.name}={source_arg(spec, a.source)}" for a in lora.adapters)]
    return args


def speculative_args(spec: ServiceSpec) -> list[str]:
    s = spec.speculative
    if s is None:
        return []
    draft = None if s.draft_model is None else source_arg(spec, s.draft_model.source)
    args = ["--speculative-algorithm", s.algorithm]
    for flag, value in (
        ("--speculative-num-draft-tokens", s.num_draft_tokens),
        ("--speculative-num-steps", s.num_steps),
        ("--speculative-eagle-topk", s.eagle_topk),
        ("--speculative-draft-model-path", draft),
        ("--speculative-ngram-min-match-window-size", s.min_match_window),
        ("--speculative-ngram-max-match-window-size", s.max_match_window),
        ("--speculative-ngram-max-bfs-breadth", s.max_bfs_breadth),
        ("--speculative-disable-by-batch-size", s.disable_by_batch_size),
    ):
        if value is not None:
            args += [flag, str(value)]
    return args


def hub_draft(spec: ServiceSpec) -> str | None:
    """The draft model's hub id, which an init container fetches; None for a path or pvc://."""
    s = spec.speculative
    return None if s is None or s.draft_model is None else s.draft_model.hub_id


def draft_claim(spec: ServiceSpec) -> str | None:
    """The claim of a pvc:// draft model where it needs a mount of its own (not the model's or an
    adapter's claim)."""
    s = spec.speculative
    pvc = None if s is None or s.draft_model is None else s.draft_model.pvc
    return pvc[0] if pvc is not None and claim_root(spec, pvc[0]) == DRAFT_DIR else None


def hub_adapters(spec: ServiceSpec) -> list[AdapterSpec]:
    """The adapters an init container fetches from the hub."""
    return [a for a in (spec.lora.adapters if spec.lora else ()) if a.hub_id is not None]


def adapter_claims(spec: ServiceSpec) -> list[str]:
    """The claims of pvc:// adapters that need a mount of their own (not the model's claim)."""
    model_pvc = spec.model.pvc
    claims = [a.pvc[0] for a in (spec.lora.adapters if spec.lora else ()) if a.pvc is not None]
    return sorted({c for c in claims if model_pvc is None or c != model_pvc[0]})


def _probe(timing: ProbeTiming) -> dict[str, Any]:
    return {
        "httpGet": {"path": "/health", "port": "http"},
        "initialDelaySeconds": timing.initial_delay,
        "periodSeconds": timing.period,
        "timeoutSeconds": timing.timeout,
        "failureThreshold": timing.failure_threshold,
    }


def _mebibytes(n: int) -> str:
    mib = -(-n // 2**20)
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def default_requests(spec: ServiceSpec, tp: int) -> dict[str, str]:
    """CPU and memory a GPU replica requests unless the resource says: CPU_PER_GPU and
    MEMORY_PER_GPU_GIB per GPU, plus the /dev/shm size (a memory emptyDir is charged to the pod)."""
    if not spec.gpu.enabled:
        return {}
    memory = tp * MEMORY_PER_GPU_GIB * 2**30 + quantity_bytes(spec.shm_size)
    return {"cpu": str(CPU_PER_GPU * tp), "memory": _mebibytes(memory)}


def host_tier_bytes(spec: ServiceSpec, tp: int) -> int:
    """Host memory the KV tier (spec.runtime.hierarchicalCache) takes in one pod: its size per
    rank, or ratio x memoryRatio x gpu.memoryGiB per GPU (what bounds each GPU's KV pool: the
    weights' share is not subtracted, so the pod never gets less than the tier takes). A CPU
    replica's tier sized by ratio shares the runtime's KV budget (kvcache/sizing.py): none."""
    tier = spec.runtime.hierarchical_cache
    if tier is None:
        return 0
    if tier.size_bytes is not None:
        return tier.size_bytes * tp
    if not spec.gpu.enabled or tier.ratio is None or spec.gpu.memory_gib is None:
        return 0  # (the CRD's rules require memoryGiB for a GPU replica sized by ratio)
    return int(tier.ratio * spec.runtime.memory_ratio * spec.gpu.memory_gib * 2**30) * tp


def _resources(spec: ServiceSpec, tp: int) -> dict[str, Any]:
    """The operator's defaults < spec.resources < template.spec.container.resources, key by key,
    and the host KV tier on top of the memory requested and limited; the GPU count is always
    the TP size."""
    out: dict[str, dict[str, Any]] = {}
    user = ((spec.pod_template.get("container") or {}).get("resources")) or {}
    for layer in (spec.resources, user):
        for part in ("limits", "requests"):
            if layer.get(part):
                out.setdefault(part, {}).update(layer[part])
    gpu = spec.gpu.resource_name
    for part in out.values():
        part.pop(gpu, None)
    given = {k for part in out.values() for k in part}  # a limit alone is its request too
    for key, value in default_requests(spec, tp).items():
        if key not in given:
            out.setdefault("requests", {})[key] = value
    if tier := host_tier_bytes(spec, tp):
        # the kubelet kills a pod past its memory limit: the pinned tier must be inside it (a
        # limit alone stays alone: it is the request too)
        parts = [p for p in out.values() if "memory" in p] or [out.setdefault("requests", {})]
        for part in parts:
            part["memory"] = _mebibytes(quantity_bytes(part.get("memory", 0)) + tier)
    if spec.gpu.enabled:
        out.setdefault("limits", {})[gpu] = tp  # extended resources: requests default to limits
    return {k: v for k, v in out.items() if v}


def downloads(spec: ServiceSpec) -> bool:
    """Whether an init container downloads the model: hub sources only (the embedded default is
    in the image, a path or pvc:// source is already on a volume)."""
    return spec.model.hub_id is not None


def fetches(spec: ServiceSpec) -> bool:
    """Whether any init container downloads: the model, a LoRA adapter or the draft model from
    the hub."""
    return downloads(spec) or bool(hub_adapters(spec)) or hub_draft(spec) is not None


def runtime_startup_timeout(spec: ServiceSpec) -> int:
    """RADIXSERVE_STARTUP_TIMEOUT: spec.runtime.startupTimeoutSeconds less the margin."""
    t = spec.runtime.startup_timeout
    return t - min(STARTUP_MARGIN_S, t // 4)


def secret_env(name: str, ref: tuple[str, str]) -> dict[str, Any]:
    """An env var from a Secret key that must exist: a missing Secret or key keeps the container
    from starting, never starts it with an empty value (an empty API key is none)."""
    key_ref = {"name": ref[0], "key": ref[1], "optional": False}
    return {"name": name, "valueFrom": {"secretKeyRef": key_ref}}


def _common_env(spec: ServiceSpec) -> list[dict[str, Any]]:
    """What both the download init container and the server see: the cache and the revision."""
    env: list[dict[str, Any]] = [
        {"name": "RADIXSERVE_CACHE_DIR", "value": CACHE_DIR},
        {"name": "HF_HOME", "value": f"{CACHE_DIR}/huggingface"},
        {"name": "HOME", "value": "/tmp"},  # read-only root: libraries cache under $HOME
    ]
    if spec.model.revision:
        env.append({"name": "RADIXSERVE_MODEL_REVISION", "value": spec.model.revision})
    return env


def _user_env(spec: ServiceSpec) -> tuple[dict[str, Any], ...]:
    template_env = (spec.pod_template.get("container") or {}).get("env") or ()
    return (*spec.env, *template_env)


def _env(spec: ServiceSpec) -> list[dict[str, Any]]:
    env = _common_env(spec)
    if fetches(spec):  # the init containers have put the model and adapters in the cache
        env.append({"name": "HF_HUB_OFFLINE", "value": "1"})
    env.append({"name": "RADIXSERVE_STARTUP_TIMEOUT", "value": str(runtime_startup_timeout(spec))})
    merged = merge_env(env, _user_env(spec))
    if spec.api_key_secret:  # NOTE: after the user's env, which may not replace it (spec.py)
        merged = [e for e in merged if e["name"] != API_KEY_ENV]
        merged.append(secret_env(API_KEY_ENV, spec.api_key_secret))
    return merged


def _init_env(spec: ServiceSpec) -> list[dict[str, Any]]:
    """NOTE: the hub token only here: the server runs offline, and a long-running process that
    answers the network should not hold a credential it never uses."""
    env = _common_env(spec)
    if spec.model.hf_token_secret:
        env.append(secret_env("HF_TOKEN", spec.model.hf_token_secret))
    if spec.cache.read_only:  # a claim filled beforehand: check it, fetch nothing
        env.append({"name": "HF_HUB_OFFLINE", "value": "1"})
    return merge_env(env, _user_env(spec))


def merge_env(base: list[dict[str, Any]], user: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    """`base` then `user`, one entry per name, the user's value winning, in first-seen order. A
    container's env is a map keyed by name for server-side apply: a repeated name is an HTTP 500
    there, never a usable pod."""
    merged: dict[str, dict[str, Any]] = {}
    for e in [*base, *user]:
        merged[e["name"]] = dict(e)
    return list(merged.values())


def merge_by(
    key: str, base: list[dict[str, Any]], user: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`base` with `user`'s entries merged by `key`, as a strategic merge patch does: one with the
    same key replaces the operator's in place, the others are appended."""
    merged: dict[Any, dict[str, Any]] = {e[key]: e for e in base}
    for e in user:
        merged[e[key]] = dict(e)
    return list(merged.values())


def _cache_volume(spec: ServiceSpec) -> list[dict[str, Any]]:
    """The pod's model-cache volume; none for pvcPerReplica, whose StatefulSet adds one per pod
    from its volumeClaimTemplate of that name."""
    c = spec.cache
    if c.per_replica:
        return []
    if c.type == "sharedPVC":
        claim: dict[str, Any] = {"claimName": c.claim_name}
        if c.read_only:
            claim["readOnly"] = True
        return [{"name": CACHE_VOLUME, "persistentVolumeClaim": claim}]
    return [{"name": CACHE_VOLUME, "emptyDir": {"sizeLimit": c.size} if c.size is not None else {}}]


def _volumes(spec: ServiceSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}},
        *_cache_volume(spec),
        {"name": "tmp", "emptyDir": {"sizeLimit": "8Gi"}},
    ]
    cache_mount: dict[str, Any] = {"name": CACHE_VOLUME, "mountPath": CACHE_DIR}
    if spec.cache.read_only:
        cache_mount["readOnly"] = True
    mounts = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        cache_mount,
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    pvc = spec.model.pvc
    if pvc:
        volumes.append(
            {
                "name": "model-source",
                "persistentVolumeClaim": {"claimName": pvc[0], "readOnly": True},
            }
        )
        mounts.append(
            {"name": "model-source", "mountPath": f"{SOURCE_DIR}/{pvc[0]}", "readOnly": True}
        )
    for i, claim in enumerate(adapter_claims(spec)):
        name = f"lora-source-{i}"
        volumes.append({"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": name, "mountPath": f"{LORA_DIR}/{claim}", "readOnly": True})
    if (claim := draft_claim(spec)) is not None:
        volumes.append({"name": DRAFT_VOLUME,
                        "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": DRAFT_VOLUME, "mountPath": f"{DRAFT_DIR}/{claim}", "readOnly": True})
    t = spec.pod_template
    user_mounts = (t.get("container") or {}).get("volumeMounts") or []
    return merge_by("name", volumes, t.get("volumes") or []), merge_by(
        "mountPath", mounts, user_mounts
    )


def _strategy(spec: ServiceSpec, in_place: bool) -> dict[str, Any]:
    """`in_place`: this generation's surge pod found no room and the spec falls back
    (rollout.whenSurgeBlocked: ReplaceInPlace): one pod down at a time, none added."""
    r = spec.rollout
    if r.strategy == "Recreate":
        return {"type": "Recreate"}
    if in_place:
        return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    return {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": r.max_surge, "maxUnavailable": r.max_unavailable},
    }


def _container(spec: ServiceSpec, tp: int, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "args": server_args(spec, tp),  # no command: the image's ENTRYPOINT (see IMAGE_ENTRYPOINT)
        "ports": [{"name": "http", "containerPort": SERVER_PORT, "protocol": "TCP"}],
        "env": _env(spec),
        "resources": _resources(spec, tp),
        "volumeMounts": mounts,
        "startupProbe": _probe(spec.startup),
        "readinessProbe": _probe(spec.readiness),
        "livenessProbe": _probe(spec.liveness),
        **_lifecycle(spec),
        "securityContext": _container_security(),
    }


def _container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def download_args(spec: ServiceSpec) -> list[str]:
    """NOTE: no --cache-dir: the init container has the server's env (RADIXSERVE_CACHE_DIR,
    HF_HOME, and the user's env over them), so it downloads exactly where the server will look,
    even where the user's env moves HF_HOME."""
    assert spec.model.hub_id is not None
    args = ["download", spec.model.hub_id]
    if spec.model.revision:
        args += ["--revision", spec.model.revision]
    return args


def _init_container(
    spec: ServiceSpec, mounts: list[dict[str, Any]], server_resources: dict[str, Any],
    name: str = INIT_CONTAINER, args: list[str] | None = None,
) -> dict[str, Any]:
    """`radixserve download` into the cache (the model's, else `args`: an adapter's or the draft
    model's): the server's image, env, mounts and security. Its CPU/memory are the server's (never
    the GPUs), so the pod asks the scheduler for no more than the server alone (a pod's request is
    the larger of its init containers' and the sum of its containers')."""
    gpu = spec.gpu.resource_name
    resources = {
        part: {k: v for k, v in values.items() if k != gpu}
        for part, values in server_resources.items()
    }
    return {
        "name": name,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        # through the image's ENTRYPOINT, as the server
        "args": download_args(spec) if args is None else args,
        "env": _init_env(spec),
        "resources": {k: v for k, v in resources.items() if v},
        "volumeMounts": [dict(m) for m in mounts],
        "securityContext": _container_security(),
    }


def _lifecycle(spec: ServiceSpec) -> dict[str, Any]:
    """A preStop sleep: the pod leaves the Service's endpoints (and the load balancers') before the
    runtime gets SIGTERM and stops taking new requests. `sleep` is in both runtime images."""
    seconds = spec.runtime.pre_stop_seconds
    if not seconds:
        return {}
    return {"lifecycle": {"preStop": {"exec": {"command": ["sleep", str(seconds)]}}}}


def grace_period(spec: ServiceSpec) -> int:
    """preStop, then the runtime's drain, then a margin before SIGKILL."""
    return spec.runtime.pre_stop_seconds + spec.runtime.shutdown_timeout + GRACE_MARGIN_S


def default_spread(spec: ServiceSpec) -> list[dict[str, Any]]:
    """Replicas on different nodes where the scheduler can (never blocks scheduling)."""
    return [
        {
            "maxSkew": 1,
            "topologyKey": SPREAD_KEY,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector_labels(spec.name)},
        }
    ]


def _scheduling(spec: ServiceSpec) -> dict[str, Any]:
    """Where the pods run: the top-level fields, then spec.template.spec over them (template wins:
    nodeSelector per key, tolerations added, affinity and spread constraints replaced)."""
    t = spec.pod_template
    out: dict[str, Any] = {}
    node_selector = {**spec.node_selector, **(t.get("nodeSelector") or {})}
    if node_selector:
        out["nodeSelector"] = node_selector
    tolerations: list[dict[str, Any]] = []
    for tol in [*spec.tolerations, *(t.get("tolerations") or [])]:
        if dict(tol) not in tolerations:
            tolerations.append(dict(tol))
    if tolerations:
        out["tolerations"] = tolerations
    affinity = t.get("affinity") or spec.affinity
    if affinity:
        out["affinity"] = affinity
    spread = t.get("topologySpreadConstraints")  # [] turns the default off
    spread = default_spread(spec) if spread is None else spread
    if spread:
        out["topologySpreadConstraints"] = spread
    for key in ("runtimeClassName", "priorityClassName", "serviceAccountName", "imagePullSecrets"):
        if t.get(key):
            out[key] = t[key]
    return out


def _pod_spec(spec: ServiceSpec, tp: int) -> dict[str, Any]:
    volumes, mounts = _volumes(spec)
    server = _container(spec, tp, mounts)
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,  # the server never talks to the API server
        "terminationGracePeriodSeconds": grace_period(spec),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            # a big cache volume is chowned once, not on every pod start
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    inits = [_init_container(spec, mounts, server["resources"])] if downloads(spec) else []
    if (draft := hub_draft(spec)) is not None:
        # NOTE: no --revision: RADIXSERVE_MODEL_REVISION is the one the server reads the draft
        # at, and the CRD's rules leave it unset beside a hub draft model
        inits.append(_init_container(spec, mounts, server["resources"], DRAFT_INIT_CONTAINER,
                                     ["download", draft]))
    for i, adapter in enumerate(hub_adapters(spec)):
        # NOTE: the repo's main branch: RADIXSERVE_MODEL_REVISION is the model's revision
        inits.append(_init_container(spec, mounts, server["resources"], f"{LORA_INIT_CONTAINER}-{i}",
                                     ["download", adapter.source, "--revision", "main"]))
    if inits:
        pod["initContainers"] = inits
    pod |= {"containers": [server], "volumes": volumes, **_scheduling(spec)}
    return pod


def gpus_per_replica(spec: ServiceSpec, tp: int) -> int:
    return tp if spec.gpu.enabled else 0


def workload_kind(spec: ServiceSpec) -> str:
    """A StatefulSet when each replica has its own cache PVC (its volumeClaimTemplates are the
    Kubernetes way to give each pod its own claim), else a Deployment."""
    return "StatefulSet" if spec.cache.per_replica else "Deployment"


def workload_kind_of(raw_spec: dict[str, Any]) -> str:
    """`workload_kind` from a resource's raw spec (status reads it without parsing)."""
    cache = (raw_spec.get("model") or {}).get("cache") or {}
    return "StatefulSet" if cache.get("type") == "pvcPerReplica" else "Deployment"


def _workload_meta(spec: ServiceSpec, tp: int, generation: int) -> dict[str, Any]:
    """`generation` (the resource's metadata.generation) is recorded so status can tell whether
    the workload already carries the latest spec."""
    return {
        "name": spec.name,
        "namespace": spec.namespace,
        "labels": labels(spec),
        "annotations": {
            ANNOTATION_GENERATION: str(generation),
            ANNOTATION_TP: str(tp),
            ANNOTATION_GPUS: str(gpus_per_replica(spec, tp)),
        },
    }


def _pod_template(spec: ServiceSpec, tp: int) -> dict[str, Any]:
    return {
        "metadata": {
            "labels": {**spec.pod_labels, **labels(spec)},
            "annotations": {
                "kubectl.kubernetes.io/default-container": CONTAINER,
                **spec.pod_annotations,
            },
        },
        "spec": _pod_spec(spec, tp),
    }


def build_deployment(
    spec: ServiceSpec, tp: int, generation: int, in_place: bool = False
) -> dict[str, Any]:
    """The Deployment for `spec` at TP `tp`; `in_place`: see `_strategy`."""
    # A rollout may wait out a whole startup window per pod (and a download before it); don't
    # call it stalled before that.
    deadline = max(600, spec.startup.window_seconds + 300)
    if fetches(spec):
        deadline += DOWNLOAD_ALLOWANCE_S
    meta = _workload_meta(spec, tp, generation)
    if in_place:
        meta["annotations"][ANNOTATION_IN_PLACE] = str(generation)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": selector_labels(spec.name)},
            "strategy": _strategy(spec, in_place),
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": deadline,
            "template": _pod_template(spec, tp),
        },
    }


def cache_claim_template(spec: ServiceSpec) -> dict[str, Any]:
    """The per-replica cache PVC (`model-cache-NAME-<ordinal>`): immutable once the StatefulSet
    exists (the reconciler recreates the StatefulSet, keeping its pods, when it changes)."""
    c = spec.cache
    claim: dict[str, Any] = {
        "accessModes": list(c.access_modes),
        "resources": {"requests": {"storage": c.size}},
    }
    if c.storage_class is not None:
        claim["storageClassName"] = c.storage_class
    # NOTE: no version label: a new image must not change a template the API server keeps fixed.
    stable = {k: v for k, v in labels(spec).items() if k != LABEL_VERSION}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": CACHE_VOLUME, "labels": stable},
        "spec": claim,
    }


def build_statefulset(spec: ServiceSpec, tp: int, generation: int) -> dict[str, Any]:
    """The StatefulSet for `spec` (model.cache type pvcPerReplica): the same pods as the
    Deployment's, each with its own cache PVC. Pods start and stop in parallel (no ordering is
    needed between replicas) and roll one `maxUnavailable` at a time, in place; a scaled-down
    replica's PVC is kept for the next scale-up, and all go with the StatefulSet."""
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _workload_meta(spec, tp, generation),
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": selector_labels(spec.name)},
            "serviceName": spec.name,
            "podManagementPolicy": "Parallel",
            "updateStrategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": spec.rollout.max_unavailable},
            },
            "revisionHistoryLimit": 3,
            "persistentVolumeClaimRetentionPolicy": {
                "whenDeleted": "Delete",
                "whenScaled": "Retain",
            },
            "template": _pod_template(spec, tp),
            "volumeClaimTemplates": [cache_claim_template(spec)],
        },
    }


def build_workload(
    spec: ServiceSpec, tp: int, generation: int, in_place: bool = False
) -> dict[str, Any]:
    if workload_kind(spec) == "StatefulSet":
        return build_statefulset(spec, tp, generation)
    return build_deployment(spec, tp, generation, in_place)


def object_meta(spec: ServiceSpec) -> dict[str, Any]:
    """Name, namespace and labels of an object the InferenceService owns."""
    return {"name": spec.name, "namespace": spec.namespace, "labels": labels(spec)}


def build_service(spec: ServiceSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(spec),
        "spec": {
            "type": spec.service_type,
            "selector": selector_labels(spec.name),
            "ports": [
                {"name": "http", "port": spec.service_port, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }

"""KWOK: its Stage configuration (the kubelet it pretends to be) and the fake nodes.

The stages are KWOK v0.8.0's defaults (``kustomize/stage/node/fast``,
``node/heartbeat-with-lease`` and ``pod/fast``: node-initialize, node-heartbeat-with-lease,
pod-ready, pod-complete, pod-delete) plus pod behaviours chosen by pod annotations, so a test can
make a pod misbehave by annotating the pod template:

- ``radixserve.dev/test-crashloop: "true"`` — Running, not Ready, every container waiting in
  ``CrashLoopBackOff`` with ``restartCount: 5`` and a last state ``terminated`` (exit 1, Error);
- ``radixserve.dev/test-never-ready: "true"`` — Running, containers running, never Ready;
- ``radixserve.dev/test-ready-delay-ms: "<ms>"`` — Running and not Ready at once, Ready after that
  many milliseconds (KWOK reads the delay from the annotation).

Precedence when several are set: crashloop, then never-ready, then ready-delay. Pods without them
become Running and Ready immediately; deleted pods are removed at once (``pod-delete``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .kube import Api, ApiError

MANAGE_ANNOTATION = "kwok.x-k8s.io/node"
MANAGE_SELECTOR = f"{MANAGE_ANNOTATION}=fake"
POD_CIDR = "10.244.0.0/16"
# Beside a real node (whose pods use 10.244.0.0/24) the fake pods get their own range, routed into
# the node's sink so that nothing sent to a fake pod takes the machine's default route.
POD_CIDR_BESIDE_NODE = "10.245.0.0/16"
TAINT = {"key": MANAGE_ANNOTATION, "value": "fake", "effect": "NoSchedule"}
DEFAULT_NODE_IP = "10.0.0.1"
NODE_LEASE_DURATION_S = 40

ANN_CRASHLOOP = "radixserve.dev/test-crashloop"
ANN_NEVER_READY = "radixserve.dev/test-never-ready"
ANN_READY_DELAY_MS = "radixserve.dev/test-ready-delay-ms"


def _ann(key: str) -> str:
    return f'.metadata.annotations["{key}"]'


# --- node stages: the shape of KWOK v0.8.0's node/fast and node/heartbeat-with-lease (Apache-2.0); ---
# NOTE: kwok loads no built-in stages when a config file is given, so the node ones are spelled out

NODE_INITIALIZE = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-initialize
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values:
      - 'True'
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $lastTransitionTime := or .metadata.creationTimestamp $now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $lastTransitionTime | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type  | Quote}}
      {{ end }}

      {{ $hasInternalIP := false }}
      {{ $hasHostname := false }}
      {{ range .status.addresses }}
        {{ if eq .type "InternalIP" }}
          {{ $hasInternalIP = true }}
        {{ end }}
        {{ if eq .type "Hostname" }}
          {{ $hasHostname = true }}
        {{ end }}
      {{ end }}
      {{ if or (not $hasInternalIP) (not $hasHostname) }}
      addresses:
      {{ end }}
      {{ if not $hasInternalIP }}
      {{ with NodeIP }}
      - address: {{ . | Quote }}
        type: InternalIP
      {{ end }}
      {{ end }}
      {{ if not $hasHostname }}
      {{ with NodeName }}
      - address: {{ . | Quote }}
        type: Hostname
      {{ end }}
      {{ end }}

      {{ with NodePort }}
      daemonEndpoints:
        kubeletEndpoint:
          Port: {{ . }}
      {{ end }}

      allocatable:
      {{ with .status.allocatable }}
      {{ YAML . 1 }}
      {{ else }}
        cpu: 1k
        memory: 1Ti
        pods: 1M
      {{ end }}
      capacity:
      {{ with .status.capacity }}
      {{ YAML . 1 }}
      {{ else }}
        cpu: 1k
        memory: 1Ti
        pods: 1M
      {{ end }}

      {{ $nodeInfo := .status.nodeInfo }}
      {{ $kwokVersion := printf "kwok-%s" Version }}
      nodeInfo:
        architecture: {{ or $nodeInfo.architecture "amd64" }}
        bootID: {{ or $nodeInfo.bootID `""` }}
        containerRuntimeVersion: {{ or $nodeInfo.containerRuntimeVersion $kwokVersion }}
        kernelVersion: {{ or $nodeInfo.kernelVersion $kwokVersion }}
        kubeProxyVersion: {{ or $nodeInfo.kubeProxyVersion $kwokVersion }}
        kubeletVersion: {{ or $nodeInfo.kubeletVersion $kwokVersion }}
        machineID: {{ or $nodeInfo.machineID `""` }}
        operatingSystem: {{ or $nodeInfo.operatingSystem "linux" }}
        osImage: {{ or $nodeInfo.osImage `""` }}
        systemUUID: {{ or $nodeInfo.systemUUID `""` }}
      phase: Running
"""

NODE_HEARTBEAT_WITH_LEASE = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-heartbeat-with-lease
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'In'
      values:
      - 'True'
  delay:
    durationMilliseconds: 600000
    jitterDurationMilliseconds: 610000
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $lastTransitionTime := or .metadata.creationTimestamp $now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $lastTransitionTime | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}

      addresses:
      {{ with .status.addresses }}
      {{ YAML . 1 }}
      {{ else }}
      {{ with NodeIP }}
      - address: {{ . | Quote }}
        type: InternalIP
      {{ end }}
      {{ with NodeName }}
      - address: {{ . | Quote }}
        type: Hostname
      {{ end }}
      {{ end }}

      {{ with NodePort }}
      daemonEndpoints:
        kubeletEndpoint:
          Port: {{ . }}
      {{ end }}
"""

# --- pod stages: KWOK v0.8.0 kustomize/stage/pod/fast, pod-ready narrowed to un-annotated pods ---

# Host and pod IPs, as KWOK's pod-ready sets them.
_POD_IPS = """\
      {{ $hostIPs := NodeIPsWith .spec.nodeName }}
      {{ with $hostIPs }}
      hostIP: {{ index . 0 | Quote }}
      hostIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      {{ $podIPs := PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
      {{ with $podIPs }}
      podIP: {{ index . 0 | Quote }}
      podIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
"""

_INIT_CONTAINERS_DONE = """\
      initContainerStatuses:
      {{ range .spec.initContainers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        restartCount: 0
        {{ if eq .restartPolicy "Always" }}
        started: true
        state:
          running:
            startedAt: {{ $now | Quote }}
        {{ else }}
        state:
          terminated:
            exitCode: 0
            finishedAt: {{ $now | Quote }}
            reason: Completed
            startedAt: {{ $now | Quote }}
        {{ end }}
      {{ end }}
"""


def _conditions(ready: bool) -> str:
    status = '"True"' if ready else '"False"'
    # Conditions are merged by type: a Ready pod must also clear an earlier not-ready reason.
    reason = "\n        reason: ''" if ready else "\n        reason: ContainersNotReady"
    return f"""\
      conditions:
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: "True"
        type: Initialized
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: {status}
        type: Ready{reason}
      - lastTransitionTime: {{{{ $now | Quote }}}}
        status: {status}
        type: ContainersReady{reason}
"""


def _running_containers(ready: bool) -> str:
    return f"""\
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - image: {{{{ .image | Quote }}}}
        name: {{{{ .name | Quote }}}}
        ready: {str(ready).lower()}
        restartCount: 0
        started: true
        state:
          running:
            startedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
"""


_CRASHLOOP_CONTAINERS = """\
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 5
        started: false
        lastState:
          terminated:
            exitCode: 1
            reason: Error
            startedAt: {{ $now | Quote }}
            finishedAt: {{ $now | Quote }}
        state:
          waiting:
            reason: CrashLoopBackOff
            message: {{ printf "back-off 5m0s restarting failed container=%s pod=%s_%s(%s)" .name $root.metadata.name $root.metadata.namespace $root.metadata.uid | Quote }}
      {{ end }}
"""


def _pod_stage(name: str, match: list[tuple[str, str, list[str]]], status: str,
               delay_from: str | None = None) -> str:
    exprs = []
    for key, op, values in match:
        exprs.append(f"    - key: '{key}'\n      operator: '{op}'")
        if values:
            exprs.append("      values:\n" + "\n".join(f"      - '{v}'" for v in values))
    delay = ""
    if delay_from:
        delay = (f"  delay:\n    durationMilliseconds: 0\n    durationFrom:\n"
                 f"      jq:\n        expression: '{delay_from}'\n")
    return f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: {name}
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
{chr(10).join(exprs)}
{delay}  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      {{{{ $root := . }}}}
{status}"""


_LIVE = ('.metadata.deletionTimestamp', 'DoesNotExist', [])
_PENDING = ('.status.phase', 'In', ['Pending'])
_RUNNING = ('.status.phase', 'In', ['Running'])
_NOT_READY = ('.status.conditions.[] | select( .type == "Ready" ) | .status', 'NotIn', ['True'])
_NO_CRASHLOOP = (_ann(ANN_CRASHLOOP), 'NotIn', ['true'])
_NO_NEVER_READY = (_ann(ANN_NEVER_READY), 'NotIn', ['true'])

_RUNNING_PHASE = "      phase: Running\n      startTime: {{ $now | Quote }}\n"

POD_READY = _pod_stage(
    "pod-ready",
    [_LIVE, _PENDING, _NOT_READY, _NO_CRASHLOOP, _NO_NEVER_READY,
     (_ann(ANN_READY_DELAY_MS), 'DoesNotExist', [])],
    _conditions(True) + _running_containers(True) + _INIT_CONTAINERS_DONE + _POD_IPS
    + _RUNNING_PHASE,
)

POD_CRASHLOOP = _pod_stage(
    "radixserve-pod-crashloop",
    [_LIVE, _PENDING, (_ann(ANN_CRASHLOOP), 'In', ['true'])],
    _conditions(False) + _CRASHLOOP_CONTAINERS + _INIT_CONTAINERS_DONE + _POD_IPS
    + _RUNNING_PHASE,
)

POD_NEVER_READY = _pod_stage(
    "radixserve-pod-never-ready",
    [_LIVE, _PENDING, _NO_CRASHLOOP, (_ann(ANN_NEVER_READY), 'In', ['true'])],
    _conditions(False) + _running_containers(False) + _INIT_CONTAINERS_DONE + _POD_IPS
    + _RUNNING_PHASE,
)

# Ready after a delay: first Running with containers started but not ready, then Ready once the
# annotation's milliseconds have passed (the delay counts from when the pod is seen Running).
POD_DELAYED_START = _pod_stage(
    "radixserve-pod-delayed-start",
    [_LIVE, _PENDING, _NOT_READY, _NO_CRASHLOOP, _NO_NEVER_READY,
     (_ann(ANN_READY_DELAY_MS), 'Exists', [])],
    _conditions(False) + _running_containers(False) + _INIT_CONTAINERS_DONE + _POD_IPS
    + _RUNNING_PHASE,
)

POD_DELAYED_READY = _pod_stage(
    "radixserve-pod-delayed-ready",
    [_LIVE, _RUNNING, _NOT_READY, _NO_CRASHLOOP, _NO_NEVER_READY,
     (_ann(ANN_READY_DELAY_MS), 'Exists', [])],
    _conditions(True) + _running_containers(True),
    delay_from=f'({_ann(ANN_READY_DELAY_MS)} | tostring) + "ms"',
)

POD_COMPLETE = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-complete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
    - key: '.metadata.ownerReferences.[].kind'
      operator: 'In'
      values:
      - 'Job'
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $root := . }}
      containerStatuses:
      {{ range $index, $item := .spec.containers }}
      {{ $origin := index $root.status.containerStatuses $index }}
      - image: {{ $item.image | Quote }}
        name: {{ $item.name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 0
            finishedAt: {{ $now | Quote }}
            reason: Completed
            startedAt: {{ $now | Quote }}
      {{ end }}
      phase: Succeeded
"""

POD_DELETE = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
  next:
    delete: true
"""

STAGES = (
    NODE_INITIALIZE, NODE_HEARTBEAT_WITH_LEASE,
    POD_READY, POD_CRASHLOOP, POD_NEVER_READY, POD_DELAYED_START, POD_DELAYED_READY,
    POD_COMPLETE, POD_DELETE,
)


def write_config(path: Path) -> bool:
    """Write the ``--config`` file (every Stage, one YAML document each); True if it changed."""
    text = "---\n".join(STAGES)
    if path.is_file() and path.read_text() == text:
        return False
    path.write_text(text)
    return True


def args(kubeconfig: Path, config: Path, server_port: int, beside_node: bool = False) -> list[str]:
    """kwok's flags, after the binary."""
    return [
        f"--kubeconfig={kubeconfig}",
        f"--config={config}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={MANAGE_SELECTOR}",
        f"--cidr={POD_CIDR_BESIDE_NODE if beside_node else POD_CIDR}",
        f"--node-ip={DEFAULT_NODE_IP}",
        f"--node-lease-duration-seconds={NODE_LEASE_DURATION_S}",
        f"--server-address=127.0.0.1:{server_port}",
    ]


# --- fake nodes -----------------------------------------------------------------------------------

GPU_LABELS = {
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "NVIDIA-H200",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.memory": "143771",
}


def _node(name: str, ip: str, resources: dict[str, str], labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {MANAGE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **labels,
            },
        },
        "spec": {},
        "status": {
            "allocatable": dict(resources),
            "capacity": dict(resources),
            "addresses": [
                {"type": "InternalIP", "address": ip},
                {"type": "Hostname", "address": name},
            ],
        },
    }


def nodes(beside_node: bool = False) -> list[dict[str, Any]]:
    """gpu-node-0/1 (8 × H200, 64 CPU, 512Gi) and cpu-node-0 (16 CPU, 64Gi).

    Beside a real node they are tainted (pods land on the real node unless they tolerate
    ``kwok.x-k8s.io/node=fake``) and have loopback addresses: the API server then reaches nothing
    when it dials a fake kubelet (``kubectl logs`` fails at once instead of leaving the machine).
    """
    gpu = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8",
           "ephemeral-storage": "1Ti"}
    cpu = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "1Ti"}
    net = "127.0.10" if beside_node else "10.0.0"
    made = [
        _node("gpu-node-0", f"{net}.10", gpu, GPU_LABELS),
        _node("gpu-node-1", f"{net}.11", gpu, GPU_LABELS),
        _node("cpu-node-0", f"{net}.20", cpu, {}),
    ]
    if beside_node:
        for node in made:
            node["spec"]["taints"] = [dict(TAINT)]
    return made


def create_nodes(api: Api, beside_node: bool = False) -> list[str]:
    """Create the fake nodes that do not exist yet (status included); returns their names."""
    names = []
    for node in nodes(beside_node):
        name = node["metadata"]["name"]
        names.append(name)
        try:
            api.get(f"/api/v1/nodes/{name}")
            continue
        except ApiError as e:
            if e.status != 404:
                raise
        created = api.post("/api/v1/nodes", node)
        if not created.get("status", {}).get("capacity"):
            # Some API server versions drop status on create: set it through the subresource.
            api.patch(f"/api/v1/nodes/{name}/status", {"status": node["status"]})
    return names


def release_leases(api: Api) -> None:
    """Delete the fake nodes' leases before (re)starting kwok.

    Each kwok instance has its own identity and only plays the nodes whose lease it holds; a new
    instance would otherwise ignore them (and their pods) until the old lease expires (40 s).
    """
    for node in nodes():
        name = node["metadata"]["name"]
        api.delete(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}")


def nodes_ready(api: Api, names: list[str]) -> list[str]:
    """The names among ``names`` that are not Ready yet."""
    pending = []
    for name in names:
        try:
            node = api.get(f"/api/v1/nodes/{name}")
        except ApiError:
            pending.append(name)
            continue
        conds = node.get("status", {}).get("conditions") or []
        if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds):
            pending.append(name)
    return pending

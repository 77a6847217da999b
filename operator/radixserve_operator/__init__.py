"""The radixserve Kubernetes operator: the `InferenceService` CRD, its kopf reconciler, TP sizing
and status. Names shared by every module live here."""

from __future__ import annotations

GROUP = "radixserve.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SINGULAR = "inferenceservice"
SHORT_NAME = "rsvc"

FIELD_MANAGER = "radixserve-operator"
APP_NAME = "radixserve"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_VERSION = "app.kubernetes.io/version"
# The part of an InferenceService a pod plays; the router's pods carry `router` (and the
# resource's instance label): the server's NetworkPolicy lets them in.
LABEL_RS_COMPONENT = f"{GROUP}/component"
COMPONENT_ROUTER = "router"

# On the Deployment (not its pod template, so writing them never restarts pods).
ANNOTATION_GENERATION = f"{GROUP}/generation"
ANNOTATION_TP = f"{GROUP}/tensor-parallel-size"
ANNOTATION_GPUS = f"{GROUP}/gpus-per-replica"
# The generation whose rollout replaces pods in place because no surge pod fit (rollout.py).
ANNOTATION_IN_PLACE = f"{GROUP}/replacing-in-place"

SERVER_PORT = 8000
DEFAULT_IMAGE = "ghcr.io/radixserve/radixserve:0.1.0"
DEFAULT_CPU_IMAGE = "ghcr.io/radixserve/radixserve:0.1.0-cpu"

__all__ = [name for name in dir() if name.isupper()]

{{/*
Rules for the namespaced objects the operator reconciles (docs/operator.md, "API access"): granted
cluster-wide (ClusterRole) in cluster scope, or per watched namespace (Role) in namespaced scope.
The workload and Service go with their owner through garbage collection; the optional children
(PodDisruptionBudget, HorizontalPodAutoscaler, KEDA ScaledObject, NetworkPolicy, and the workload
kind the cache mode no longer uses: a Deployment, or a StatefulSet for a PVC per replica) are deleted by the
operator when the spec stops asking for them (get: it checks the owner reference first).
*/}}
{{- define "radixserve.workloadRules" -}}
- apiGroups: ["radixserve.dev"]
  resources: ["inferenceservices"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["radixserve.dev"]
  resources: ["inferenceservices/status"]
  verbs: ["patch"]
# Owner references with blockOwnerDeletion (kopf.adopt) need this where the
# OwnerReferencesPermissionEnforcement admission plugin is on (e.g. OpenShift).
- apiGroups: ["radixserve.dev"]
  resources: ["inferenceservices/finalizers"]
  verbs: ["update"]
# Server-side apply: patch, and create when the object does not exist yet. A StatefulSet when
# model.cache is pvcPerReplica (deleted, its pods kept, when its claim template must change).
- apiGroups: ["apps"]
  resources: ["deployments", "statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# spec.router: NAME-router's account and its Role (list and watch pods, which the operator holds
# itself, so granting it is no escalation); deleted when the router is turned off.
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
# The access modes of a shared model-cache claim (condition CacheSharedReadWriteOnce).
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects"]
  verbs: ["get", "create", "patch", "delete"]
# The NetworkPolicy of each InferenceService's pods; deleted (its own only) when the chart's
# networkPolicy.enabled turns it off.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "patch", "delete"]
{{- end }}

{{/* kopf peering: cluster-wide objects for a cluster-wide operator, namespaced ones otherwise. */}}
{{- define "radixserve.peeringRules" -}}
- apiGroups: ["kopf.dev"]
  resources: [{{ if eq .Values.operator.scope "cluster" }}"clusterkopfpeerings"{{ else }}"kopfpeerings"{{ end }}]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}

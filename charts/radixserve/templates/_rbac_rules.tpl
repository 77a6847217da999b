{{/*
Rules for the namespaced objects the operator reconciles (docs/operator.md, "API access"): granted
cluster-wide (ClusterRole) in cluster scope, or per watched namespace (Role) in namespaced scope.
Nothing is deleted: children go with their owner through garbage collection.
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
# Server-side apply: patch, and create when the object does not exist yet.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{/* kopf peering: cluster-wide objects for a cluster-wide operator, namespaced ones otherwise. */}}
{{- define "radixserve.peeringRules" -}}
- apiGroups: ["kopf.dev"]
  resources: [{{ if eq .Values.operator.scope "cluster" }}"clusterkopfpeerings"{{ else }}"kopfpeerings"{{ end }}]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}

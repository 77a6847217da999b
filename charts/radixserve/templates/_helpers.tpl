{{/* Names and labels shared by every template. */}}

{{- define "radixserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "radixserve.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "radixserve.operatorName" -}}
{{- printf "%s-operator" (include "radixserve.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "radixserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "radixserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: radixserve
{{- end }}

{{- define "radixserve.operatorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "radixserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "radixserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "radixserve.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Namespaces the operator watches in namespaced mode (default: the release namespace). */}}
{{- define "radixserve.watchNamespaces" -}}
{{- if .Values.operator.watchNamespaces }}
{{- toJson (uniq .Values.operator.watchNamespaces) }}
{{- else }}
{{- toJson (list .Release.Namespace) }}
{{- end }}
{{- end }}

{{- define "radixserve.operatorImage" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) }}
{{- end }}

{{- define "radixserve.runtimeImage" -}}
{{- printf "%s:%s" .Values.runtime.image.repository (default .Chart.AppVersion .Values.runtime.image.tag) }}
{{- end }}

{{- define "radixserve.sampleFile" -}}
{{- if eq .Values.sample.variant "gpu" }}samples/inferenceservice.yaml{{ else }}samples/inferenceservice-cpu.yaml{{ end }}
{{- end }}

{{- define "radixserve.sampleName" -}}
{{- $sample := include "radixserve.sampleFile" . | .Files.Get | fromYaml }}
{{- default $sample.metadata.name .Values.sample.name }}
{{- end }}

{{- define "tsoracle.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tsoracle.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tsoracle.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tsoracle.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tsoracle.labels" -}}
{{ include "tsoracle.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tsoracle
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "tsoracle.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tsoracle.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* What the operator needs, and nothing more (see docs/operator.md, "RBAC"). */}}
{{- define "tsoracle.rules" -}}
- apiGroups: [tsoracle.io]
  resources: [timestamporacles]
  verbs: [get, list, watch, patch]
- apiGroups: [tsoracle.io]
  resources: [timestamporacles/status]
  verbs: [get, patch]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# spec.catalog: the catalog's Deployment and Service (server-side apply creates, patches;
# removed when disabled). Read one by one, never listed or watched.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, create, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, create, patch, delete]
{{- end -}}

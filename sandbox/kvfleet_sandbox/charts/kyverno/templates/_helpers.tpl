{{/* The names upstream derives for release "kyverno": fullname "kyverno", "<fullname>-admission-controller". */}}
{{- define "kyverno.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kyverno.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "kyverno.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "kyverno.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kyverno.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "kyverno.admission.name" -}}
{{- printf "%s-admission-controller" (include "kyverno.name" .) -}}
{{- end -}}

{{- define "kyverno.admission.matchLabels" -}}
app.kubernetes.io/part-of: {{ include "kyverno.fullname" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: admission-controller
{{- end -}}

{{- define "kyverno.admission.labels" -}}
{{ include "kyverno.admission.matchLabels" . }}
app.kubernetes.io/name: {{ include "kyverno.admission.name" . }}
app.kubernetes.io/version: {{ .Chart.Version | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kyverno.admission.image" -}}
{{- $img := .Values.admissionController.container.image -}}
{{ default $img.defaultRegistry $img.registry }}/{{ $img.repository }}:{{ default .Chart.AppVersion $img.tag }}
{{- end -}}

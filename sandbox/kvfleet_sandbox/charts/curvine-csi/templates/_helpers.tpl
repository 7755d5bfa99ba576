{{- define "curvine-csi.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "curvine-csi.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default (printf "v%s" .Chart.AppVersion) }}
{{- end -}}

{{/* Release name alone when it already says "curvine-csi" (the usual `helm install curvine-csi ...`). */}}
{{- define "curvine-csi.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* One name per component for its ServiceAccount, ClusterRole and ClusterRoleBinding: <fullname>-node and
     <fullname>-controller (curvine-csi-node / curvine-csi-controller for the usual release name). */}}
{{- define "curvine-csi.componentName" -}}
{{- printf "%s-%s" (include "curvine-csi.fullname" (index . 0)) (index . 1) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

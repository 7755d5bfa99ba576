{{/* Release name alone when it already says "curvine" (the usual `helm install curvine ...`). */}}
{{- define "curvine.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "curvine.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "curvine.labels" -}}
{{ include "curvine.selector" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "curvine.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default (printf "v%s" .Chart.AppVersion) }}
{{- end -}}

{{/* Kubernetes quantity -> Curvine size unit: 100Gi -> 100GB (Curvine's units are binary). */}}
{{- define "curvine.size" -}}
{{- . | replace "Ti" "TB" | replace "Gi" "GB" | replace "Mi" "MB" | replace "Ki" "KB" -}}
{{- end -}}

{{/* The worker data dirs in Curvine's `[TYPE:SIZE]PATH` form, comma separated. */}}
{{- define "curvine.dataDirs" -}}
{{- $dirs := list -}}
{{- range .Values.worker.storage.dataDirs -}}
{{- if .enabled -}}
{{- $dirs = append $dirs (printf "[%s:%s]%s" (.type | default "SSD") (include "curvine.size" .size) .mountPath) -}}
{{- end -}}
{{- end -}}
{{- join "," $dirs -}}
{{- end -}}

{{/* The ServiceAccount every Curvine pod and the pre-upgrade hook run as. */}}
{{- define "curvine.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "curvine.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/* On upgrade, refuse a change of master.replicas (the Raft group cannot be resized in place): read the live
     master StatefulSet with `lookup`, as upstream does; the hook Job checks the same thing in the cluster. */}}
{{- define "curvine.keepMasterReplicas" -}}
{{- if .Release.IsUpgrade -}}
{{- $live := lookup "apps/v1" "StatefulSet" .Release.Namespace (printf "%s-master" (include "curvine.fullname" .)) -}}
{{- $was := 0 -}}
{{- if $live }}{{- $was = int $live.spec.replicas -}}{{- end -}}
{{- if and (gt $was 0) (ne $was (int .Values.master.replicas)) -}}
{{- fail (printf "master.replicas cannot change on upgrade (live %d, requested %d): delete and reinstall the Curvine cluster to resize its masters" $was (int .Values.master.replicas)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Format flags travel in every Curvine container's env: a pod acts on the flags it was created with. Only
     master and worker: upstream's configmap renders no journal flag (docs/reference/curvine.md#formatjournal). */}}
{{- define "curvine.formatEnv" -}}
- name: CURVINE_CLUSTER_ID
  value: {{ .Values.cluster.id | quote }}
- name: CURVINE_FORMAT_MASTER
  value: {{ .Values.cluster.formatMaster | toString | quote }}
- name: CURVINE_FORMAT_WORKER
  value: {{ .Values.cluster.formatWorker | toString | quote }}
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end -}}

{{/* One volume of master.storage.*: hostPath, a claim template (see curvine.claims) or an emptyDir. */}}
{{- define "curvine.podVolume" -}}
{{- $v := index . 1 -}}
{{- if and $v.enabled $v.hostPath (not $v.storageClass) }}
- name: {{ index . 0 }}
  hostPath:
    path: {{ $v.hostPath }}
    type: DirectoryOrCreate
{{- else if not $v.enabled }}
- name: {{ index . 0 }}
  emptyDir: {}
{{- end -}}
{{- end -}}

{{- define "curvine.claim" -}}
{{- $v := index . 1 -}}
{{- if and $v.enabled (or $v.storageClass (not $v.hostPath)) }}
- metadata:
    name: {{ index . 0 }}
  spec:
    accessModes: [ReadWriteOnce]
    {{- with $v.storageClass }}
    storageClassName: {{ . }}
    {{- end }}
    resources:
      requests:
        storage: {{ $v.size }}
{{- end -}}
{{- end -}}

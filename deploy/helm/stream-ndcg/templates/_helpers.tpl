{{- define "stream-ndcg.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "stream-ndcg.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "stream-ndcg.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "stream-ndcg.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "stream-ndcg.selectorLabels" -}}
app.kubernetes.io/name: {{ include "stream-ndcg.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "stream-ndcg.labels" -}}
{{ include "stream-ndcg.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "stream-ndcg.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{- define "stream-ndcg.secretName" -}}
{{- .Values.secrets.existingSecret | default (include "stream-ndcg.fullname" .) }}
{{- end }}

{{/* A setting's value as the service reads it: lists joined with commas. */}}
{{- define "stream-ndcg.setting" -}}
{{- if kindIs "slice" . }}{{ join "," . }}{{ else }}{{ . }}{{ end }}
{{- end }}

{{/* The labels that identify one series of the shared quality gauges: pipeline, k, window and
every exported segment label. Deduplicating the instances' copies by exactly these keeps target
labels (instance, pod, node, container, ...) from splitting or doubling sums. */}}
{{- define "stream-ndcg.segmentLabels" -}}
{{- range .Values.config.segment_labels }}, {{ . }}{{ end }}
{{- end }}

{{- define "stream-ndcg.alertK" -}}
{{- $ks := list }}{{ range .Values.config.k }}{{ $ks = append $ks (int .) }}{{ end }}
{{- $k := 0 }}
{{- if .Values.alerts.k }}{{ $k = int .Values.alerts.k }}{{ else }}{{ range $ks }}{{ if gt . $k }}{{ $k = . }}{{ end }}{{ end }}{{ end }}
{{- if not (has $k $ks) }}{{ fail (printf "alerts.k %v is not one of config.k %v" $k $ks) }}{{ end }}
{{- $k }}
{{- end }}

{{- define "stream-ndcg.alertSegmentLabel" -}}
{{- $label := .Values.alerts.segmentLabel | default (first .Values.config.segment_labels | default "") }}
{{- if and $label (not (has $label .Values.config.segment_labels)) }}
{{- fail (printf "alerts.segmentLabel %q is not one of config.segment_labels %v" $label .Values.config.segment_labels) }}
{{- end }}
{{- $label }}
{{- end }}

{{- define "stream-ndcg.upSelector" -}}
{{- .Values.alerts.upSelector | default (printf "job=%q, namespace=%q" (include "stream-ndcg.fullname" .) .Release.Namespace) }}
{{- end }}

{{/* An alert's runbook on the docs site: <base>/runbooks/<kebab name>/#<name in lower case>,
     e.g. StreamNdcgConsumerLagHigh: runbooks/consumer-lag-high/#streamndcgconsumerlaghigh
     (docs/runbooks/consumer-lag-high.md, whose title is the alert's name). */}}
{{- define "stream-ndcg.runbook" -}}
{{- $page := trimPrefix "StreamNdcg" .alert | kebabcase }}
{{- printf "%s/runbooks/%s/#%s" (trimSuffix "/" .root.Values.alerts.runbookBaseUrl) $page (lower .alert) }}
{{- end }}

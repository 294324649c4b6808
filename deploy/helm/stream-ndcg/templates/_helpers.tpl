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

{{/* The control of the comparison alert as label=value: alerts.control, else the service's
control setting (config.control, the API's default), else none. */}}
{{- define "stream-ndcg.alertControlSetting" -}}
{{- $control := toString (.Values.alerts.control | default (.Values.config.control | default "")) | trim }}
{{- if $control }}
{{- $parts := splitn "=" 2 $control }}
{{- if or (not (contains "=" $control)) (not (trim $parts._0)) (not (trim $parts._1)) }}
{{- fail (printf "alerts.control %q is not label=value (e.g. variant=A), as the service's control setting" $control) }}
{{- end }}
{{- printf "%s=%s" (trim $parts._0) (trim $parts._1) }}
{{- end }}
{{- end }}

{{/* The segment label of the comparison alert: alerts.segmentLabel, else the control's label,
else the first of config.segment_labels. */}}
{{- define "stream-ndcg.alertSegmentLabel" -}}
{{- $control := include "stream-ndcg.alertControlSetting" . }}
{{- $controlLabel := regexReplaceAll "=.*" $control "" }}
{{- $label := .Values.alerts.segmentLabel | default $controlLabel | default (first .Values.config.segment_labels | default "") }}
{{- if and .Values.alerts.segmentLabel (not (has $label .Values.config.segment_labels)) }}
{{- fail (printf "alerts.segmentLabel %q is not one of config.segment_labels %v" $label .Values.config.segment_labels) }}
{{- end }}
{{- if and $control (not (has $controlLabel .Values.config.segment_labels)) }}
{{- fail (printf "the control %q: its label is not one of config.segment_labels %v" $control .Values.config.segment_labels) }}
{{- end }}
{{- if and $control (ne $label $controlLabel) }}
{{- fail (printf "the control %q is not a value of alerts.segmentLabel %q" $control $label) }}
{{- end }}
{{- $label }}
{{- end }}

{{/* The control's value (label=value's value) when it has one, else nothing. */}}
{{- define "stream-ndcg.alertControl" -}}
{{- $_ := include "stream-ndcg.alertSegmentLabel" . }}
{{- regexReplaceAll "^[^=]*=" (include "stream-ndcg.alertControlSetting" .) "" }}
{{- end }}

{{/* The comparison alert's alpha: alerts.alpha, else config.alpha, else the service's default;
strictly between 0 and 1, as the service's alpha setting. */}}
{{- define "stream-ndcg.alertAlpha" -}}
{{- $raw := 0.05 }}
{{- if hasKey .Values.config "alpha" }}{{ $raw = .Values.config.alpha }}{{ end }}
{{- if ne (toString .Values.alerts.alpha) "" }}{{ $raw = .Values.alerts.alpha }}{{ end }}
{{- $alpha := float64 $raw }}
{{- if or (kindIs "bool" $raw) (le $alpha 0.0) (ge $alpha 1.0) }}
{{- fail (printf "alerts.alpha %v must be between 0 and 1, both excluded, as the service's alpha setting" $raw) }}
{{- end }}
{{- $alpha }}
{{- end }}

{{/* The comparison alert's N*: alerts.nStar, else config.n_star, else the service's default; a
whole number of impressions, at least 1, as the service's n_star setting. */}}
{{- define "stream-ndcg.alertNStar" -}}
{{- $raw := 10000 }}
{{- if hasKey .Values.config "n_star" }}{{ $raw = .Values.config.n_star }}{{ end }}
{{- if ne (toString .Values.alerts.nStar) "" }}{{ $raw = .Values.alerts.nStar }}{{ end }}
{{- $n := int64 $raw }}
{{- if or (kindIs "bool" $raw) (lt $n 1) (ne (float64 $raw) (float64 $n)) }}
{{- fail (printf "alerts.nStar %v must be a whole number of impressions, at least 1, as the service's n_star setting" $raw) }}
{{- end }}
{{- $n }}
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

{{/* The processes the chart runs, each a Deployment with its Service, ServiceMonitor,
NetworkPolicy and PodDisruptionBudget: run always, the stages when enabled. */}}
{{- define "stream-ndcg.components" -}}
{{- $names := list "run" }}
{{- if .Values.judge.enabled }}{{ $names = append $names "judge" }}{{ end }}
{{- if .Values.ubiBridge.enabled }}{{ $names = append $names "ubi-bridge" }}{{ end }}
{{- join " " $names }}
{{- end }}

{{/* Fills the dict it is given (root: the chart's context, component: one of the components) with
what that component's objects need: fullname, selectorLabels, labels, podLabels (strings of YAML),
values (replicaCount, config, resources, strategy, affinity, topologySpreadConstraints), api and
redis (whether it serves the drill-down API, whether it reaches Redis). Run's names and selector
are those of the releases before the stages existed: its Deployment selector cannot change on an
upgrade, so a stage's pods differ from it in app.kubernetes.io/name, which keeps every selector of
run's (Deployment, Service, ServiceMonitor, PodDisruptionBudget, NetworkPolicy) off them. */}}
{{- define "stream-ndcg.component" -}}
{{- $root := .root }}
{{- $v := $root.Values }}
{{- $common := printf "app.kubernetes.io/part-of: %s\napp.kubernetes.io/version: %s\napp.kubernetes.io/managed-by: %s\nhelm.sh/chart: %s-%s" (include "stream-ndcg.name" $root) ($root.Chart.AppVersion | quote) $root.Release.Service $root.Chart.Name $root.Chart.Version }}
{{- if eq .component "run" }}
{{- $selector := include "stream-ndcg.selectorLabels" $root }}
{{- $_ := set . "fullname" (include "stream-ndcg.fullname" $root) }}
{{- $_ := set . "selectorLabels" $selector }}
{{- $_ := set . "podLabels" (printf "%s\napp.kubernetes.io/component: run" $selector) }}
{{- $_ := set . "values" (dict "replicaCount" $v.replicaCount "config" $v.config "resources" $v.resources "strategy" $v.strategy "affinity" $v.affinity "topologySpreadConstraints" $v.topologySpreadConstraints) }}
{{- $_ := set . "api" $v.api.enabled }}
{{- $_ := set . "redis" true }}
{{- else }}
{{- $stage := index $v (get (dict "judge" "judge" "ubi-bridge" "ubiBridge") .component) }}
{{- $selector := printf "app.kubernetes.io/name: %s\napp.kubernetes.io/instance: %s\napp.kubernetes.io/component: %s" (printf "%s-%s" (include "stream-ndcg.name" $root) .component | trunc 63 | trimSuffix "-") $root.Release.Name .component }}
{{- $_ := set . "fullname" (printf "%s-%s" (include "stream-ndcg.fullname" $root | trunc (int (sub 62 (len .component))) | trimSuffix "-") .component) }}
{{- $_ := set . "selectorLabels" $selector }}
{{- $_ := set . "podLabels" $selector }}
{{- $values := omit $stage "enabled" "config" }}
{{- /* Key by key, not sprig's merge: that one lets a shared value replace a stage's false, 0 or empty. */}}
{{- $config := deepCopy $v.config }}
{{- range $key, $value := $stage.config }}{{ $_ := set $config $key $value }}{{ end }}
{{- $_ := set $values "config" $config }}
{{- $_ := set . "values" $values }}
{{- $_ := set . "api" false }}
{{- $_ := set . "redis" (eq .component "judge") }}
{{- end }}
{{- $_ := set . "labels" (printf "%s\n%s" .podLabels $common) }}
{{- end }}

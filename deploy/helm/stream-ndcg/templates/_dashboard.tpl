{{/*
The Grafana dashboard: dashboards/stream-ndcg.json with one variable and one filter per exported
segment label (config.segment_labels). Its tokens: __SEGMENT_LABELS__ (", variant, engine" in
`by` clauses), __SEGMENT_FILTERS__ (the matchers of the variables), __SEGMENT_LEGEND__, and
__COMPARISON_LABEL__ (the comparison alert's segment label, the one label its series keep).
With api.pageUrl set, every series split by every segment label links to the drill-down page of
its window and segment values, and the dashboard links to the page.
*/}}
{{- define "stream-ndcg.dashboard" -}}
{{- $labels := .Values.config.segment_labels }}
{{- $filters := "" }}
{{- $legend := list }}
{{- range $labels }}
{{- $filters = printf "%s, %s=~\"$%s\"" $filters . . }}
{{- $legend = append $legend (printf "{{%s}}" .) }}
{{- end }}
{{- $raw := .Files.Get "dashboards/stream-ndcg.json" }}
{{- $raw = replace "__SEGMENT_LABELS__" (include "stream-ndcg.segmentLabels" .) $raw }}
{{- $raw = replace "__SEGMENT_FILTERS__" (toJson $filters | trimPrefix "\"" | trimSuffix "\"") $raw }}
{{- $raw = replace "__SEGMENT_LEGEND__" (join " " $legend) $raw }}
{{- $raw = replace "__COMPARISON_LABEL__" (include "stream-ndcg.alertSegmentLabel" .) $raw }}
{{- $dashboard := fromJson $raw }}
{{- $variables := $dashboard.templating.list }}
{{- range $labels }}
{{- $query := printf "label_values(stream_ndcg_impressions{pipeline=~\"$pipeline\"}, %s)" . }}
{{- $variables = append $variables (dict "name" . "label" . "type" "query" "datasource" (dict "type" "prometheus" "uid" "${datasource}") "query" (dict "query" $query "refId" .) "definition" $query "refresh" 2 "sort" 1 "includeAll" true "multi" true "allValue" ".*" "current" (dict "text" "All" "value" "$__all") "description" (printf "Values of the segment label %s (past segment_cap: other; missing: none)." .)) }}
{{- end }}
{{- $_ := set $dashboard.templating "list" $variables }}
{{- with .Values.api.pageUrl }}
{{- $page := trimSuffix "/" . }}
{{- $query := list }}
{{- range $labels }}{{ $query = append $query (printf "segment.%s=${__field.labels.%s}" . .) }}{{ end }}
{{- $link := dict "title" "Drill down: the queries behind this series" "targetBlank" true "url" (printf "%s/#window=${__field.labels.window}&k=${k}&%s" $page (join "&" $query)) }}
{{- range $dashboard.panels }}
{{- $split := false }}
{{- /* The comparisons with the control keep one segment label: no link, which needs them all. */}}
{{- range (default list .targets) }}{{ if and $labels (contains (index $legend 0) (default "" .legendFormat)) (not (contains "difference_from_control" .expr)) }}{{ $split = true }}{{ end }}{{ end }}
{{- if $split }}{{ $_ := set .fieldConfig.defaults "links" (list $link) }}{{ end }}
{{- end }}
{{- $_ := set $dashboard "links" (append (default list $dashboard.links) (dict "title" "Drill-down page" "type" "link" "icon" "external link" "targetBlank" true "url" $page)) }}
{{- end }}
{{- toPrettyJson $dashboard }}
{{- end }}

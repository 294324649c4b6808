{{/*
The recording and alerting rules, as the `groups` of a Prometheus rules file.

Every instance of a consumer group exports the same quality gauges and event counters (they are
read from the shared state in Redis), so the rules first take one copy with
`max by (pipeline, k, window, <segment labels>)`, which keeps exactly the labels that mean
something, and only then aggregate. Means are rebuilt from numerators and denominators.
*/}}
{{- define "stream-ndcg.ruleGroups" -}}
{{- $a := .Values.alerts }}
{{- $k := include "stream-ndcg.alertK" . }}
{{- $seg := include "stream-ndcg.alertSegmentLabel" . }}
{{- $control := include "stream-ndcg.alertControl" . }}
{{- $alpha := include "stream-ndcg.alertAlpha" . }}
{{- $nStar := include "stream-ndcg.alertNStar" . }}
{{- $segs := include "stream-ndcg.segmentLabels" . }}
{{- $one := printf "pipeline, k, window%s" $segs }}
{{- $targets := join ", " $a.targetLabels }}
{{- $up := include "stream-ndcg.upSelector" . }}
{{- $short := printf "k=%q, window=%q" $k (toString $a.shortWindow) }}
{{- $long := printf "k=%q, window=%q" $k (toString $a.longWindow) }}
groups:
  - name: stream_ndcg.recording
    interval: 30s
    rules:
      - record: stream_ndcg:ndcg:mean
        expr: >-
          sum by (pipeline, k, window) (max by ({{ $one }}) (stream_ndcg_ndcg_numerator))
          / sum by (pipeline, k, window) (max by ({{ $one }}) (stream_ndcg_scored_impressions))
      - record: stream_ndcg:dcg:mean
        expr: >-
          sum by (pipeline, k, window) (max by ({{ $one }}) (stream_ndcg_dcg_numerator))
          / on (pipeline, window) group_left
          sum by (pipeline, window) (max by (pipeline, window{{ $segs }}) (stream_ndcg_impressions))
      - record: stream_ndcg:judged_ratio:mean
        expr: >-
          sum by (pipeline, k, window) (max by ({{ $one }}) (stream_ndcg_judged_ratio_numerator))
          / on (pipeline, window) group_left
          sum by (pipeline, window) (max by (pipeline, window{{ $segs }}) (stream_ndcg_impressions))
      {{- if $seg }}
      - record: stream_ndcg:ndcg:mean_by_segment
        expr: >-
          sum by (pipeline, k, window, {{ $seg }}) (max by ({{ $one }}) (stream_ndcg_ndcg_numerator))
          / sum by (pipeline, k, window, {{ $seg }}) (max by ({{ $one }}) (stream_ndcg_scored_impressions))
      - record: stream_ndcg:scored_impressions:by_segment
        expr: sum by (pipeline, k, window, {{ $seg }}) (max by ({{ $one }}) (stream_ndcg_scored_impressions))
      {{- if $control }}
      {{- $is := printf "%s=%q" $seg $control }}
      {{- $not := printf "%s!=%q" $seg $control }}
      {{- $by := printf "pipeline, k, window, %s" $seg }}
      {{- $match := "on (pipeline, k, window) group_left" }}
      # Every other value of {{ $seg }} against the control {{ $is }}, with the always-valid
      # interval of the difference (docs/service.md, "The comparison alert"). First each value's
      # real variance of its mean, the square of its standard error:
      # (squares - sum^2 / n) / (n - 1) / n, below 0 only by rounding. Absent while the squares
      # miss some impressions of the window (for a window's length after an upgrade from state
      # format 4): no interval, no alarm.
      - record: stream_ndcg:ndcg:mean_variance_by_segment
        expr: >-
          clamp_min(
            sum by ({{ $by }}) (max by ({{ $one }}) (stream_ndcg_ndcg_squares))
            - sum by ({{ $by }}) (max by ({{ $one }}) (stream_ndcg_ndcg_numerator)) ^ 2
            / stream_ndcg:scored_impressions:by_segment,
            0
          )
          / ((stream_ndcg:scored_impressions:by_segment > 1) - 1)
          / stream_ndcg:scored_impressions:by_segment
          unless on (pipeline, window, {{ $seg }})
          (
            sum by (pipeline, window, {{ $seg }}) (max by (pipeline, window{{ $segs }}) (stream_ndcg_squared_impressions))
            < sum by (pipeline, window, {{ $seg }}) (max by (pipeline, window{{ $segs }}) (stream_ndcg_impressions))
          )
      # B - A (A the control), its standard error (the arms independent) and the impressions t
      # of both arms.
      - record: stream_ndcg:ndcg:difference_from_control
        expr: >-
          stream_ndcg:ndcg:mean_by_segment{ {{- $not -}} }
          - {{ $match }} stream_ndcg:ndcg:mean_by_segment{ {{- $is -}} }
      - record: stream_ndcg:ndcg:difference_from_control_standard_error
        expr: >-
          sqrt(
            stream_ndcg:ndcg:mean_variance_by_segment{ {{- $not -}} }
            + {{ $match }} stream_ndcg:ndcg:mean_variance_by_segment{ {{- $is -}} }
          )
      - record: stream_ndcg:scored_impressions:with_control
        expr: >-
          stream_ndcg:scored_impressions:by_segment{ {{- $not -}} }
          + {{ $match }} stream_ndcg:scored_impressions:by_segment{ {{- $is -}} }
      # Each comparison's alpha: {{ $alpha }} split evenly among the comparisons with the control
      # (Bonferroni), one per other value with scored impressions in the window.
      - record: stream_ndcg:segment_comparison:alpha
        expr: >-
          {{ $alpha }} / (count by (pipeline, k, window) (stream_ndcg:scored_impressions:by_segment > 0) - 1 > 0)
      # The confidence sequence's tuning, narrowest near N* = {{ $nStar }} impressions:
      # rho^2 = (-2 ln alpha + ln(-2 ln alpha + 1)) / N*.
      - record: stream_ndcg:segment_comparison:rho_squared
        expr: >-
          (-2 * ln(stream_ndcg:segment_comparison:alpha) + ln(-2 * ln(stream_ndcg:segment_comparison:alpha) + 1))
          / {{ $nStar }}
      # The half-width s * sqrt(2 (t rho^2 + 1) / (t^2 rho^2) * ln(sqrt(t rho^2 + 1) / alpha)),
      # s = SE sqrt(t), and the interval. tests/deploy checks it against stream_ndcg.comparisons.
      - record: stream_ndcg:ndcg:difference_from_control_half_width
        expr: >-
          stream_ndcg:ndcg:difference_from_control_standard_error * sqrt(stream_ndcg:scored_impressions:with_control)
          * sqrt(
            2 * (stream_ndcg:scored_impressions:with_control * {{ $match }} stream_ndcg:segment_comparison:rho_squared + 1)
            / (stream_ndcg:scored_impressions:with_control ^ 2 * {{ $match }} stream_ndcg:segment_comparison:rho_squared)
            * ln(
              sqrt(stream_ndcg:scored_impressions:with_control * {{ $match }} stream_ndcg:segment_comparison:rho_squared + 1)
              / {{ $match }} stream_ndcg:segment_comparison:alpha
            )
          )
      - record: stream_ndcg:ndcg:difference_from_control_low
        expr: stream_ndcg:ndcg:difference_from_control - stream_ndcg:ndcg:difference_from_control_half_width
      - record: stream_ndcg:ndcg:difference_from_control_high
        expr: stream_ndcg:ndcg:difference_from_control + stream_ndcg:ndcg:difference_from_control_half_width
      {{- end }}
      {{- end }}
      - record: stream_ndcg:events:rate5m
        expr: max by (pipeline, type) (rate(stream_ndcg_events_total[5m]))
      - record: stream_ndcg:events_rejected:rate5m
        expr: max by (pipeline, reason) (rate(stream_ndcg_events_rejected_total[5m]))
      # Each partition's lag is reported by the instance that holds it: here a sum is right.
      - record: stream_ndcg:consumer_lag:sum
        expr: sum by ({{ $targets }}, topic) (stream_ndcg_consumer_lag)

  - name: stream_ndcg.alerts
    rules:
      - alert: StreamNdcgQualityDrop
        expr: >-
          (
            stream_ndcg:ndcg:mean{ {{- $short -}} }
            < ignoring (window) {{ $a.qualityDropRatio }} * stream_ndcg:ndcg:mean{ {{- $long -}} }
          )
          unless ignoring (window) (stream_ndcg:judged_ratio:mean{ {{- $short -}} } < {{ $a.judgedRatioMin }})
        for: 15m
        labels:
          severity: warning
          {{- with $a.extraLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: "nDCG@{{ $k }} of {{ "{{" }} $labels.pipeline }} over {{ $a.shortWindow }} is {{ "{{" }} $value | humanizePercentage }}, under {{ $a.qualityDropRatio }} of its {{ $a.longWindow }} mean"
          description: "The ranking quality of the last {{ $a.shortWindow }} dropped against the last {{ $a.longWindow }}. Check recent ranking changes and the breakdown by segment."
          runbook_url: {{ include "stream-ndcg.runbook" (dict "root" . "alert" "StreamNdcgQualityDrop") | quote }}
      {{- if $control }}
      {{- $shortIs := printf "%s, %s=%q" $short $seg $control }}
      # The value is how far the variant is behind the control (control - variant).
      - alert: StreamNdcgSegmentBelowAnother
        expr: >-
          -stream_ndcg:ndcg:difference_from_control{ {{- $short -}} }
          and on (pipeline, k, window, {{ $seg }}) (stream_ndcg:ndcg:difference_from_control_high{ {{- $short -}} } < 0)
          and on (pipeline, k, window, {{ $seg }})
          (stream_ndcg:scored_impressions:by_segment{ {{- $short -}} } >= {{ $a.minScoredImpressions }})
          and on (pipeline, k, window)
          (stream_ndcg:scored_impressions:by_segment{ {{- $shortIs -}} } >= {{ $a.minScoredImpressions }})
          unless on (pipeline, k) (stream_ndcg:judged_ratio:mean{ {{- $short -}} } < {{ $a.judgedRatioMin }})
        for: 15m
        labels:
          severity: warning
          {{- with $a.extraLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: "{{ $seg }} {{ "{{" }} $labels.{{ $seg }} }} is {{ "{{" }} $value | printf \"%.3f\" }} nDCG@{{ $k }} behind the control {{ $seg }} {{ $control }}"
          description: "Over the last {{ $a.shortWindow }}, {{ $seg }} {{ "{{" }} $labels.{{ $seg }} }} of {{ "{{" }} $labels.pipeline }} ranks worse than the control {{ $control }}: the always-valid interval of the difference (alpha {{ $alpha }} split among the comparisons with the control, N* {{ $nStar }}) lies below 0."
          runbook_url: {{ include "stream-ndcg.runbook" (dict "root" . "alert" "StreamNdcgSegmentBelowAnother") | quote }}
      {{- end }}
      - alert: StreamNdcgJudgedRatioLow
        expr: stream_ndcg:judged_ratio:mean{ {{- $short -}} } < {{ $a.judgedRatioMin }}
        for: 30m
        labels:
          severity: warning
          {{- with $a.extraLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: "Only {{ "{{" }} $value | humanizePercentage }} of the top-{{ $k }} results of {{ "{{" }} $labels.pipeline }} over {{ $a.shortWindow }} are judged"
          description: "Too few judgments to trust nDCG: the quality alerts are silenced until the judged ratio is back above {{ $a.judgedRatioMin }}."
          runbook_url: {{ include "stream-ndcg.runbook" (dict "root" . "alert" "StreamNdcgJudgedRatioLow") | quote }}
      - alert: StreamNdcgConsumerLagGrowing
        # The value from the raw series, not the recording rule: that one may lag one evaluation behind.
        expr: >-
          sum by ({{ $targets }}, topic) (stream_ndcg_consumer_lag) > {{ $a.lagRecords }}
          and deriv(stream_ndcg:consumer_lag:sum[10m]) > 0
        for: 10m
        labels:
          severity: warning
          {{- with $a.extraLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: "stream-ndcg is {{ "{{" }} $value }} records behind on {{ "{{" }} $labels.topic }}, and falling further behind"
          description: "The consumer group does not keep up with the event rate; the metrics are getting stale."
          runbook_url: {{ include "stream-ndcg.runbook" (dict "root" . "alert" "StreamNdcgConsumerLagGrowing") | quote }}
      - alert: StreamNdcgConsumerLagHigh
        expr: sum by ({{ $targets }}, topic) (stream_ndcg_consumer_lag) > {{ $a.lagHighRecords }}
        for: 15m
        labels:
          severity: critical
          {{- with $a.extraLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: "stream-ndcg is {{ "{{" }} $value }} records behind on {{ "{{" }} $labels.topic }}"
          description: "The metrics describe traffic that is far in the past; a growing backlog also risks the topic's retention deleting unread events."
          runbook_url: {{ include "stream-ndcg.runbook" (dict "root" . "alert" "StreamNdcgConsumerLagHigh") | quote }}
      - alert: StreamNdcgRejectedEvents
        expr: >-
          sum by (pipeline) (stream_ndcg:events_rejected:rate5m)
          / (sum by (pipeline) (stream_ndcg:events:rate5m) + sum by (pipeline) (stream_ndcg:events_rejected:rate5m))
          > 0.01
        for: 10m
        labels:
          severity: warning
          {{- with $a.extraLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: "{{ "{{" }} $value | humanizePercentage }} of the events of {{ "{{" }} $labels.pipeline }} are rejected"
          description: "A producer sends events that break the contract; see stream_ndcg_events_rejected_total by reason."
          runbook_url: {{ include "stream-ndcg.runbook" (dict "root" . "alert" "StreamNdcgRejectedEvents") | quote }}
      - alert: StreamNdcgTrafficStopped
        # Only while the counters are scraped: with every instance down, StreamNdcgDown fires.
        expr: max by (pipeline) (rate(stream_ndcg_events_total{type="impression"}[{{ $a.trafficStoppedFor }}])) == 0
        for: 5m
        labels:
          severity: warning
          {{- with $a.extraLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: "No impressions reached {{ "{{" }} $labels.pipeline }} for {{ $a.trafficStoppedFor }}"
          description: "The service is up but counts no new impression: the producers stopped, or write to another topic."
          runbook_url: {{ include "stream-ndcg.runbook" (dict "root" . "alert" "StreamNdcgTrafficStopped") | quote }}
      - alert: StreamNdcgNotReady
        expr: stream_ndcg_ready == 0
        for: {{ $a.notReadyFor }}
        labels:
          severity: critical
          {{- with $a.extraLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: "{{ "{{" }} $labels.instance }} is not ready for {{ $a.notReadyFor }}"
          description: "The instance is scraped but does not consume and commit: Redis or Kafka is unreachable, or its consumer is stuck. Its partitions make no progress."
          runbook_url: {{ include "stream-ndcg.runbook" (dict "root" . "alert" "StreamNdcgNotReady") | quote }}
      - alert: StreamNdcgBackingOff
        expr: rate(stream_ndcg_backoffs_total[5m]) > 0
        for: {{ $a.backoffFor }}
        labels:
          severity: warning
          {{- with $a.extraLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: "{{ "{{" }} $labels.instance }} keeps backing off ({{ "{{" }} $labels.cause }}) for {{ $a.backoffFor }}"
          description: "A transient fault ({{ "{{" }} $labels.cause }}) does not clear: the instance retries again and again."
          runbook_url: {{ include "stream-ndcg.runbook" (dict "root" . "alert" "StreamNdcgBackingOff") | quote }}
      - alert: StreamNdcgRecordsLost
        expr: increase(stream_ndcg_offsets_skipped_total[1h]) > 0
        labels:
          severity: critical
          {{- with $a.extraLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: "Records of {{ "{{" }} $labels.topic }}:{{ "{{" }} $labels.partition }} were deleted by Kafka before they were read"
          description: "{{ "{{" }} $value | humanize }} offsets were skipped in the last hour: the service was down longer than the topic's retention, or records were deleted. Their events are missing from every window that holds them."
          runbook_url: {{ include "stream-ndcg.runbook" (dict "root" . "alert" "StreamNdcgRecordsLost") | quote }}
      - alert: StreamNdcgScrapeErrors
        expr: rate(stream_ndcg_scrape_errors_total[5m]) > 0
        for: {{ $a.scrapeErrorsFor }}
        labels:
          severity: warning
          {{- with $a.extraLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: "Scrapes of {{ "{{" }} $labels.instance }} cannot read the shared state"
          description: "The quality gauges and event counters are missing from the scrapes: Redis is unreachable or slow from this instance."
          runbook_url: {{ include "stream-ndcg.runbook" (dict "root" . "alert" "StreamNdcgScrapeErrors") | quote }}
      - alert: StreamNdcgDown
        expr: up{ {{- $up -}} } == 0 or absent(up{ {{- $up -}} })
        for: 2m
        labels:
          severity: critical
          {{- with $a.extraLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: "A stream-ndcg instance cannot be scraped"
          description: "{{ "{{" }} $labels.instance }} is down or unreachable (or no target is found): its partitions move to the other instances, but with none left the metrics stop."
          runbook_url: {{ include "stream-ndcg.runbook" (dict "root" . "alert" "StreamNdcgDown") | quote }}
{{- end }}

{{/*
Tracing on a cluster: the chart's `tracing` values are shorthands for platform.tracing
(serving.config.tracing.TracingConfig), each filling its key in the args of every app that reads
the tracing section (serving.k8s.tracing_values.TRACING_KEYS: the same map, which a test compares).
*/}}
{{- define "llm-serving.tracingKeys" -}}
{"otlpEndpoint": "otlp_endpoint", "protocol": "protocol", "sampleRatio": "sample_ratio", "serviceName": "service_name"}
{{- end -}}

{{/* The platform.tracing keys the chart's tracing values set (an empty or null value sets none). */}}
{{- define "llm-serving.chartTracing" -}}
{{- $set := dict -}}
{{- range $value, $key := include "llm-serving.tracingKeys" . | fromJson -}}
{{- $v := get ($.Values.tracing | default dict) $value -}}
{{- if not (or (kindIs "invalid" $v) (eq (toString $v) "")) -}}
{{- $_ := set $set $key $v -}}
{{- end -}}
{{- end -}}
{{- toYaml $set -}}
{{- end -}}

{{/* The platform every app's args come from: the values' (with the store's URL and the tenants'
key variables), and tracing.*. */}}
{{- define "llm-serving.servedPlatform" -}}
{{- $platform := include "llm-serving.platformWithState" . | fromYaml -}}
{{- $platform = include "llm-serving.platformWithTenantKeys" (dict "root" . "platform" $platform) | fromYaml -}}
{{- $chart := include "llm-serving.chartTracing" . | fromYaml -}}
{{- if $chart -}}
{{- $_ := set $platform "tracing" (merge $chart (get $platform "tracing" | default dict)) -}}
{{- end -}}
{{- toYaml $platform -}}
{{- end -}}

{{/* Where the spans go, whichever value set it; empty: tracing off. */}}
{{- define "llm-serving.otlpEndpoint" -}}
{{- dig "tracing" "otlp_endpoint" "" (include "llm-serving.servedPlatform" . | fromYaml) | default "" -}}
{{- end -}}

{{/*
A key set both as tracing.* and under platform.tracing is refused: neither would silently win.
The endpoint must be an http(s) URL, as TracingConfig requires (else every replica fails at start).
*/}}
{{- define "llm-serving.validate.tracing" -}}
{{- $problems := list -}}
{{- $chart := include "llm-serving.chartTracing" . | fromYaml -}}
{{- $platform := dig "tracing" dict .Values.platform | default dict -}}
{{- range $value, $key := include "llm-serving.tracingKeys" . | fromJson -}}
{{- if and (hasKey $chart $key) (hasKey $platform $key) (not (kindIs "invalid" (index $platform $key))) -}}
{{- $problems = append $problems (printf "tracing.%s and platform.tracing.%s are both set. Set one of them: tracing.%s fills platform.tracing.%s." $value $key $value $key) -}}
{{- end -}}
{{- end -}}
{{- with include "llm-serving.otlpEndpoint" . -}}
{{- if not (or (hasPrefix "http://" .) (hasPrefix "https://" .)) -}}
{{- $problems = append $problems (printf "tracing.otlpEndpoint (or platform.tracing.otlp_endpoint): %q is not an http(s) URL. Give the collector's URL, e.g. http://otel-collector.observability:4318/v1/traces (http/protobuf) or http://otel-collector.observability:4317 (grpc)." .) -}}
{{- end -}}
{{- end -}}
{{- join "\n- " $problems -}}
{{- end -}}

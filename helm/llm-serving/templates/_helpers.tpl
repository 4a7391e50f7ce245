{{/* Names and labels. */}}

{{- define "llm-serving.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Kept short: KubeRay derives pod and service names from the RayService name. */}}
{{- define "llm-serving.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "llm-serving.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "llm-serving.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels on Ray pods. Not app.kubernetes.io/name: KubeRay sets that one on its pods. */}}
{{- define "llm-serving.rayPodSelector" -}}
app.kubernetes.io/part-of: {{ include "llm-serving.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "llm-serving.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* Platform settings the templates read; defaults mirror PlatformConfig (a test compares them). */}}
{{- define "llm-serving.httpPort" -}}
{{- dig "http" "port" 8000 .Values.platform | int -}}
{{- end -}}

{{- define "llm-serving.modelRef" -}}
{{- dig "model" "ref" "default" .Values.platform -}}
{{- end -}}

{{- define "llm-serving.servedModelName" -}}
{{- dig "model" "served_name" "" .Values.platform | default (include "llm-serving.modelRef" .) -}}
{{- end -}}

{{/* App name -> [import path, default route prefix]: serving.app.build_apps in template form. */}}
{{- define "llm-serving.appTable" -}}
vllm: [serving.app:vllm_app, /]
hf: [serving.app:hf_app, /hf]
analysis: [serving.app:analysis_app, /analysis]
{{- end -}}

{{/* Enabled apps in build_apps order, as ServeApplicationSchema dicts with the platform as args. */}}
{{- define "llm-serving.serveApplications" -}}
{{- $table := include "llm-serving.appTable" . | fromYaml -}}
{{- $apps := list -}}
{{- range $name := list "vllm" "hf" "analysis" -}}
{{- $app := get $.Values.platform $name | default dict -}}
{{- if dig "enabled" true $app -}}
{{- $row := get $table $name -}}
{{- $apps = append $apps (dict "name" $name "import_path" (index $row 0) "route_prefix" (dig "route_prefix" (index $row 1) $app) "args" $.Values.platform) -}}
{{- end -}}
{{- end -}}
{{- toYaml $apps -}}
{{- end -}}

{{/* serveConfigV2: the same document serving.k8s.serve_config_v2() builds. */}}
{{- define "llm-serving.serveConfigV2" -}}
proxy_location: EveryNode
http_options:
  host: 0.0.0.0
  port: {{ include "llm-serving.httpPort" . }}
applications:
{{- range $app := include "llm-serving.serveApplications" . | fromYamlArray }}
  - name: {{ $app.name }}
    import_path: {{ $app.import_path }}
    route_prefix: {{ $app.route_prefix | quote }}
    args: {{- toYaml $app.args | nindent 6 }}
{{- end }}
{{- end -}}

{{/* serving.config.ray_env(): Serve's metric push intervals follow the fastest autoscaled app. */}}
{{- define "llm-serving.rayEnv" -}}
{{- $intervals := list -}}
{{- range $name := list "vllm" "hf" -}}
{{- $scaling := dig $name "autoscaling" nil $.Values.platform -}}
{{- if $scaling -}}
{{- $intervals = append $intervals (dig "metrics_interval_s" 1.0 $scaling | float64) -}}
{{- end -}}
{{- end -}}
{{- $push := 1.0 -}}
{{- range $i, $v := $intervals -}}
{{- if or (eq $i 0) (lt $v $push) -}}{{- $push = $v -}}{{- end -}}
{{- end -}}
- name: RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S
  value: {{ include "llm-serving.pyFloat" $push | quote }}
- name: RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S
  value: {{ include "llm-serving.pyFloat" $push | quote }}
- name: RAY_metrics_report_interval_ms
  value: "2000"
- name: RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper
  value: "true"
{{- end -}}

{{/* A float as Python's str() prints it (1 -> "1.0"), so the env equals ray_env()'s. */}}
{{- define "llm-serving.pyFloat" -}}
{{- $s := toString . -}}
{{- if contains "." $s -}}{{ $s }}{{- else -}}{{ printf "%s.0" $s }}{{- end -}}
{{- end -}}

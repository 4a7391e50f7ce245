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

{{/* The name clients pass as `model` (with platform.models: the first model's). */}}
{{- define "llm-serving.servedModelName" -}}
{{- with .Values.platform.models -}}
{{- (first .).name -}}
{{- else -}}
{{- dig "model" "served_name" "" .Values.platform | default (include "llm-serving.modelRef" .) -}}
{{- end -}}
{{- end -}}

{{/* serving.k8s.serve_config.vllm_deployments: the settings of each vLLM deployment (one per model). */}}
{{- define "llm-serving.vllmDeployments" -}}
{{- $vllm := .Values.platform.vllm | default dict -}}
{{- if not (dig "enabled" true $vllm) -}}
[]
{{- else if .Values.platform.models -}}
{{- toYaml .Values.platform.models -}}
{{- else -}}
{{- toYaml (list $vllm) -}}
{{- end -}}
{{- end -}}

{{/* serving.k8s.serve_config.served_model_refs: every model reference an enabled app serves, once each. */}}
{{- define "llm-serving.servedModelRefs" -}}
{{- $platform := .Values.platform -}}
{{- $byModels := and $platform.models (dig "vllm" "enabled" true $platform) -}}
{{- $refs := list -}}
{{- $others := false -}}
{{- range $name := without (include "llm-serving.appNames" . | fromJsonArray) "vllm" -}}
{{- $others = or $others (dig $name "enabled" true $platform) -}}
{{- end -}}
{{- if or (not $byModels) $others -}}
{{- $refs = append $refs (include "llm-serving.modelRef" .) -}}
{{- end -}}
{{- if $byModels -}}
{{- range $platform.models -}}
{{- $refs = append $refs (dig "model" "ref" "default" .) -}}
{{- end -}}
{{- end -}}
{{- toYaml (uniq $refs) -}}
{{- end -}}

{{/* Settings without the deployment options Serve applies in place (serving.k8s.serve_config.NOT_IN_ARGS)
and without the keys in .also. */}}
{{- define "llm-serving.withoutServeOptions" -}}
{{- $section := deepCopy (.section | default dict) -}}
{{- range $key := concat (include "llm-serving.notInArgs" . | fromJsonArray) (.also | default list) -}}
{{- $_ := unset $section $key -}}
{{- end -}}
{{- toYaml $section -}}
{{- end -}}

{{/*
Each app's args: only the sections it reads (serving.k8s.serve_config.app_args), without the deployment
options Serve applies in place. Serve hashes args into the app's code version, so a change
here restarts the app's replicas; anything else leaves them running.
*/}}
{{- define "llm-serving.appArgs" -}}
{{- $name := .name -}}
{{- $args := dict -}}
{{- $row := get (include "llm-serving.appTable" . | fromJson) $name -}}
{{- range $key := $row.sections -}}
{{- if hasKey $.platform $key -}}
{{- $section := get $.platform $key -}}
{{- if eq $key $name -}}
{{- $section = include "llm-serving.withoutServeOptions" (dict "section" $section) | fromYaml -}}
{{- end -}}
{{- if or $section (ne $key $name) -}}
{{- $_ := set $args $key $section -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $args -}}
{{- end -}}

{{/* Serve's options of an app's deployment (serving.k8s.serve_config.deployment_options), applied in place. */}}
{{- define "llm-serving.deploymentOptions" -}}
{{- $d := include "llm-serving.servingDefaults" . | fromJson -}}
{{- $app := .app -}}
{{- $own := get $d .name -}}
{{- $row := get (include "llm-serving.appTable" . | fromJson) .name -}}
{{- $opts := dict "name" $row.deployment "max_ongoing_requests" (dig "max_ongoing_requests" $own.max_ongoing_requests $app) -}}
{{- if $row.scaled -}}
{{- $r := $d.replica -}}
{{- /* Unset: the drain deadline, so a stopping replica finishes every request within its limit. */ -}}
{{- $grace := dig "graceful_shutdown_timeout_s" nil $app -}}
{{- if kindIs "invalid" $grace -}}{{- $grace = .drain | int -}}{{- end -}}
{{- $_ := set $opts "graceful_shutdown_timeout_s" $grace -}}
{{- $_ = set $opts "graceful_shutdown_wait_loop_s" (dig "graceful_shutdown_wait_loop_s" $r.graceful_shutdown_wait_loop_s $app) -}}
{{- $_ = set $opts "max_surge_percent" (dig "max_surge_percent" $r.max_surge_percent $app) -}}
{{- with dig "autoscaling" nil $app -}}
{{- $a := $d.autoscaling -}}
{{- $min := dig "min_replicas" $a.min_replicas . -}}
{{- $scaling := dict "min_replicas" $min "max_replicas" (dig "max_replicas" $a.max_replicas .) "target_ongoing_requests" (dig "target_queue_depth" $a.target_queue_depth .) "upscale_delay_s" (dig "upscale_delay_s" $a.upscale_delay_s .) "downscale_delay_s" (dig "downscale_delay_s" $a.downscale_delay_s .) "look_back_period_s" (dig "look_back_period_s" $a.look_back_period_s .) "metrics_interval_s" (dig "metrics_interval_s" $a.metrics_interval_s .) -}}
{{- /* AutoscalingSettings.start_replicas: Serve resets a deployment to initial_replicas on every change of its options, so only when set, or 1 to start a scale-to-zero deployment. */ -}}
{{- $initial := dig "initial_replicas" nil . -}}
{{- if kindIs "invalid" $initial -}}{{- if eq (int $min) 0 -}}{{- $initial = 1 -}}{{- end -}}{{- end -}}
{{- if not (kindIs "invalid" $initial) -}}{{- $_ = set $scaling "initial_replicas" $initial -}}{{- end -}}
{{- $toZero := dig "downscale_to_zero_delay_s" nil . -}}
{{- if not (kindIs "invalid" $toZero) -}}{{- $_ = set $scaling "downscale_to_zero_delay_s" $toZero -}}{{- end -}}
{{- $_ = set $opts "autoscaling_config" $scaling -}}
{{- else -}}
{{- $_ = set $opts "num_replicas" (dig "num_replicas" $r.num_replicas $app) -}}
{{- end -}}
{{- $_ = set $opts "max_queued_requests" (dig "backpressure" "max_queued_requests" $own.max_queued_requests $app) -}}
{{- $_ = set $opts "backpressure_config" (dict "status_code" (dig "backpressure" "status_code" $r.status_code $app) "retry_after_s" (dig "backpressure" "retry_after_s" $r.retry_after_s $app)) -}}
{{- end -}}
{{- toYaml $opts -}}
{{- end -}}

{{/* Enabled apps in build_apps order, as ServeApplicationSchema dicts. */}}
{{- define "llm-serving.serveApplications" -}}
{{- $table := include "llm-serving.appTable" . | fromJson -}}
{{- $platform := include "llm-serving.servedPlatform" . | fromYaml -}}
{{- $apps := list -}}
{{- range $name := include "llm-serving.appNames" . | fromJsonArray -}}
{{- $app := get $.Values.platform $name | default dict -}}
{{- if and (eq $name "vllm") $.Values.platform.models (dig "enabled" true $app) -}}
{{- $apps = concat $apps (include "llm-serving.modelApplications" $ | fromYamlArray) -}}
{{- else if dig "enabled" true $app -}}
{{- $row := get $table $name -}}
{{- $args := include "llm-serving.appArgs" (dict "platform" $platform "name" $name) | fromYaml -}}
{{- if $row.resources -}}
{{- $args = include "llm-serving.pinnedArgs" (dict "args" $args "name" $name "section" $app) | fromYaml -}}
{{- end -}}
{{- $options := include "llm-serving.deploymentOptions" (dict "name" $name "app" $app "drain" (include "llm-serving.drainDeadlineSeconds" $)) | fromYaml -}}
{{- $apps = append $apps (dict "name" $name "import_path" $row.import_path "route_prefix" (dig "route_prefix" $row.route_prefix $app) "args" $args "deployments" (list $options)) -}}
{{- end -}}
{{- end -}}
{{- toYaml $apps -}}
{{- end -}}

{{/*
A multi-model platform's apps (serving.k8s.serve_config.model_applications): the router at vllm.route_prefix
with the models as written, then one app per model without a route of its own; its args are the
single-model platform of the entry (PlatformConfig.model_platform: served_name is the entry's
name), so a change to one model restarts that model alone.
*/}}
{{- define "llm-serving.modelApplications" -}}
{{- $platform := include "llm-serving.servedPlatform" . | fromYaml -}}
{{- $table := include "llm-serving.appTable" . | fromJson -}}
{{- $routers := include "llm-serving.routerConfigs" . | fromJson -}}
{{- $shared := dict -}}
{{- range $key := list "auth" "limits" "state" "tracing" -}}
{{- if hasKey $platform $key -}}{{- $_ := set $shared $key (get $platform $key) -}}{{- end -}}
{{- end -}}
{{- /* What the router reads of each model (serve_config.ROUTER_MODEL_KEYS): other changes leave it running. */ -}}
{{- $routed := list -}}
{{- range $entry := $platform.models -}}
{{- $routed = append $routed (pick $entry "name" "adapters" "runtime_adapters" "adapter_roots" "adapter_hub_ids" "backpressure") -}}
{{- end -}}
{{- $router := dict "name" "vllm" "import_path" $table.router.import_path "route_prefix" (dig "vllm" "route_prefix" $table.router.route_prefix $platform) "args" (merge (dict "models" $routed) $shared) "deployments" (include "llm-serving.routerDeployments" . | fromYamlArray) -}}
{{- $apps := list $router -}}
{{- range $entry := $platform.models -}}
{{- $model := deepCopy ($entry.model | default dict) -}}
{{- $_ := set $model "served_name" $entry.name -}}
{{- $args := merge (dict "model" $model) $shared -}}
{{- $vllm := include "llm-serving.withoutServeOptions" (dict "section" $entry "also" (list "name" "model")) | fromYaml -}}
{{- $vllm = get (include "llm-serving.pinnedArgs" (dict "args" (dict "vllm" $vllm) "name" "vllm" "section" $entry) | fromYaml) "vllm" -}}
{{- if $vllm -}}{{- $_ = set $args "vllm" $vllm -}}{{- end -}}
{{- $options := include "llm-serving.deploymentOptions" (dict "name" "vllm" "app" $entry "drain" (include "llm-serving.drainDeadlineSeconds" $)) | fromYaml -}}
{{- $router := get $routers ($entry.routing | default "power_of_two") -}}
{{- if $router -}}
{{- $_ = set $options "request_router_config" $router -}}
{{- end -}}
{{- $apps = append $apps (dict "name" (printf "vllm-%s" $entry.name) "import_path" $table.model.import_path "route_prefix" nil "args" $args "deployments" (list $options)) -}}
{{- end -}}
{{- toYaml $apps -}}
{{- end -}}

{{/* serveConfigV2: the same document serving.k8s.serve_config.serve_config_v2() builds. */}}
{{- define "llm-serving.serveConfigV2" -}}
proxy_location: EveryNode
http_options:
  host: 0.0.0.0
  port: {{ include "llm-serving.httpPort" . }}
applications:
{{- range $app := include "llm-serving.serveApplications" . | fromYamlArray }}
  - name: {{ $app.name }}
    import_path: {{ $app.import_path }}
    route_prefix: {{ if kindIs "invalid" $app.route_prefix }}null{{ else }}{{ $app.route_prefix | quote }}{{ end }}
    args: {{- toYaml $app.args | nindent 6 }}
    {{- with $app.deployments }}
    deployments: {{- toYaml . | nindent 6 }}
    {{- end }}
{{- end }}
{{- end -}}

{{/*
serving.config.ray_env.drain_deadline_s(): the longest an accepted request may still need,
limits.request_timeout_s rounded up (an hour when it is null: no limit) + a margin. HAProxy's hard
stop after a reload and KubeRay's deletion delay of an old cluster wait this long.
*/}}
{{- define "llm-serving.drainDeadlineSeconds" -}}
{{- $defaults := include "llm-serving.servingDefaults" . | fromJson -}}
{{- $limits := dig "limits" dict .Values.platform -}}
{{- $timeout := $defaults.limits.request_timeout_s -}}
{{- if hasKey $limits "request_timeout_s" -}}{{- $timeout = $limits.request_timeout_s -}}{{- end -}}
{{- if kindIs "invalid" $timeout -}}{{- $timeout = $defaults.drain.unlimited_request_s -}}{{- end -}}
{{- add ($timeout | float64 | ceil | int) $defaults.drain.margin_s -}}
{{- end -}}

{{/* serving.config.ray_env.ray_env(): the ingress and how long its replicas drain, and Serve's metric
push intervals follow the fastest autoscaled app or model. */}}
{{- define "llm-serving.rayEnv" -}}
{{- $defaults := include "llm-serving.servingDefaults" . | fromJson -}}
{{- if eq (dig "http" "ingress" "haproxy" .Values.platform) "haproxy" -}}
- name: RAY_SERVE_ENABLE_HA_PROXY
  value: "1"
- name: RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S
  value: {{ dig "http" "replica_drain_s" $defaults.http.replica_drain_s .Values.platform | float64 | toString | quote }}
- name: RAY_SERVE_HAPROXY_HARD_STOP_AFTER_S
  value: {{ dig "http" "haproxy_hard_stop_s" nil .Values.platform | default (include "llm-serving.drainDeadlineSeconds" .) | int | toString | quote }}
{{ end -}}
{{- $platform := .Values.platform -}}
{{- $default := $defaults.autoscaling.metrics_interval_s -}}
{{- $deployments := list -}}
{{- range $name, $row := include "llm-serving.appTable" . | fromJson -}}
{{- if $row.scaled -}}{{- $deployments = append $deployments (dig $name dict $platform) -}}{{- end -}}
{{- end -}}
{{- $intervals := list -}}
{{- range $settings := concat $deployments ($platform.models | default list) -}}
{{- $scaling := dig "autoscaling" nil $settings -}}
{{- if $scaling -}}
{{- $intervals = append $intervals (dig "metrics_interval_s" $default $scaling | float64) -}}
{{- end -}}
{{- end -}}
{{- $push := $default | float64 -}}
{{- range $i, $v := $intervals -}}
{{- if or (eq $i 0) (lt $v $push) -}}{{- $push = $v -}}{{- end -}}
{{- end -}}
- name: RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S
  value: {{ $push | toString | quote }}
- name: RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S
  value: {{ $push | toString | quote }}
{{- range $name, $value := include "llm-serving.rayStaticEnv" . | fromJson }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end -}}

{{/*
Fewest pods of a worker group (.key gpu or cpu): workers.<key>.minReplicas; for the GPU group
unset (null), 0 when every GPU app may scale to zero (min_replicas 0), else 1
(serving.k8s.gpu_workers.gpu_worker_min). At 0 KubeRay's autoscaler removes the last idle GPU worker
once Serve has stopped its replicas, and adds one when Serve starts a replica again.
*/}}
{{- define "llm-serving.workerMinReplicas" -}}
{{- $min := (get .root.Values.workers .key).minReplicas -}}
{{- if not (kindIs "invalid" $min) -}}{{- int $min -}}
{{- else if eq .key "gpu" -}}{{- ternary 1 0 (gt (include "llm-serving.gpuReplicas" (dict "root" .root "bound" "fewest") | int) 0) -}}
{{- else -}}1
{{- end -}}
{{- end -}}

{{/*
KubeRay leaves worker replicas/minReplicas/maxReplicas/tolerations out of its cluster hash, so a
change of them alone would be ignored on upgrade. Their hash on the head pod template makes it a
cluster change: with upgradeStrategy NewCluster KubeRay starts a RayCluster with the new bounds
and switches traffic once it serves.
*/}}
{{- define "llm-serving.workerScalingHash" -}}
{{- $groups := list -}}
{{- range $key := list "gpu" "cpu" -}}
{{- $g := get $.Values.workers $key -}}
{{- if $g.enabled -}}
{{- $min := include "llm-serving.workerMinReplicas" (dict "root" $ "key" $key) | int -}}
{{- $groups = append $groups (dict "group" $g.groupName "replicas" $g.replicas "min" $min "max" $g.maxReplicas "tolerations" $g.tolerations) -}}
{{- end -}}
{{- end -}}
{{- toJson $groups | sha256sum | trunc 16 -}}
{{- end -}}

{{/*
GPU workers advertise only the logical CPUs their vLLM replicas reserve (num_cpus x GPUs), so
CPU-only replicas (HF baseline, analysis: a CPU copy of the model each) never land beside vLLM.
Per replica: serving.k8s.serve_config.gpu_replica_cpus, the largest num_cpus of the vLLM deployments on GPUs
(of every vLLM deployment when none is).
*/}}
{{- define "llm-serving.gpuRayStartParams" -}}
{{- $g := .Values.workers.gpu -}}
{{- $params := deepCopy ($g.rayStartParams | default dict) -}}
{{- if not (hasKey $params "num-cpus") -}}
{{- $deployments := include "llm-serving.vllmDeployments" . | fromYamlArray | default (list (dig "vllm" dict .Values.platform)) -}}
{{- $onGpu := list -}}
{{- range $deployments -}}
{{- if eq (dig "resources" "accelerator" "cpu" .) "gpu" -}}{{- $onGpu = append $onGpu . -}}{{- end -}}
{{- end -}}
{{- $perReplica := 0.0 -}}
{{- range ($onGpu | default $deployments) -}}
{{- $perReplica = maxf $perReplica (dig "resources" "num_cpus" 1.0 . | float64) -}}
{{- end -}}
{{- $_ := set $params "num-cpus" (mulf $perReplica (int $g.gpusPerWorker) | ceil | int | toString) -}}
{{- end -}}
{{- toYaml $params -}}
{{- end -}}

{{/*
Values validation (Bitnami style): every check adds its message; the install fails once with all
of them. values.schema.json already rejects wrong types, unknown keys and out-of-range numbers.
*/}}

{{- define "llm-serving.validateValues" -}}
{{- $messages := list -}}
{{- $messages = append $messages (include "llm-serving.validate.model" .) -}}
{{- $messages = append $messages (include "llm-serving.validate.platformRules" .) -}}
{{- $messages = append $messages (include "llm-serving.validate.gpuGroup" .) -}}
{{- $messages = append $messages (include "llm-serving.validate.someWorkers" .) -}}
{{- $messages = append $messages (include "llm-serving.validate.cpuGroup" .) -}}
{{- $messages = append $messages (include "llm-serving.validate.modelCache" .) -}}
{{- range $key := list "gpu" "cpu" -}}
{{- $messages = append $messages (include "llm-serving.validate.groupBounds" (dict "key" $key "root" $)) -}}
{{- end -}}
{{- $messages = append $messages (include "llm-serving.validate.gpuCapacity" .) -}}
{{- $messages = append $messages (include "llm-serving.validate.sleepMode" .) -}}
{{- $messages = append $messages (include "llm-serving.validate.kuberay" .) -}}
{{- $messages = append $messages (include "llm-serving.validate.inlineKeys" .) -}}
{{- $messages = append $messages (include "llm-serving.validate.tenantKeys" .) -}}
{{- $messages = append $messages (include "llm-serving.validate.state" .) -}}
{{- $messages = append $messages (include "llm-serving.validate.tracing" .) -}}
{{- $rayVersion := .Values.ray.version | default (include "llm-serving.rayVersion" .) -}}
{{- if and (eq .Values.ray.auth.mode "token") (semverCompare "<2.52.0" $rayVersion) -}}
{{- $messages = append $messages (printf "ray.auth.mode: token needs Ray >= 2.52.0 in the image, but ray.version is %s (KubeRay would refuse the RayService). Use an image with a newer Ray, or set ray.auth.mode=disabled." $rayVersion) -}}
{{- end -}}
{{- $messages = append $messages (include "llm-serving.validate.incrementalUpgrade" .) -}}
{{- if and .Values.ray.gcsFaultTolerance.enabled (not .Values.ray.gcsFaultTolerance.redisAddress) -}}
{{- $messages = append $messages "ray.gcsFaultTolerance: enabled without a redisAddress. Set ray.gcsFaultTolerance.redisAddress (e.g. redis://redis:6379)." -}}
{{- end -}}
{{- $messages = without $messages "" -}}
{{- if $messages -}}
{{- printf "\n\nVALUES VALIDATION:\n- %s" (join "\n- " $messages) | fail -}}
{{- end -}}
{{- end -}}

{{- define "llm-serving.validate.model" -}}
{{- if not (trim (include "llm-serving.modelRef" .)) -}}
platform.model.ref: no model is set. Set a Hugging Face id (e.g. Qwen/Qwen2.5-0.5B), or `default` / `tiny-qwen2` (built inside the pod).
{{- end -}}
{{- end -}}

{{/* PlatformConfig's cross-field rules, which its JSON schema cannot express. */}}
{{- define "llm-serving.validate.platformRules" -}}
{{- $problems := list -}}
{{- $seen := dict -}}
{{- $table := include "llm-serving.appTable" . | fromJson -}}
{{- range $name := include "llm-serving.appNames" . | fromJsonArray -}}
{{- $app := get $.Values.platform $name | default dict -}}
{{- $prefix := dig "route_prefix" (get $table $name).route_prefix $app -}}
{{- if not (hasPrefix "/" $prefix) -}}
{{- $problems = append $problems (printf "platform.%s.route_prefix: %q must start with '/'." $name $prefix) -}}
{{- else if hasKey $seen $prefix -}}
{{- $problems = append $problems (printf "platform.%s.route_prefix: %q is already the prefix of %s; route prefixes must differ." $name $prefix (get $seen $prefix)) -}}
{{- end -}}
{{- $_ := set $seen $prefix $name -}}
{{- with dig "autoscaling" nil $app -}}
{{- $min := dig "min_replicas" 1 . | int -}}{{- $max := dig "max_replicas" 1 . | int -}}
{{- if gt $min $max -}}
{{- $problems = append $problems (printf "platform.%s.autoscaling: min_replicas (%d) must not exceed max_replicas (%d)." $name $min $max) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with include "llm-serving.validate.models" . -}}
{{- $problems = append $problems . -}}
{{- end -}}
{{- join "\n- " $problems -}}
{{- end -}}

{{/*
PlatformConfig's rules on `models`: each model sets its own replica settings (the chart's
single-model platform.vllm defaults must be nulled), names of models and adapters differ, and
autoscaling bounds hold. A platform.vllm setting counts as set unless it is null, an empty map or
list, or a default listed here (VLLMReplicaSettings'; a test compares them): stricter than
PlatformConfig, which compares whole settings with their defaults.
*/}}
{{- define "llm-serving.modelSettingDefaults" -}}
num_replicas: 1
max_ongoing_requests: 256
graceful_shutdown_wait_loop_s: 1.0
max_surge_percent: 25
max_adapters: 4
routing: power_of_two
{{- end -}}

{{- define "llm-serving.validate.models" -}}
{{- $problems := list -}}
{{- if .Values.platform.models -}}
{{- $vllm := .Values.platform.vllm | default dict -}}
{{- $defaults := include "llm-serving.modelSettingDefaults" . | fromYaml -}}
{{- range $key, $value := omit $vllm "enabled" "route_prefix" -}}
{{- $default := and (hasKey $defaults $key) (eq (toJson $value) (toJson (get $defaults $key))) -}}
{{- $empty := and (or (kindIs "map" $value) (kindIs "slice" $value)) (empty $value) (ne $key "autoscaling") -}}
{{- if not (or (kindIs "invalid" $value) $default $empty) -}}
{{- $problems = append $problems (printf "platform.vllm.%s: with platform.models each model sets its own; set platform.vllm.%s to null (the chart's default serves one model)." $key $key) -}}
{{- end -}}
{{- end -}}
{{- $seen := dict -}}
{{- range $i, $entry := .Values.platform.models -}}
{{- $names := list $entry.name -}}
{{- range $entry.adapters -}}{{- $names = append $names .name -}}{{- end -}}
{{- range $name := $names -}}
{{- if hasKey $seen $name -}}
{{- $problems = append $problems (printf "platform.models[%d] (%s): the name %q is already taken by %s; model and adapter names must differ." $i $entry.name $name (get $seen $name)) -}}
{{- end -}}
{{- $_ := set $seen $name (printf "models[%d]" $i) -}}
{{- end -}}
{{- with $entry.autoscaling -}}
{{- $min := dig "min_replicas" 1 . | int -}}{{- $max := dig "max_replicas" 1 . | int -}}
{{- if gt $min $max -}}
{{- $problems = append $problems (printf "platform.models[%d].autoscaling: min_replicas (%d) must not exceed max_replicas (%d)." $i $min $max) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- join "\n- " $problems -}}
{{- end -}}

{{- define "llm-serving.validate.gpuGroup" -}}
{{- $gpu := .Values.workers.gpu -}}
{{- if and $gpu.enabled (lt (int $gpu.gpusPerWorker) 1) -}}
workers.gpu.gpusPerWorker: is {{ int $gpu.gpusPerWorker }}, must be at least 1 (each vLLM replica needs one nvidia.com/gpu). For a CPU-only cluster set workers.gpu.enabled=false and workers.cpu.enabled=true.
{{- end -}}
{{- end -}}

{{- define "llm-serving.validate.someWorkers" -}}
{{- if not (or .Values.workers.gpu.enabled .Values.workers.cpu.enabled) -}}
workers: no worker group is enabled, and the head runs no Serve replicas. Enable workers.gpu or workers.cpu.
{{- end -}}
{{- end -}}

{{- define "llm-serving.validate.groupBounds" -}}
{{- $g := get .root.Values.workers .key -}}
{{- if $g.enabled -}}
{{- $min := include "llm-serving.workerMinReplicas" . | int -}}{{- $max := int $g.maxReplicas -}}{{- $n := int $g.replicas -}}
{{- if or (lt $min 0) (lt $n 0) (lt $max 1) -}}
workers.{{ .key }}: replicas ({{ $n }}) and minReplicas ({{ $min }}) must not be negative, maxReplicas ({{ $max }}) must be at least 1.
{{- else if or (gt $min $n) (gt $n $max) -}}
workers.{{ .key }}: need minReplicas <= replicas <= maxReplicas, got {{ $min }} <= {{ $n }} <= {{ $max }}.
{{- else if and (eq $n 0) (not .root.Values.autoscaler.enabled) -}}
workers.{{ .key }}: replicas 0 with autoscaler.enabled=false: nothing would ever start a worker of this group (KubeRay keeps `replicas` pods without its autoscaler). Set autoscaler.enabled=true, so workers scale from zero when a replica needs one, or replicas >= 1.
{{- end -}}
{{- end -}}
{{- end -}}

{{/* GPU replicas of every app with accelerator gpu, each model of platform.models counted on its
own (serving.k8s.gpu_workers.gpu_replicas): at most (.bound "most") or at the fewest ("fewest":
min_replicas, 0 for an app that may scale to zero; num_replicas of an app without autoscaling). */}}
{{- define "llm-serving.gpuReplicas" -}}
{{- $total := 0 -}}
{{- $apps := include "llm-serving.vllmDeployments" .root | fromYamlArray -}}
{{- range $name := without (include "llm-serving.appNames" .root | fromJsonArray) "vllm" -}}
{{- $app := get $.root.Values.platform $name | default dict -}}
{{- if dig "enabled" true $app -}}{{- $apps = append $apps $app -}}{{- end -}}
{{- end -}}
{{- $key := ternary "max_replicas" "min_replicas" (eq .bound "most") -}}
{{- range $app := $apps -}}
{{- if eq (dig "resources" "accelerator" "cpu" $app) "gpu" -}}
{{- $replicas := dig "num_replicas" 1 $app -}}
{{- with dig "autoscaling" nil $app -}}{{- $replicas = dig $key 1 . -}}{{- end -}}
{{- $total = add $total (int $replicas) -}}
{{- end -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/* GPUs the Serve apps may ask for at most (operators: serving.k8s.gpu_workers.gpu_demand). */}}
{{- define "llm-serving.gpuDemand" -}}
{{- include "llm-serving.gpuReplicas" (dict "root" . "bound" "most") -}}
{{- end -}}

{{/* VLLMEngineConfig's sleep rules (serving/config/replica.py): vLLM sleeps on a GPU only, and
only with its engine core in a process of its own. */}}
{{- define "llm-serving.validate.sleepMode" -}}
{{- $problems := list -}}
{{- range $d := include "llm-serving.vllmDeployments" . | fromYamlArray -}}
{{- $where := ternary (printf "platform.models (%s)" (dig "name" "" $d)) "platform.vllm" (hasKey $d "name") -}}
{{- if not (kindIs "invalid" (dig "engine" "sleep_when_idle_s" nil $d)) -}}
{{- if ne (dig "resources" "accelerator" "cpu" $d) "gpu" -}}
{{- $problems = append $problems (printf "%s.engine.sleep_when_idle_s: vLLM's sleep mode needs a GPU (CUDA or ROCm), but resources.accelerator is cpu; unset sleep_when_idle_s, or run on a GPU." $where) -}}
{{- else if eq (dig "engine" "engine_core" "process" $d) "inprocess" -}}
{{- $problems = append $problems (printf "%s.engine.sleep_when_idle_s needs engine_core: process (the in-process engine core has no sleep mode)." $where) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- join "\n- " $problems -}}
{{- end -}}

{{- define "llm-serving.validate.gpuCapacity" -}}
{{- $demand := include "llm-serving.gpuDemand" . | int -}}
{{- $gpu := .Values.workers.gpu -}}
{{- if and (gt $demand 0) (not $gpu.enabled) -}}
platform: apps with resources.accelerator=gpu need {{ $demand }} GPU(s), but workers.gpu.enabled=false. Enable the GPU group or set accelerator to cpu.
{{- else if and $gpu.enabled (ge (int $gpu.gpusPerWorker) 1) -}}
{{- $capacity := mul (int $gpu.maxReplicas) (int $gpu.gpusPerWorker) -}}
{{- if gt $demand $capacity -}}
platform: Serve may run {{ $demand }} GPU replica(s) (max_replicas / num_replicas of apps and models with accelerator=gpu), but workers.gpu.maxReplicas x gpusPerWorker = {{ $capacity }}: raise workers.gpu.maxReplicas or lower the replicas.
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
KubeRay prerequisite. Only a cluster can answer: the lookup is empty when rendering offline
(`helm template`, lint), so the check runs on install/upgrade only. kube-root-ca.crt exists in
every namespace; the release namespace does not yet under --create-namespace, so `default`
answers then (whoever may create namespaces may read it). The API itself comes from discovery
(.Capabilities), which every user may read; a lookup of the CRD object would need a cluster-wide
grant on CRDs that namespace-scoped installers lack, and Helm fails the render on Forbidden.
*/}}
{{- define "llm-serving.validate.kuberay" -}}
{{- if .Values.kuberay.checkOperator -}}
{{- $live := lookup "v1" "ConfigMap" .Release.Namespace "kube-root-ca.crt" -}}
{{- if not $live -}}
{{- $live = lookup "v1" "ConfigMap" "default" "kube-root-ca.crt" -}}
{{- end -}}
{{- if and $live (not (.Capabilities.APIVersions.Has "ray.io/v1/RayService")) -}}
kuberay: this cluster has no KubeRay CRDs (ray.io/v1 RayService). Install the KubeRay operator first (chart kuberay-operator), or set kuberay.checkOperator=false if its CRDs are applied in the same pipeline.
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
API keys only from Secrets: keys written in the platform (a tenant's too) would travel in the serve
config, readable on the Ray dashboard (serving.k8s.serve_config.inline_key_settings, for the operator).
*/}}
{{- define "llm-serving.validate.inlineKeys" -}}
{{- $problems := list -}}
{{- $refused := "API keys in values would travel in the RayService's serve config, readable on the Ray dashboard; the chart refuses them." -}}
{{- if dig "auth" "api_keys" nil .Values.platform -}}
{{- $problems = append $problems (printf "platform.auth.api_keys: %s Put them in a Secret, apiKeys.existingSecret (and apiKeys.key) or apiKeys.value (which creates one), and remove platform.auth.api_keys." $refused) -}}
{{- end -}}
{{- if dig "analysis" "auth" "api_keys" nil .Values.platform -}}
{{- $problems = append $problems (printf "platform.analysis.auth.api_keys: %s Give the analysis app the variable platform.analysis.auth.api_keys_env from a Secret through extraEnv (or share the platform's keys: apiKeys.existingSecret), and remove platform.analysis.auth.api_keys." $refused) -}}
{{- end -}}
{{- range $i, $tenant := (.Values.platform.auth | default dict).tenants -}}
{{- if $tenant.api_keys -}}
{{- $problems = append $problems (printf "platform.auth.tenants[%d].api_keys (tenant %s): %s Put them in a Secret named by tenantKeys.%s.existingSecret (and .key), and remove platform.auth.tenants[%d].api_keys." $i $tenant.name $refused $tenant.name $i) -}}
{{- end -}}
{{- end -}}
{{- range $i, $tenant := (dig "analysis" "auth" dict .Values.platform | default dict).tenants -}}
{{- if $tenant.api_keys -}}
{{- $problems = append $problems (printf "platform.analysis.auth.tenants[%d].api_keys (tenant %s): %s Give the tenant an api_keys_env from a Secret through extraEnv, and remove platform.analysis.auth.tenants[%d].api_keys." $i $tenant.name $refused $i) -}}
{{- end -}}
{{- end -}}
{{- join "\n- " $problems -}}
{{- end -}}

{{/* KubeRay's own checks of clusterUpgradeOptions (utils/validation.go), at install time. */}}
{{- define "llm-serving.validate.incrementalUpgrade" -}}
{{- if eq .Values.ray.upgradeStrategy "NewClusterWithIncrementalUpgrade" -}}
{{- $problems := list -}}
{{- $o := .Values.ray.incrementalUpgrade -}}
{{- if not $o.gatewayClassName -}}
{{- $problems = append $problems "ray.incrementalUpgrade.gatewayClassName: NewClusterWithIncrementalUpgrade routes traffic through a Gateway KubeRay creates; set the GatewayClass of your Gateway API controller (e.g. istio, eg), or use ray.upgradeStrategy=NewCluster." -}}
{{- end -}}
{{- if not .Values.autoscaler.enabled -}}
{{- $problems = append $problems "autoscaler.enabled: NewClusterWithIncrementalUpgrade needs Ray's autoscaler (KubeRay refuses it without); set autoscaler.enabled=true or use ray.upgradeStrategy=NewCluster." -}}
{{- end -}}
{{- if gt (int $o.stepSizePercent) (int $o.maxSurgePercent) -}}
{{- $problems = append $problems (printf "ray.incrementalUpgrade: stepSizePercent (%d) must not exceed maxSurgePercent (%d)." (int $o.stepSizePercent) (int $o.maxSurgePercent)) -}}
{{- end -}}
{{- join "\n- " $problems -}}
{{- end -}}
{{- end -}}

{{/*
A ReadWriteOnce (or ReadWriteOncePod) claim is attached to one node: a second worker pod on another
node hangs in ContainerCreating (Multi-Attach). Worker pods of every group may mount the cache, and
with a NewCluster* upgrade strategy the new RayCluster's workers mount it beside the old ones.
An existing claim is checked where Helm sees the cluster (offline renders cannot read it).
*/}}
{{- define "llm-serving.validate.modelCache" -}}
{{- $pvc := .Values.model.cache.persistentVolumeClaim -}}
{{- if $pvc.enabled -}}
{{- $modes := $pvc.accessModes -}}
{{- if $pvc.existingClaim -}}
{{- $modes = dig "spec" "accessModes" list (lookup "v1" "PersistentVolumeClaim" .Release.Namespace $pvc.existingClaim) -}}
{{- end -}}
{{- $pods := 0 -}}
{{- $groups := list -}}
{{- range $key := list "gpu" "cpu" -}}
{{- $g := get $.Values.workers $key -}}
{{- if $g.enabled -}}
{{- $pods = add $pods (int $g.maxReplicas) -}}
{{- $groups = append $groups (printf "workers.%s.maxReplicas=%d" $key (int $g.maxReplicas)) -}}
{{- end -}}
{{- end -}}
{{- $clusters := ternary 1 2 (eq .Values.ray.upgradeStrategy "None") -}}
{{- $pods = mul $pods $clusters -}}
{{- if and $modes (not (has "ReadWriteMany" $modes)) (gt $pods 1) -}}
model.cache.persistentVolumeClaim.accessModes: {{ toJson $modes }}{{ with $pvc.existingClaim }} (of claim {{ . }}){{ end }} lets one node mount the model cache, but up to {{ $pods }} worker pods may mount it ({{ join " + " $groups }}{{ if gt $clusters 1 }}, twice during an upgrade: ray.upgradeStrategy={{ .Values.ray.upgradeStrategy }} starts a second RayCluster{{ end }}); pods on another node hang in ContainerCreating. Set model.cache.persistentVolumeClaim.accessModes=[ReadWriteMany] with a shared-file storageClassName (EFS, Filestore, Azure Files, NFS), or model.cache.persistentVolumeClaim.enabled=false (an emptyDir per pod).
{{- end -}}
{{- end -}}
{{- end -}}

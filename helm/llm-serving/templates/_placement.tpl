{{/*
Where replicas run. GPU workers advertise only the CPUs their vLLM replicas reserve; a replica on
the CPU (HF baseline, analysis, the model router, vLLM with accelerator cpu) placed there first
would take one and leave a GPU idle (on a one-GPU cluster vLLM would never start). So only the
CPU worker group advertises the custom resource llm-serving.io/cpu-worker and every CPU replica
requires a sliver of it (serving.k8s.serve_config.pinned_to_cpu_workers; local runs do not).
*/}}

{{/* An app's args with its replicas pinned to CPU workers when they run on the CPU
(dict "args" <args> "name" <section name> "section" <settings as written>). */}}
{{- define "llm-serving.pinnedArgs" -}}
{{- $args := .args -}}
{{- if eq (dig "resources" "accelerator" "cpu" (.section | default dict)) "cpu" -}}
{{- $pin := include "llm-serving.cpuWorker" . | fromJson -}}
{{- $own := deepCopy (get $args .name | default dict) -}}
{{- $resources := deepCopy (dig "resources" dict $own | default dict) -}}
{{- $custom := merge (dict $pin.resource $pin.share) (deepCopy ($resources.custom_resources | default dict)) -}}
{{- $_ := set $resources "custom_resources" $custom -}}
{{- $_ = set $own "resources" $resources -}}
{{- $_ = set $args .name $own -}}
{{- end -}}
{{- toYaml $args -}}
{{- end -}}

{{/* The model router's actor options: Serve's default CPU (its code sets none), on CPU workers. */}}
{{- define "llm-serving.routerDeployments" -}}
{{- $pin := include "llm-serving.cpuWorker" . | fromJson -}}
{{- $table := include "llm-serving.appTable" . | fromJson -}}
{{- toYaml (list (dict "name" $table.router.deployment "ray_actor_options" (dict "num_cpus" 1 "resources" (dict $pin.resource $pin.share)))) -}}
{{- end -}}

{{/* The CPU group's `ray start` parameters: the resource CPU replicas require, one per pod. */}}
{{- define "llm-serving.cpuRayStartParams" -}}
{{- $params := deepCopy (.Values.workers.cpu.rayStartParams | default dict) -}}
{{- if not (hasKey $params "resources") -}}
{{- /* KubeRay's format: a JSON object quoted for the shell (Ray's autoscaler parses it back). */}}
{{- $_ := set $params "resources" (printf `"{\"%s\": 1}"` (include "llm-serving.cpuWorker" . | fromJson).resource) -}}
{{- end -}}
{{- toYaml $params -}}
{{- end -}}

{{/* Enabled apps whose replicas run on the CPU, as the values name them. */}}
{{- define "llm-serving.cpuApps" -}}
{{- $platform := .Values.platform -}}
{{- $table := include "llm-serving.appTable" . | fromJson -}}
{{- $names := list -}}
{{- range $name := include "llm-serving.appNames" . | fromJsonArray -}}
{{- $app := get $platform $name | default dict -}}
{{- if not (dig "enabled" true $app) -}}
{{- else if and (eq $name "vllm") $platform.models -}}
{{- $names = append $names "the model router (platform.models)" -}}
{{- range $i, $entry := $platform.models -}}
{{- if eq (dig "resources" "accelerator" "cpu" $entry) "cpu" -}}
{{- $names = append $names (printf "platform.models[%d] (%s)" $i $entry.name) -}}
{{- end -}}
{{- end -}}
{{- else if and (get $table $name).resources (eq (dig "resources" "accelerator" "cpu" $app) "cpu") -}}
{{- $names = append $names (printf "platform.%s" $name) -}}
{{- end -}}
{{- end -}}
{{- toJson $names -}}
{{- end -}}

{{- define "llm-serving.validate.cpuGroup" -}}
{{- $resource := (include "llm-serving.cpuWorker" . | fromJson).resource -}}
{{- $cpu := .Values.workers.cpu -}}
{{- $apps := include "llm-serving.cpuApps" . | fromJsonArray -}}
{{- if and $apps (not $cpu.enabled) -}}
workers.cpu.enabled: false, but replicas on the CPU ({{ join ", " $apps }}) require Ray's {{ $resource }} resource in the cluster, which only the CPU worker group advertises (GPU workers keep their CPUs for vLLM). Set workers.cpu.enabled=true, or disable those apps (or give them resources.accelerator=gpu).
{{- else if and $cpu.enabled (hasKey ($cpu.rayStartParams | default dict) "resources") (not (contains (printf `\"%s\"` $resource) (toString $cpu.rayStartParams.resources))) -}}
workers.cpu.rayStartParams.resources: replaces the chart's resources of the CPU group but lacks {{ $resource }}, which every replica on the CPU requires. Add it, e.g. '"{\"{{ $resource }}\": 1, \"yours\": 1}"'.
{{- end -}}
{{- end -}}

{{/*
A rolling update (a new engine setting or model) starts ceil(max_surge_percent x replicas / 100)
new replicas of an app before its old ones stop (Serve's _surge_replicas_to_start). At full scale
that is a GPU beyond the other apps' max_replicas: without it the new replica waits for a GPU and
the rollout stalls while load stays high. Empty when the GPU group holds the largest surge.
*/}}
{{- define "llm-serving.surgeWarning" -}}
{{- $gpu := .Values.workers.gpu -}}
{{- if and $gpu.enabled (ge (int $gpu.gpusPerWorker) 1) -}}
{{- $d := include "llm-serving.servingDefaults" . | fromJson -}}
{{- $table := include "llm-serving.appTable" . | fromJson -}}
{{- $apps := list -}}
{{- if dig "vllm" "enabled" true .Values.platform -}}
{{- range $i, $entry := .Values.platform.models -}}
{{- $apps = append $apps (dict "name" (printf "platform.models[%d] (%s)" $i $entry.name) "app" $entry "scaled" true) -}}
{{- end -}}
{{- end -}}
{{- range $name := include "llm-serving.appNames" . | fromJsonArray -}}
{{- $app := get $.Values.platform $name | default dict -}}
{{- if and (dig "enabled" true $app) (not (and (eq $name "vllm") $.Values.platform.models)) -}}
{{- $apps = append $apps (dict "name" (printf "platform.%s" $name) "app" $app "scaled" (get $table $name).scaled) -}}
{{- end -}}
{{- end -}}
{{- $worst := dict "surge" 0 -}}
{{- range $apps -}}
{{- if and .scaled (eq (dig "resources" "accelerator" "cpu" .app) "gpu") -}}
{{- $replicas := int (dig "num_replicas" $d.replica.num_replicas .app) -}}
{{- with dig "autoscaling" nil .app -}}{{- $replicas = int (dig "max_replicas" $d.autoscaling.max_replicas .) -}}{{- end -}}
{{- $percent := int (dig "max_surge_percent" $d.replica.max_surge_percent .app) -}}
{{- $surge := div (add (mul $percent $replicas) 99) 100 -}}
{{- if gt $surge (int $worst.surge) -}}
{{- $worst = dict "name" .name "surge" $surge "replicas" $replicas "percent" $percent -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $demand := include "llm-serving.gpuDemand" . | int -}}
{{- $capacity := mul (int $gpu.maxReplicas) (int $gpu.gpusPerWorker) -}}
{{- $needed := add $demand (int $worst.surge) -}}
{{- if gt $needed $capacity -}}
a rolling update of {{ $worst.name }} at full scale ({{ $worst.replicas }} replicas) starts {{ $worst.surge }} surge replica(s) (max_surge_percent {{ $worst.percent }}) beside the {{ $demand }} GPU replica(s) Serve may run: it needs {{ $needed }} GPUs, but workers.gpu.maxReplicas x gpusPerWorker = {{ $capacity }}. At full scale the new replica(s) find no GPU and the rollout waits (old replicas keep serving) until load drops. Raise workers.gpu.maxReplicas={{ div (add $needed (int $gpu.gpusPerWorker) -1) (int $gpu.gpusPerWorker) }}, or lower max_replicas, or set that app's max_surge_percent: 0 (an old replica stops first).
{{- end -}}
{{- end -}}
{{- end -}}

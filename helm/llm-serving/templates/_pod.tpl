{{/*
Ray pod templates. Called with (dict "root" $ "role" "head"|"worker" "group" <values map> "gpus" N).
KubeRay adds the `ray start` command, /dev/shm, its own labels and the wait-for-GCS init container.
*/}}

{{- define "llm-serving.modelEnv" -}}
- name: HF_HOME
  value: {{ printf "%s/huggingface" .Values.model.cache.mountPath | quote }}
- name: LLM_SERVING_CACHE
  value: {{ printf "%s/llm-serving" .Values.model.cache.mountPath | quote }}
{{- if .Values.model.cache.persistentVolumeClaim.enabled }}
# vLLM's torch.compile cache (VLLM_CACHE_ROOT/torch_compile_cache) on the shared claim: a replica
# on a new GPU node loads the compiled graphs of the first instead of compiling again
# (enforce_eager: false).
- name: VLLM_CACHE_ROOT
  value: {{ printf "%s/vllm" .Values.model.cache.mountPath | quote }}
{{- end }}
{{- if include "llm-serving.hfTokenSecret" . }}
# The token is a file, not an env var: huggingface_hub reads HF_TOKEN_PATH.
- name: HF_TOKEN_PATH
  value: {{ printf "%s/%s" (include "llm-serving.hfTokenDir" .) .Values.model.hfToken.key | quote }}
{{- end }}
{{- end -}}

{{- define "llm-serving.hfTokenSecret" -}}
{{- if .Values.model.hfToken.existingSecret -}}
{{- .Values.model.hfToken.existingSecret -}}
{{- else if .Values.model.hfToken.value -}}
{{- printf "%s-hf-token" (include "llm-serving.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The API keys' Secret (values apiKeys); empty when no keys come from a Secret. */}}
{{- define "llm-serving.apiKeysSecret" -}}
{{- if .Values.apiKeys.existingSecret -}}
{{- .Values.apiKeys.existingSecret -}}
{{- else if .Values.apiKeys.value -}}
{{- printf "%s-api-keys" (include "llm-serving.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Replicas read the keys from the environment variable the platform config names. */}}
{{- define "llm-serving.apiKeysEnv" -}}
{{- with include "llm-serving.apiKeysSecret" . -}}
- name: {{ dig "auth" "api_keys_env" "LLM_SERVING_API_KEYS" $.Values.platform | default "LLM_SERVING_API_KEYS" }}
  valueFrom: {secretKeyRef: {name: {{ . }}, key: {{ $.Values.apiKeys.key }}}}
{{- end -}}
{{- end -}}

{{- define "llm-serving.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "llm-serving.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "llm-serving.hfTokenDir" -}}/var/run/secrets/huggingface{{- end -}}

{{/* Volume mounts of Ray and prefetch containers: the model cache, the token when there is one. */}}
{{- define "llm-serving.modelMounts" -}}
- {name: model-cache, mountPath: {{ .Values.model.cache.mountPath }}}
{{- if include "llm-serving.hfTokenSecret" . }}
- {name: hf-token, mountPath: {{ include "llm-serving.hfTokenDir" . }}, readOnly: true}
{{- end }}
{{- end -}}

{{- define "llm-serving.modelCacheClaim" -}}
{{- .Values.model.cache.persistentVolumeClaim.existingClaim | default (printf "%s-model-cache" (include "llm-serving.fullname" .)) -}}
{{- end -}}

{{/*
Health endpoints: GCS on the head's dashboard; the raylet via the dashboard agent on workers.
A worker is Ready only while Serve's proxy on it answers (/-/healthz: it runs where replicas run),
as KubeRay's own injected probe does: KubeRay labels every worker pod ray.io/serve=true and its
serve Service selects on that label, so readiness alone keeps traffic on pods that serve. A
worker without replicas stays NotReady; its group's PodDisruptionBudget evicts it regardless
(unhealthyPodEvictionPolicy: AlwaysAllow) and counts only Ready pods, so it blocks no drain.
*/}}
{{- define "llm-serving.probes" -}}
{{- $p := .root.Values.probes -}}
{{- $live := ternary (dict "path" "/api/gcs_healthz" "port" "dashboard") (dict "path" "/api/local_raylet_healthz" "port" 52365) (eq .role "head") -}}
{{- $ready := ternary $live (dict "path" "/-/healthz" "port" "serve") (eq .role "head") -}}
startupProbe:
  httpGet: {{- toYaml $live | nindent 4 }}
  {{- toYaml $p.startup | nindent 2 }}
livenessProbe:
  httpGet: {{- toYaml $live | nindent 4 }}
  {{- toYaml $p.liveness | nindent 2 }}
readinessProbe:
  httpGet: {{- toYaml $ready | nindent 4 }}
  {{- toYaml $p.readiness | nindent 2 }}
{{- end -}}

{{- define "llm-serving.rayPorts" -}}
{{- $ports := list -}}
{{- if eq .role "head" -}}
{{- $ports = list (dict "name" "gcs" "containerPort" 6379) (dict "name" "dashboard" "containerPort" 8265) (dict "name" "client" "containerPort" 10001) -}}
{{- end -}}
{{- $serve := dict "name" "serve" "containerPort" (include "llm-serving.httpPort" .root | int) -}}
{{- toYaml (concat $ports (list $serve (dict "name" "metrics" "containerPort" 8080))) -}}
{{- end -}}

{{- define "llm-serving.rayResources" -}}
{{- $res := deepCopy (.group.resources | default dict) -}}
{{- if .gpus -}}
{{- $_ := set $res "limits" (merge (dict "nvidia.com/gpu" (.gpus | int)) ($res.limits | default dict)) -}}
{{- end -}}
{{- toYaml $res -}}
{{- end -}}

{{- define "llm-serving.prefetchContainer" -}}
{{- $root := .root -}}
- name: prefetch-model
  image: {{ include "llm-serving.image" $root }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  # Idempotent: a cached model (shared PVC, or a restarted pod) is found without downloading.
  # Every model an app serves (each of platform.models); demo adapters are built by each replica
  # as it starts, into the same cache.
  command:
    - python
    - -c
    - "import sys; from serving.models import resolve_model; print(*(resolve_model(ref) for ref in sys.argv[1:]))"
    {{- range include "llm-serving.servedModelRefs" $root | fromYamlArray }}
    - {{ . | quote }}
    {{- end }}
  env: {{- include "llm-serving.modelEnv" $root | nindent 4 }}
  resources: {{- toYaml $root.Values.model.prefetch.resources | nindent 4 }}
  securityContext: {{- toYaml $root.Values.containerSecurityContext | nindent 4 }}
  volumeMounts: {{- include "llm-serving.modelMounts" $root | nindent 4 }}
{{- end -}}

{{- define "llm-serving.rayPodTemplate" -}}
{{- $root := .root -}}
{{- $component := printf "ray-%s" .role -}}
metadata:
  labels:
    {{- include "llm-serving.rayPodSelector" $root | nindent 4 }}
    app.kubernetes.io/component: {{ $component }}
    {{- with .group.podLabels }}{{ toYaml . | nindent 4 }}{{ end }}
  {{- with merge (dict) (.group.podAnnotations | default dict) (.annotations | default dict) }}
  annotations: {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  {{- if ne .role "head" }}
  # Only the head's autoscaler sidecar talks to the Kubernetes API.
  automountServiceAccountToken: false
  # The preStop drain's deadline, then time for Ray to stop (serving.k8s.drain.STOP_MARGIN_S).
  terminationGracePeriodSeconds: {{ add (include "llm-serving.drainDeadlineSeconds" $root) 30 }}
  {{- end }}
  securityContext: {{- toYaml $root.Values.podSecurityContext | nindent 4 }}
  {{- with include "llm-serving.serviceAccountName" $root }}
  serviceAccountName: {{ . }}
  {{- end }}
  {{- with .group.runtimeClassName }}
  runtimeClassName: {{ . }}
  {{- end }}
  {{- with .group.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with .group.topologySpreadConstraints }}
  topologySpreadConstraints: {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $root.Values.imagePullSecrets }}
  imagePullSecrets: {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .group.nodeSelector }}
  nodeSelector: {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .group.tolerations }}
  tolerations: {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .group.affinity }}
  affinity: {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if and (ne .role "head") $root.Values.model.prefetch.enabled }}
  initContainers: {{- include "llm-serving.prefetchContainer" . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ $component }}
      image: {{ include "llm-serving.image" $root }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      ports: {{- include "llm-serving.rayPorts" . | nindent 8 }}
      env:
        {{- include "llm-serving.rayEnv" $root | nindent 8 }}
        {{- include "llm-serving.modelEnv" $root | nindent 8 }}
        {{- with include "llm-serving.apiKeysEnv" $root }}{{ . | nindent 8 }}{{ end }}
        {{- with include "llm-serving.tenantKeysEnv" $root }}{{ . | nindent 8 }}{{ end }}
        {{- with include "llm-serving.stateEnv" $root }}{{ . | nindent 8 }}{{ end }}
        {{- with $root.Values.extraEnv }}{{ toYaml . | nindent 8 }}{{ end }}
      resources: {{- include "llm-serving.rayResources" . | nindent 8 }}
      securityContext: {{- toYaml $root.Values.containerSecurityContext | nindent 8 }}
      {{- include "llm-serving.probes" . | nindent 6 }}
      {{- if ne .role "head" }}
      # Ray drains this node first (Serve moves its replicas, their requests end), within the
      # request deadline; serving/k8s/drain.py.
      lifecycle:
        preStop:
          exec:
            command: [python, -m, serving.k8s.drain, --deadline-s, {{ include "llm-serving.drainDeadlineSeconds" $root | quote }}]
      {{- end }}
      volumeMounts:
        {{- include "llm-serving.modelMounts" $root | nindent 8 }}
        {{- with $root.Values.extraVolumeMounts }}{{ toYaml . | nindent 8 }}{{ end }}
  volumes:
    - name: model-cache
      {{- /* The head runs no replicas (num-cpus 0), so it never holds the shared claim. */}}
      {{- if and (ne .role "head") $root.Values.model.cache.persistentVolumeClaim.enabled }}
      persistentVolumeClaim: {claimName: {{ include "llm-serving.modelCacheClaim" $root }}}
      {{- else }}
      emptyDir: {sizeLimit: {{ $root.Values.model.cache.emptyDirSizeLimit }}}
      {{- end }}
    {{- with include "llm-serving.hfTokenSecret" $root }}
    - name: hf-token
      secret: {secretName: {{ . }}, defaultMode: 0440}
    {{- end }}
    {{- with $root.Values.extraVolumes }}{{ toYaml . | nindent 4 }}{{ end }}
{{- end -}}

{{/*
The platform's store (values `state`, PlatformConfig.state): the bundled PostgreSQL's names, the
URL the replicas open, the Secret that holds the password and the variable that carries it.
*/}}

{{- define "llm-serving.stateName" -}}
{{- printf "%s-state" (include "llm-serving.fullname" .) -}}
{{- end -}}

{{- define "llm-serving.stateSelector" -}}
app.kubernetes.io/name: {{ include "llm-serving.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: state
{{- end -}}

{{/* The URL in the replicas' platform.state.url: the user's (an existing server), else the bundled
server's Service; empty: SQLite in each pod. Never a password (PlatformConfig refuses one). */}}
{{- define "llm-serving.stateUrl" -}}
{{- $pg := .Values.state.postgresql -}}
{{- $url := dig "state" "url" nil .Values.platform -}}
{{- if $url -}}
{{- $url -}}
{{- else if $pg.enabled -}}
{{- printf "postgresql+psycopg://%s@%s:5432/%s" $pg.user (include "llm-serving.stateName" .) $pg.database -}}
{{- end -}}
{{- end -}}

{{/* The password's Secret: the user's, else the one the chart creates for its own server. */}}
{{- define "llm-serving.stateSecret" -}}
{{- if .Values.state.existingSecret -}}
{{- .Values.state.existingSecret -}}
{{- else if and .Values.state.postgresql.enabled (not (dig "state" "url" nil .Values.platform)) -}}
{{- include "llm-serving.stateName" . -}}
{{- end -}}
{{- end -}}

{{- define "llm-serving.statePasswordEnv" -}}
{{- dig "state" "password_env" "LLM_SERVING_STATE_PASSWORD" .Values.platform | default "LLM_SERVING_STATE_PASSWORD" -}}
{{- end -}}

{{/* Ray containers: the password from the Secret, in the variable platform.state.password_env names. */}}
{{- define "llm-serving.stateEnv" -}}
{{- with include "llm-serving.stateSecret" . -}}
- name: {{ include "llm-serving.statePasswordEnv" $ }}
  valueFrom: {secretKeyRef: {name: {{ . }}, key: {{ $.Values.state.secretKey }}}}
{{- end -}}
{{- end -}}

{{/* .Values.platform with state.url set to the store the chart points the replicas at. */}}
{{- define "llm-serving.platformWithState" -}}
{{- $platform := deepCopy .Values.platform -}}
{{- with include "llm-serving.stateUrl" . -}}
{{- $state := get $platform "state" | default dict -}}
{{- $_ := set $state "url" . -}}
{{- $_ = set $platform "state" $state -}}
{{- end -}}
{{- toYaml $platform -}}
{{- end -}}

{{/* The generated password: the live Secret's on upgrade (lookup), a new random one on install. */}}
{{- define "llm-serving.statePassword" -}}
{{- $live := lookup "v1" "Secret" .Release.Namespace (include "llm-serving.stateName" .) -}}
{{- with dig "data" .Values.state.secretKey "" $live -}}
{{- . | b64dec -}}
{{- else -}}
{{- randAlphaNum 32 -}}
{{- end -}}
{{- end -}}

{{/*
Every pod that may run vLLM replicas must reach one store: a SQLite file per pod is not shared.
Pods that may run them: every worker group's maxReplicas, twice while a NewCluster* upgrade runs
the old cluster beside the new one.
*/}}
{{- define "llm-serving.validate.state" -}}
{{- $problems := list -}}
{{- $url := dig "state" "url" nil .Values.platform -}}
{{- $pg := .Values.state.postgresql -}}
{{- if and $url $pg.enabled -}}
{{- $problems = append $problems "platform.state.url names an existing server, and state.postgresql.enabled=true would deploy another one that nothing uses. Set state.postgresql.enabled=false (and state.existingSecret to the Secret holding its password), or remove platform.state.url." -}}
{{- end -}}
{{- if and (include "llm-serving.stateSecret" .) (not (dig "state" "password_env" "x" .Values.platform)) -}}
{{- $problems = append $problems "platform.state.password_env is empty, so the replicas would not read the store's password from its Secret. Leave it unset (LLM_SERVING_STATE_PASSWORD) or name a variable." -}}
{{- end -}}
{{- $server := and $url (not (hasPrefix "sqlite" $url)) -}}
{{- if not (or $server $pg.enabled .Values.state.allowUnshared) -}}
{{- $pods := 0 -}}
{{- range $key := list "gpu" "cpu" -}}
{{- $g := get $.Values.workers $key -}}
{{- if $g.enabled -}}{{- $pods = add $pods (int $g.maxReplicas) -}}{{- end -}}
{{- end -}}
{{- $pods = mul $pods (ternary 1 2 (eq .Values.ray.upgradeStrategy "None")) -}}
{{- if gt $pods 1 -}}
{{- $problems = append $problems (printf "state: no shared store. With state.postgresql.enabled=false and no PostgreSQL in platform.state.url (%s), each pod keeps stored responses and batches in its own SQLite file, but up to %d pods may run vLLM replicas (worker maxReplicas, twice during a NewCluster upgrade), so a follow-up or a batch would miss them. Set state.postgresql.enabled=true (the default), or platform.state.url to an existing PostgreSQL (or state.allowUnshared=true to accept a store per pod)." ($url | default "unset") $pods) -}}
{{- end -}}
{{- end -}}
{{- join "\n- " $problems -}}
{{- end -}}

{{/*
Tenants' keys (values tenantKeys, platform.auth.tenants): each tenant's Secret reaches every Ray
container in a variable of its own, and the serve config names only that variable (the tenant's
api_keys_env), never a key: the serve config is readable on the Ray dashboard.
*/}}

{{/* Tenant -> the variable its keys arrive in, for each tenant with tenantKeys: the tenant's own
api_keys_env, else LLM_SERVING_TENANT_<NAME>_KEYS (a DNS label upper-cased, '-' as '_', so two
tenants never share one). */}}
{{- define "llm-serving.tenantKeyVariables" -}}
{{- $variables := dict -}}
{{- range $tenant := (.Values.platform.auth | default dict).tenants -}}
{{- if hasKey ($.Values.tenantKeys | default dict) $tenant.name -}}
{{- $derived := printf "LLM_SERVING_TENANT_%s_KEYS" ($tenant.name | upper | replace "-" "_") -}}
{{- $_ := set $variables $tenant.name ($tenant.api_keys_env | default $derived) -}}
{{- end -}}
{{- end -}}
{{- toJson $variables -}}
{{- end -}}

{{/* Ray containers: each tenant's keys from its Secret (tenants in name order). */}}
{{- define "llm-serving.tenantKeysEnv" -}}
{{- $env := list -}}
{{- range $tenant, $variable := include "llm-serving.tenantKeyVariables" . | fromJson -}}
{{- $secret := get $.Values.tenantKeys $tenant -}}
{{- $ref := dict "name" $secret.existingSecret "key" ($secret.key | default "api-keys") -}}
{{- $env = append $env (dict "name" $variable "valueFrom" (dict "secretKeyRef" $ref)) -}}
{{- end -}}
{{- with $env }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{/* .platform (a platform map) with each tenant of tenantKeys reading its keys' variable. */}}
{{- define "llm-serving.platformWithTenantKeys" -}}
{{- $platform := .platform -}}
{{- $variables := include "llm-serving.tenantKeyVariables" .root | fromJson -}}
{{- range $tenant := ($platform.auth | default dict).tenants -}}
{{- if hasKey $variables $tenant.name -}}
{{- $_ := set $tenant "api_keys_env" (get $variables $tenant.name) -}}
{{- end -}}
{{- end -}}
{{- toYaml $platform -}}
{{- end -}}

{{/* Every tenantKeys entry names a tenant of platform.auth.tenants; `default`'s keys are apiKeys'. */}}
{{- define "llm-serving.validate.tenantKeys" -}}
{{- $problems := list -}}
{{- $names := list -}}
{{- range (.Values.platform.auth | default dict).tenants -}}{{- $names = append $names .name -}}{{- end -}}
{{- range $name, $_ := .Values.tenantKeys | default dict -}}
{{- if eq $name "default" -}}
{{- $problems = append $problems "tenantKeys.default: the default tenant's keys are those of apiKeys (platform.auth.api_keys_env). Put them in apiKeys.existingSecret, and remove tenantKeys.default." -}}
{{- else if not (has $name $names) -}}
{{- $problems = append $problems (printf "tenantKeys.%s: platform.auth.tenants has no tenant %q (it has: %s). Add {name: %s} to platform.auth.tenants, or remove tenantKeys.%s." $name $name (join ", " $names | default "none") $name $name) -}}
{{- end -}}
{{- end -}}
{{- join "\n- " $problems -}}
{{- end -}}

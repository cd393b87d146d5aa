{{- define "pgsub.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "pgsub.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "pgsub.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "pgsub.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "pgsub.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "pgsub.passwordSecret" -}}
{{- if .Values.passwords.existingSecret -}}
{{- .Values.passwords.existingSecret -}}
{{- else if .Values.passwords.create -}}
{{- printf "%s-passwords" (include "pgsub.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* pgsub.yaml: the values' config, with the metrics port and each password file set. */}}
{{- define "pgsub.config" -}}
{{- $config := deepCopy .Values.config -}}
{{- $_ := set $config "metrics" (dict "host" "0.0.0.0" "port" .Values.metrics.port) -}}
{{- $secret := include "pgsub.passwordSecret" . -}}
{{- $subs := list -}}
{{- range $config.subscriptions -}}
{{- $sub := deepCopy . -}}
{{- if and $secret (not (hasKey $sub "password_file")) -}}
{{- $_ := set $sub "password_file" (printf "/etc/pgsub/passwords/%s" $sub.name) -}}
{{- end -}}
{{- $subs = append $subs $sub -}}
{{- end -}}
{{- $_ := set $config "subscriptions" $subs -}}
{{- if .Values.storageCredentials.existingSecret -}}
{{- $storage := deepCopy (default dict $config.storage) -}}
{{- $_ := set $storage "access_key_id_file" "/etc/pgsub/storage/access_key_id" -}}
{{- $_ := set $storage "secret_access_key_file" "/etc/pgsub/storage/secret_access_key" -}}
{{- $_ := set $config "storage" $storage -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{/* Names and labels. */}}
{{- define "agentq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "agentq.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "agentq.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "agentq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agentq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "agentq.labels" -}}
helm.sh/chart: {{ include "agentq.chart" . }}
{{ include "agentq.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Component selector labels: (dict "ctx" $ "component" "worker") */}}
{{- define "agentq.componentSelector" -}}
{{ include "agentq.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "agentq.componentLabels" -}}
{{ include "agentq.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The label that lets a pod reach the bundled Redis through the NetworkPolicy. */}}
{{- define "agentq.redisClientLabel" -}}
{{ include "agentq.fullname" . }}-redis-client
{{- end -}}

{{- define "agentq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "agentq.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "agentq.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Secrets and Redis. */}}
{{- define "agentq.secretName" -}}
{{- default (include "agentq.fullname" .) .Values.secrets.existingSecret -}}
{{- end -}}

{{- define "agentq.redisHost" -}}
{{ include "agentq.fullname" . }}-redis
{{- end -}}

{{- define "agentq.redisSecretName" -}}
{{- default (printf "%s-redis" (include "agentq.fullname" .)) .Values.redis.bundled.auth.existingSecret -}}
{{- end -}}

{{/* The worker's queues, interactive first: a list. */}}
{{- define "agentq.queues" -}}
{{- if .Values.worker.queues -}}
{{- toJson .Values.worker.queues -}}
{{- else -}}
{{- toJson (list .Values.config.queue (printf "%s.batch" .Values.config.queue)) -}}
{{- end -}}
{{- end -}}

{{/* A value kept across upgrades: the existing Secret's key if the release already has it, else random.
     (dict "ctx" $ "secret" NAME "key" KEY) */}}
{{- define "agentq.persistentRandom" -}}
{{- $existing := lookup "v1" "Secret" .ctx.Release.Namespace .secret -}}
{{- if and $existing $existing.data (hasKey $existing.data .key) -}}
{{- index $existing.data .key | b64dec -}}
{{- else -}}
{{- randAlphaNum 48 -}}
{{- end -}}
{{- end -}}

{{/* The Redis connection, for every agentq container (workers and sweeper). */}}
{{- define "agentq.redisEnv" -}}
{{- if .Values.redis.bundled.enabled }}
{{- if .Values.redis.bundled.auth.enabled }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "agentq.redisSecretName" . }}
      key: redis-password
- name: AGENTQ_REDIS_URL
  value: "redis://:$(REDIS_PASSWORD)@{{ include "agentq.redisHost" . }}:6379/0"
{{- else }}
- name: AGENTQ_REDIS_URL
  value: "redis://{{ include "agentq.redisHost" . }}:6379/0"
{{- end }}
{{- else }}
- name: AGENTQ_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ required "redis.external.existingSecret is required when redis.bundled.enabled is false" .Values.redis.external.existingSecret }}
      key: {{ .Values.redis.external.urlKey }}
{{- if .Values.redis.external.brokerUrlKey }}
- name: AGENTQ_BROKER_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.external.existingSecret }}
      key: {{ .Values.redis.external.brokerUrlKey }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The approval HMAC secret (current + old ones) and provider credentials: workers only. */}}
{{- define "agentq.workerSecretEnv" -}}
- name: AGENTQ_APPROVAL_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ include "agentq.secretName" . }}
      key: approval-secret
- name: AGENTQ_APPROVAL_OLD_SECRETS
  valueFrom:
    secretKeyRef:
      name: {{ include "agentq.secretName" . }}
      key: approval-old-secrets
      optional: true
{{- range .Values.secrets.providerEnv }}
- name: {{ . }}
  valueFrom:
    secretKeyRef:
      name: {{ include "agentq.secretName" $ }}
      key: {{ . }}
      optional: true
{{- end }}
{{- end -}}

{{/* Roll pods when their configuration changes. */}}
{{- define "agentq.checksums" -}}
checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- if not .Values.secrets.existingSecret }}
checksum/secret: {{ .Values.secrets | toJson | sha256sum }}
{{- end }}
{{- end -}}

{{/* HPA behavior: scale out fast on a backlog, in slowly (each removed worker drains its steps first). */}}
{{- define "agentq.scaleBehavior" -}}
scaleUp:
  stabilizationWindowSeconds: 0
  policies:
    - type: Percent
      value: 100
      periodSeconds: 30
scaleDown:
  stabilizationWindowSeconds: {{ .Values.autoscaling.scaleDownStabilizationSeconds }}
  policies:
    - type: Pods
      value: 1
      periodSeconds: 60
{{- end -}}

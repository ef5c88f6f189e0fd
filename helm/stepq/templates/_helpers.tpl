{{/* Names and labels. */}}
{{- define "stepq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "stepq.fullname" -}}
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

{{- define "stepq.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "stepq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "stepq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "stepq.labels" -}}
helm.sh/chart: {{ include "stepq.chart" . }}
{{ include "stepq.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Component selector labels: (dict "ctx" $ "component" "worker") */}}
{{- define "stepq.componentSelector" -}}
{{ include "stepq.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "stepq.componentLabels" -}}
{{ include "stepq.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The label that lets a pod reach the bundled Redis through the NetworkPolicy. */}}
{{- define "stepq.redisClientLabel" -}}
{{ include "stepq.fullname" . }}-redis-client
{{- end -}}

{{- define "stepq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "stepq.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "stepq.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Secrets and Redis. */}}
{{- define "stepq.secretName" -}}
{{- default (include "stepq.fullname" .) .Values.secrets.existingSecret -}}
{{- end -}}

{{- define "stepq.redisHost" -}}
{{ include "stepq.fullname" . }}-redis
{{- end -}}

{{- define "stepq.redisSecretName" -}}
{{- default (printf "%s-redis" (include "stepq.fullname" .)) .Values.redis.bundled.auth.existingSecret -}}
{{- end -}}

{{/* The worker's queues, interactive first: a list. */}}
{{- define "stepq.queues" -}}
{{- if .Values.worker.queues -}}
{{- toJson .Values.worker.queues -}}
{{- else -}}
{{- toJson (list .Values.config.queue (printf "%s.batch" .Values.config.queue)) -}}
{{- end -}}
{{- end -}}

{{/* A value kept across upgrades: the existing Secret's key if the release already has it, else random.
     (dict "ctx" $ "secret" NAME "key" KEY) */}}
{{- define "stepq.persistentRandom" -}}
{{- $existing := lookup "v1" "Secret" .ctx.Release.Namespace .secret -}}
{{- if and $existing $existing.data (hasKey $existing.data .key) -}}
{{- index $existing.data .key | b64dec -}}
{{- else -}}
{{- randAlphaNum 48 -}}
{{- end -}}
{{- end -}}

{{/* The Redis connection, for every stepq container (workers and sweeper). */}}
{{- define "stepq.redisEnv" -}}
{{- if .Values.redis.bundled.enabled }}
{{- if .Values.redis.bundled.auth.enabled }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "stepq.redisSecretName" . }}
      key: redis-password
- name: STEPQ_REDIS_URL
  value: "redis://:$(REDIS_PASSWORD)@{{ include "stepq.redisHost" . }}:6379/0"
{{- else }}
- name: STEPQ_REDIS_URL
  value: "redis://{{ include "stepq.redisHost" . }}:6379/0"
{{- end }}
{{- else }}
- name: STEPQ_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ required "redis.external.existingSecret is required when redis.bundled.enabled is false" .Values.redis.external.existingSecret }}
      key: {{ .Values.redis.external.urlKey }}
{{- if .Values.redis.external.brokerUrlKey }}
- name: STEPQ_BROKER_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.external.existingSecret }}
      key: {{ .Values.redis.external.brokerUrlKey }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The approval HMAC secret (current + old ones) and provider credentials: workers only. */}}
{{- define "stepq.workerSecretEnv" -}}
- name: STEPQ_APPROVAL_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ include "stepq.secretName" . }}
      key: approval-secret
- name: STEPQ_APPROVAL_OLD_SECRETS
  valueFrom:
    secretKeyRef:
      name: {{ include "stepq.secretName" . }}
      key: approval-old-secrets
      optional: true
{{- range .Values.secrets.providerEnv }}
- name: {{ . }}
  valueFrom:
    secretKeyRef:
      name: {{ include "stepq.secretName" $ }}
      key: {{ . }}
      optional: true
{{- end }}
{{- end -}}

{{/* Roll pods when their configuration changes. */}}
{{- define "stepq.checksums" -}}
checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- if not .Values.secrets.existingSecret }}
checksum/secret: {{ .Values.secrets | toJson | sha256sum }}
{{- end }}
{{- end -}}

{{/* HPA behavior: scale out fast on a backlog, in slowly (each removed worker drains its steps first). */}}
{{- define "stepq.scaleBehavior" -}}
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

{{- define "cte.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cte.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "cte.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "cte.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "cte.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cte.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cte.labels" -}}
{{ include "cte.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "cte.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end -}}

{{- define "cte.webConfigSecret" -}}
{{- default (printf "%s-web-config" (include "cte.fullname" .)) .Values.webConfig.existingSecret -}}
{{- end -}}

{{- define "cte.webConfigOn" -}}
{{- if or .Values.webConfig.existingSecret .Values.webConfig.config }}true{{ end -}}
{{- end -}}

{{/* Target labels for both monitors: instance is the node's name (stable across pod
restarts, and what node_exporter's chart gives), node too, and cluster when set. */}}
{{- define "cte.relabelings" -}}
- sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: instance
- sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: node
{{- if .root.Values.cluster }}
- targetLabel: cluster
  replacement: {{ .root.Values.cluster | quote }}
{{- end }}
{{- with .monitor.extraRelabelings }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The scrape settings both monitors share. */}}
{{- define "cte.endpoint" -}}
path: /metrics
interval: {{ .monitor.interval }}
scrapeTimeout: {{ .monitor.scrapeTimeout }}
honorLabels: {{ .monitor.honorLabels }}
{{- $scheme := .monitor.scheme | default (ternary "https" "" .root.Values.webConfig.tls) }}
{{- with $scheme }}
scheme: {{ . }}
{{- end }}
{{- with .monitor.tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .monitor.basicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
relabelings:
  {{- include "cte.relabelings" . | nindent 2 }}
{{- with .monitor.metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* node-problem-detector's custom plugin: where our command and its config live. */}}
{{- define "cte.npdName" -}}
{{- printf "%s-node-problem-detector" (include "cte.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cte.npdImage" -}}
{{- $npd := .Values.nodeProblemDetector.image -}}
{{- if $npd.digest -}}
{{ $npd.repository }}@{{ $npd.digest }}
{{- else -}}
{{ $npd.repository }}:{{ $npd.tag }}
{{- end -}}
{{- end -}}

{{/* The custom plugin monitor config (JSON): one permanent rule whose plugin is
`cluster-telemetry-exporter health`, run from this chart's image, asking the exporter in
the same pod. Exit 0/1/2 set the condition False/True/Unknown; stdout is its message. */}}
{{- define "cte.npdConfig" -}}
{{- $npd := .Values.nodeProblemDetector -}}
{{- $args := list "health" (printf "--web.listen-address=127.0.0.1:%v" .Values.port) -}}
{{- if include "cte.webConfigOn" . -}}
{{- $args = append $args "--web.config.file=/etc/cluster-telemetry-exporter/web/web-config.yml" -}}
{{- end -}}
{{- if $npd.failOnWarning -}}
{{- $args = append $args "--fail-on=warning" -}}
{{- end -}}
{{- with $npd.basicAuth.username -}}
{{- $args = concat $args (list (printf "--auth.username=%s" .) "--auth.password-file=/etc/cluster-telemetry-exporter/npd-auth/password") -}}
{{- end -}}
{{- $rule := dict "type" "permanent" "condition" $npd.condition "reason" $npd.reason "path" "/opt/cte/bin/cluster-telemetry-exporter" "args" $args "timeout" $npd.timeout -}}
{{- $plugin := dict "invoke_interval" $npd.invokeInterval "timeout" $npd.timeout "max_output_length" 512 "concurrency" 1 "enable_message_change_based_condition_update" true -}}
{{- $condition := dict "type" $npd.condition "reason" $npd.healthyReason "message" "every GPU is fit to run jobs" -}}
{{- dict "plugin" "custom" "pluginConfig" $plugin "source" "cluster-telemetry-exporter" "metricsReporting" true "conditions" (list $condition) "rules" (list $rule) | toPrettyJson -}}
{{- end -}}

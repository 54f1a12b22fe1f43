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
{{/* Whether the exposed namespace, pod and container labels win over the target's (the
exporter's own pod): as set, else as the GPU Operator scrapes dcgm-exporter (false) with
dcgm-exporter's families on, else true. */}}
{{- define "cte.honorLabels" -}}
{{- if kindIs "invalid" .monitor.honorLabels -}}
{{- ne .root.Values.metrics.compat "dcgm-exporter" -}}
{{- else -}}
{{- .monitor.honorLabels -}}
{{- end -}}
{{- end -}}

{{/* Without honorLabels, our own families that name a GPU's holder (gpu_pod_info,
gpu_pod_labels_info) would carry it as exported_*: these give them back namespace, pod
and container (none where the family has none), so the per-pod rules and dashboards keep
working. The DCGM families keep the GPU Operator's exported_* form. */}}
{{- define "cte.ownPodLabels" -}}
{{- range list "namespace" "pod" "container" }}
- sourceLabels: [__name__, exported_{{ . }}]
  regex: (gpu_pod_info|gpu_pod_labels_info);(.*)
  targetLabel: {{ . }}
  replacement: $2
- sourceLabels: [__name__]
  regex: gpu_pod_info|gpu_pod_labels_info
  targetLabel: exported_{{ . }}
  replacement: ""
{{- end }}
{{- end -}}

{{- define "cte.endpoint" -}}
{{- $honor := include "cte.honorLabels" . | eq "true" -}}
path: /metrics
interval: {{ .monitor.interval }}
scrapeTimeout: {{ .monitor.scrapeTimeout }}
honorLabels: {{ $honor }}
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
{{- if or (not $honor) .monitor.metricRelabelings }}
metricRelabelings:
{{- if not $honor }}
  {{- include "cte.ownPodLabels" . | nindent 2 }}
{{- end }}
{{- with .monitor.metricRelabelings }}
  {{- toYaml . | nindent 2 }}
{{- end }}
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

{{/* The image of both workloads and the pre-delete hook: repository:tag, the tag defaulting to the
chart's appVersion, which is gpuslice's one version. */}}
{{- define "gpuslice.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

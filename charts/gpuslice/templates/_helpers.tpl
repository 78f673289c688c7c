{{/* gpuslice's own namespace: every namespaced object's, and the one its RBAC subjects, CEL rules and
the CRD's tenant rules name (docs/install.md, "Another namespace"). */}}
{{- define "gpuslice.namespace" -}}
{{ .Values.namespaceOverride | default .Release.Namespace }}
{{- end }}
{{/* The image of every workload and the pre-delete hook: repository:tag, the tag defaulting to the
chart's appVersion, which is gpuslice's one version; @digest after it when set (a release's chart). */}}
{{- define "gpuslice.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}{{ with .Values.image.digest }}@{{ . }}{{ end }}
{{- end }}
{{/* Every object's labels besides its own (app.kubernetes.io/name, part-of, component): Helm's standard
ones and commonLabels, less those the object has already (`own`: the admission policies are
app.kubernetes.io/managed-by gpuslice, which the uninstall finds them by). Never in selectors: they
change with each release. Called with (dict "top" $ "own" (list KEY...)). */}}
{{- define "gpuslice.labels" -}}
{{- $top := .top -}}
{{- $labels := dict "helm.sh/chart" (printf "%s-%s" $top.Chart.Name $top.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-")
      "app.kubernetes.io/managed-by" $top.Release.Service "app.kubernetes.io/instance" $top.Release.Name
      "app.kubernetes.io/version" $top.Chart.AppVersion -}}
{{- $labels = merge $labels ($top.Values.commonLabels | default dict) -}}
{{- $own := .own | default list -}}
{{- range $key, $value := $labels }}
{{- if not (has $key $own) }}
{{ $key }}: {{ $value | quote }}
{{- end }}
{{- end }}
{{- end }}
{{/* The maxMemory webhook's configuration with cert-manager: its CA injector writes the caBundle
(manifests/overlays/cert-manager). */}}
{{- define "gpuslice.certManagerAnnotations" -}}
{{- if .Values.webhook.certManager.enabled -}}
cert-manager.io/inject-ca-from: {{ printf "%s/gpuslice-webhook" (include "gpuslice.namespace" .) }}
{{- end }}
{{- end }}

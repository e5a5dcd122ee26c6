{{- /* Names, labels and the layout document shared by the templates. */ -}}

{{- define "agent.name" -}}
{{- .Values.name -}}
{{- end -}}

{{- define "agent.labels" -}}
app.kubernetes.io/name: {{ include "agent.name" . | quote }}
app.kubernetes.io/part-of: accelops-vgpu
app.kubernetes.io/managed-by: {{ .Values.managedBy | default .Release.Service | quote }}
{{- end -}}

{{- define "agent.image" -}}
{{- printf "%s/%s:%s" .Values.image.registry .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) -}}
{{- end -}}

{{- /* The service account's user name, as the API server reports it in request.userInfo.username. */ -}}
{{- define "agent.username" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "agent.name" .) -}}
{{- end -}}

{{- /*
The vgpu-device-manager document the agent reads: vdmConfig as given, else configs (the vgpu_profiles layout
schema) converted like the accelops.vgpu.vdm_document filter does: devices default all, profiles become
vgpu-devices, device_filter becomes device-filter.
*/ -}}
{{- define "agent.document" -}}
{{- if .Values.vdmConfig -}}
{{- .Values.vdmConfig | toPrettyJson -}}
{{- else -}}
{{- $configs := dict -}}
{{- range $label, $entries := .Values.configs -}}
{{- $converted := list -}}
{{- range $entries -}}
{{- $entry := dict "devices" (hasKey . "devices" | ternary .devices "all") "vgpu-devices" (.profiles | default dict) -}}
{{- if hasKey . "device_filter" -}}
{{- $_ := set $entry "device-filter" .device_filter -}}
{{- end -}}
{{- $converted = append $converted $entry -}}
{{- end -}}
{{- $_ := set $configs $label $converted -}}
{{- end -}}
{{- dict "version" "v1" "vgpu-configs" $configs | toPrettyJson -}}
{{- end -}}
{{- end -}}

{{- /* The labels of the document; fails naming the problem when defaultConfig is not one of them. */ -}}
{{- define "agent.checkLayouts" -}}
{{- $document := include "agent.document" . | fromJson -}}
{{- $labels := keys (get $document "vgpu-configs" | default dict) | sortAlpha -}}
{{- if and .Values.configs .Values.vdmConfig -}}
{{- fail "set one of configs and vdmConfig, not both" -}}
{{- end -}}
{{- if not $labels -}}
{{- fail "configs (or vdmConfig) must have at least one layout" -}}
{{- end -}}
{{- if not (has .Values.defaultConfig $labels) -}}
{{- fail (printf "defaultConfig %q is not one of the layouts %s" .Values.defaultConfig (toJson $labels)) -}}
{{- end -}}
{{- end -}}

{{/*
Helm's standard labels, on every object's metadata (not on the pod template or the selector, so
that upgrading the chart alone restarts no pod). tests/library/chart.rs ignores exactly these four when it
compares the chart with the kustomize base.
*/}}
{{- define "migdra.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/*
The service account's name. It is also in the admission policy's CEL and the ClusterRoleBinding;
the kustomize base names it migdra too.
*/}}
{{- define "migdra.serviceAccount" -}}
migdra
{{- end }}

{{/*
The port of metrics.addr (HOST:PORT or [V6]:PORT), for the containerPort.
*/}}
{{- define "migdra.metricsPort" -}}
{{- $parts := splitList ":" .Values.metrics.addr -}}
{{- $port := last $parts -}}
{{- if or (lt (len $parts) 2) (not (regexMatch "^[0-9]+$" $port)) -}}
{{- fail (printf "metrics.addr %q: give HOST:PORT, e.g. 127.0.0.1:9400 or 0.0.0.0:9400" .Values.metrics.addr) -}}
{{- end -}}
{{- $port -}}
{{- end }}

{{/*
The kubelet's --root-dir without a trailing slash, and the two directories under it that migdra
shares with the kubelet: its plugin directory (DRA socket, device metadata, checkpoint) and the
registration directory the kubelet watches.
*/}}
{{- define "migdra.kubeletRootDir" -}}
{{- $root := .Values.kubeletRootDir | trimSuffix "/" -}}
{{- if not (hasPrefix "/" $root) -}}
{{- fail (printf "kubeletRootDir %q: give the kubelet's --root-dir as an absolute path, e.g. /var/lib/kubelet" .Values.kubeletRootDir) -}}
{{- end -}}
{{- $root -}}
{{- end }}
{{- define "migdra.pluginDir" -}}
{{- include "migdra.kubeletRootDir" . }}/plugins/mig.slinky.slurm.net
{{- end }}
{{- define "migdra.registryDir" -}}
{{- include "migdra.kubeletRootDir" . }}/plugins_registry
{{- end }}

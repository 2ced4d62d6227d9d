{{/* The chart's name (nameOverride). */}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The resources' name: fullnameOverride, else the release name when it
contains the chart's name, else <release>-<name>. At most 52 characters, so
that "<fullname>-peers-tls" and the pods' names stay within DNS's 63. */}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "sluice.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels that select the release's pods. */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: rate-limiter
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The headless Service that seeds gossip and names the pods. */}}
{{- define "sluice.peersService" -}}
{{- printf "%s-peers" (include "sluice.fullname" .) -}}
{{- end -}}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "sluice.caSecret" -}}
{{- default (printf "%s-ca" (include "sluice.fullname" .)) .Values.tls.caSecret -}}
{{- end -}}

{{- define "sluice.peerSecret" -}}
{{- default (printf "%s-peers-tls" (include "sluice.fullname" .)) .Values.tls.peerSecret -}}
{{- end -}}

{{- define "sluice.gossipSecret" -}}
{{- default (printf "%s-gossip" (include "sluice.fullname" .)) .Values.gossip.keySecret -}}
{{- end -}}

{{- define "sluice.tokensSecret" -}}
{{- default (printf "%s-tokens" (include "sluice.fullname" .)) .Values.tokens.secret -}}
{{- end -}}

{{- define "sluice.clusterLabel" -}}
{{- default (printf "%s.%s" (include "sluice.fullname" .) .Release.Namespace) .Values.clusterLabel -}}
{{- end -}}

{{/* Whether the client API takes tokens. */}}
{{- define "sluice.tokens" -}}
{{- if has .Values.clientAuth (list "token" "either") }}true{{ end -}}
{{- end -}}

{{/* Whether the nodes serve Envoy's rate limit service: with rules only. */}}
{{- define "sluice.rls" -}}
{{- if .Values.rls.rules }}true{{ end -}}
{{- end -}}

{{/* The image reference; fails naming the value when it is not set. */}}
{{- define "sluice.image" -}}
{{- $repo := required "image.repository is required: the image make docker builds, pushed to a registry the cluster pulls from (there is no published image)" .Values.image.repository -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repo .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (required "image.tag (or image.digest) is required: the tag of the image you pushed" .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* DNS name of the client Service, under the cluster domain. */}}
{{- define "sluice.serviceFQDN" -}}
{{- printf "%s.%s.svc.%s" (include "sluice.fullname" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{/* serve --join: the gossip addresses of the first three pods (fewer with
fewer replicas), so that scaling does not change the pods' environment. A
node joining only itself (the first up) is a cluster of one until the
others answer: alone, it tries a seed again every 5 s. */}}
{{- define "sluice.join" -}}
{{- $fullname := include "sluice.fullname" . -}}
{{- $peers := include "sluice.peersService" . -}}
{{- $seeds := list -}}
{{- range $i := until (min 3 (int .Values.replicas) | int) -}}
{{- $seeds = append $seeds (printf "%s-%d.%s.%s.svc.%s:%d" $fullname $i $peers $.Release.Namespace $.Values.clusterDomain (int $.Values.ports.gossip)) -}}
{{- end -}}
{{- join "," $seeds -}}
{{- end -}}

{{/* Bytes in one unit of a Kubernetes memory quantity's suffix. */}}
{{- define "sluice.memoryUnit" -}}
{{- $units := dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 -}}
{{- get $units . -}}
{{- end -}}

{{/* GOMEMLIMIT: goMemLimit, else goMemLimitPercent of
resources.limits.memory in whole MiB (rounded down); empty for none. Fails
naming the value when the memory limit is missing or not a quantity it
reads (digits with an optional fraction and a suffix k, M, G, T, Ki, Mi,
Gi or Ti). */}}
{{- define "sluice.goMemLimit" -}}
{{- if .Values.goMemLimit -}}
{{- .Values.goMemLimit -}}
{{- else if gt (int .Values.goMemLimitPercent) 0 -}}
{{- $limits := default dict .Values.resources.limits -}}
{{- $mem := required "resources.limits.memory is required with goMemLimitPercent (GOMEMLIMIT is derived from it); set goMemLimitPercent: 0 to leave GOMEMLIMIT unset" $limits.memory -}}
{{- $bytes := 0.0 -}}
{{- if kindIs "string" $mem -}}
{{- if not (regexMatch "^[0-9]+(\\.[0-9]+)?(k|M|G|T|Ki|Mi|Gi|Ti)?$" $mem) -}}
{{- fail (printf "resources.limits.memory: %q is not a quantity this chart reads (e.g. 1Gi, 512Mi, 1500M); set goMemLimit instead" $mem) -}}
{{- end -}}
{{- $num := regexReplaceAll "^([0-9.]+).*$" $mem "${1}" -}}
{{- $unit := regexReplaceAll "^[0-9.]+" $mem "" -}}
{{- $bytes = mulf (float64 $num) (float64 (include "sluice.memoryUnit" $unit)) -}}
{{- else -}}
{{- $bytes = float64 $mem -}}
{{- end -}}
{{- $mib := floor (divf (mulf $bytes (float64 .Values.goMemLimitPercent)) (mulf 100.0 1048576.0)) -}}
{{- if lt $mib 1.0 -}}
{{- fail (printf "resources.limits.memory: %v leaves less than 1 MiB for GOMEMLIMIT" $mem) -}}
{{- end -}}
{{- printf "%.0fMiB" $mib -}}
{{- end -}}
{{- end -}}

{{/* Checks across values that the schema cannot express. */}}
{{- define "sluice.validate" -}}
{{- $need := add (int .Values.shutdown.handoffTimeoutSeconds) (int .Values.shutdown.leaveTimeoutSeconds) 5 -}}
{{- if lt (int .Values.terminationGracePeriodSeconds) (int $need) -}}
{{- fail (printf "terminationGracePeriodSeconds: %d is less than shutdown.handoffTimeoutSeconds + shutdown.leaveTimeoutSeconds + 5 = %d: the kubelet would kill a node before it has handed its keys off" (int .Values.terminationGracePeriodSeconds) (int $need)) -}}
{{- end -}}
{{- if and (eq .Values.tls.mode "provided") .Values.tls.extraHosts -}}
{{- fail "tls.extraHosts: only used with tls.mode issue (with provided, put the names in the certificates you make)" -}}
{{- end -}}
{{- end -}}

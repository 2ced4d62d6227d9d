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

{{/* Gossip's cluster label: clusterLabel, else <fullname>.<namespace>.
With regions clusterLabel is required (sluice.validate): a default made of
the release's names would differ between two regions' releases named
apart, and nodes with another label never meet, with no error but memberlist's
"discarding stream with unacceptable label" in their logs. */}}
{{- define "sluice.clusterLabel" -}}
{{- if .Values.clusterLabel -}}
{{- .Values.clusterLabel -}}
{{- else -}}
{{- printf "%s.%s" (include "sluice.fullname" .) .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* Whether the release is one region of several (regions.region set). */}}
{{- define "sluice.regions" -}}
{{- if .Values.regions.region }}true{{ end -}}
{{- end -}}

{{/* The names of regions.list, one a line. */}}
{{- define "sluice.regionNames" -}}
{{- range splitList "," .Values.regions.list }}
{{ regexReplaceAll "=.*$" (trim .) "" | trim }}
{{- end -}}
{{- end -}}

{{/* The StatefulSet: <fullname>, or <fullname>-<region> with regions, so
that its pods, whose names are their member names, are named apart from
the other regions' (member names are unique in the whole cluster). At
most 52 characters, as the full name. */}}
{{- define "sluice.statefulSetName" -}}
{{- $fullname := include "sluice.fullname" . -}}
{{- if include "sluice.regions" . -}}
{{- $region := .Values.regions.region -}}
{{- printf "%s-%s" ($fullname | trunc (int (sub 51 (len $region))) | trimSuffix "-") $region -}}
{{- else -}}
{{- $fullname -}}
{{- end -}}
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
fewer replicas), so that scaling does not change the pods' environment,
then regions.seeds (nodes of the other regions). A node joining only
itself (the first up) is a cluster of one until the others answer: alone,
it tries a seed again every 5 s. */}}
{{- define "sluice.join" -}}
{{- $statefulSet := include "sluice.statefulSetName" . -}}
{{- $peers := include "sluice.peersService" . -}}
{{- $seeds := list -}}
{{- range $i := until (min 3 (int .Values.replicas) | int) -}}
{{- $seeds = append $seeds (printf "%s-%d.%s.%s.svc.%s:%d" $statefulSet $i $peers $.Release.Namespace $.Values.clusterDomain (int $.Values.ports.gossip)) -}}
{{- end -}}
{{- join "," (concat $seeds .Values.regions.seeds) -}}
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
{{- if and .Values.regions.list (not .Values.regions.region) -}}
{{- fail "regions.region is required with regions.list: the region of this release's nodes, one of the list" -}}
{{- end -}}
{{- if include "sluice.regions" . -}}
{{- if not .Values.regions.list -}}
{{- fail (printf "regions.list is required with regions.region %q: the cluster's regions and weights, the same in every region (e.g. ra=1,rb=1,rc=1)" .Values.regions.region) -}}
{{- end -}}
{{- $names := include "sluice.regionNames" . | trim | splitList "\n" -}}
{{- if not (has .Values.regions.region $names) -}}
{{- fail (printf "regions.region %q is not in regions.list %q" .Values.regions.region .Values.regions.list) -}}
{{- end -}}
{{- if not .Values.regions.seeds -}}
{{- fail "regions.seeds is required with regions.region: gossip addresses (host:port) of nodes in the other regions, or this region never meets them" -}}
{{- end -}}
{{- if and .Values.networkPolicy.enabled (not .Values.regions.peers) -}}
{{- fail "regions.peers is required with regions.region and networkPolicy.enabled: the other regions' nodes as NetworkPolicyPeers (ipBlocks of the addresses they send from and are reached at), or the NetworkPolicy shuts them out; [{ipBlock: {cidr: 0.0.0.0/0}}] lets anyone reach gossip and the peer port (TLS and the gossip key still check them)" -}}
{{- end -}}
{{- if not .Values.clusterLabel -}}
{{- fail (printf "clusterLabel is required with regions.region: gossip's cluster label, the same string in every region's release (put it in the values file the regions share, e.g. clusterLabel: sluice-prod); nodes whose labels differ never meet (a release installed before it was required has %q)" (printf "%s/%s" (include "sluice.fullname" .) (regexReplaceAll "\\s" .Values.regions.list ""))) -}}
{{- end -}}
{{- end -}}
{{- if eq .Values.advertise.mode "loadBalancer" -}}
{{- $n := len .Values.advertise.loadBalancer.addresses -}}
{{- if ne $n (int .Values.replicas) -}}
{{- fail (printf "advertise.loadBalancer.addresses: %d addresses for %d replicas: give one IP per pod (pod i advertises the i-th, its Service's)" $n (int .Values.replicas)) -}}
{{- end -}}
{{- if gt (len .Values.advertise.loadBalancer.podAnnotations) $n -}}
{{- fail "advertise.loadBalancer.podAnnotations: more entries than pods" -}}
{{- end -}}
{{- end -}}
{{- end -}}

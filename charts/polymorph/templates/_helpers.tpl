{{/*
Names, labels, the operator's command line, and the one RBAC table of the chart.
*/}}

{{- define "polymorph.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "polymorph.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "polymorph.selectorLabels" -}}
app.kubernetes.io/name: {{ include "polymorph.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "polymorph.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "polymorph.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: polymorph
{{- end }}

{{- define "polymorph.serviceAccountName" -}}
{{- default (include "polymorph.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{- define "polymorph.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Whether kopf peering is on: a standby replica needs it. */}}
{{- define "polymorph.peering" -}}
{{- if gt (int .Values.replicas) 1 }}true{{ end }}
{{- end }}

{{/*
The RBAC table: every API permission the operator uses, in one place. Each row says where it is
granted:
  watched       in each watched namespace (a Role each), or cluster-wide when watching all;
  cluster       always cluster-wide (cluster-scoped resources);
  clusterWide   only when the operator watches the whole cluster;
  peering       kopf peering, only when replicas > 1 (namespaced or cluster-wide, as the mode).
No row holds a wildcard; tests/charts compares the rendered roles with this list and with the
operator's recorded API calls.
*/}}
{{- define "polymorph.rbacTable" -}}
- where: watched
  apiGroups: [polymorph.dev]
  resources: [modeldeployments]
  verbs: [get, list, watch, patch]
# The fleet drift loop opens CompileJobs.
- where: watched
  apiGroups: [polymorph.dev]
  resources: [compilejobs]
  verbs: [get, list, watch, create, patch]
- where: watched
  apiGroups: [polymorph.dev]
  resources: [modeldeployments/status, compilejobs/status]
  verbs: [get, patch]
- where: watched
  apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
- where: watched
  apiGroups: [""]
  resources: [services, configmaps]
  verbs: [get, list, watch, create, patch, delete]
- where: watched
  apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, patch, delete]
- where: watched
  apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- where: watched
  apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- where: watched
  apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
- where: cluster
  apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get, list, watch]
- where: clusterWide
  apiGroups: [""]
  resources: [namespaces]
  verbs: [get, list, watch]
- where: peering
  apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  clusterResources: [clusterkopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}

{{/*
The rules of one role, from the table. Call with (dict "root" $ "scope" "cluster"|"namespace"|"crds"):
  cluster     the ClusterRole when watching all namespaces: every row;
  namespace   the Role in one watched namespace: watched rows and namespaced peering;
  crds        the ClusterRole when watching a list of namespaces: cluster rows only.
*/}}
{{- define "polymorph.rbacRules" -}}
{{- $root := .root }}
{{- $scope := .scope }}
{{- $peering := include "polymorph.peering" $root }}
{{- range (include "polymorph.rbacTable" $root | fromYamlArray) }}
{{- $resources := .resources }}
{{- if and (eq .where "peering") (eq $scope "cluster") }}{{ $resources = .clusterResources }}{{ end }}
{{- $in := or
  (and (eq .where "watched") (ne $scope "crds"))
  (and (eq .where "cluster") (ne $scope "namespace"))
  (and (eq .where "clusterWide") (eq $scope "cluster"))
  (and (eq .where "peering") $peering (ne $scope "crds")) }}
{{- if $in }}
- apiGroups: {{ toJson .apiGroups }}
  resources: {{ toJson $resources }}
  verbs: {{ toJson .verbs }}
{{- end }}
{{- end }}
{{- end }}

{{/* The operator's arguments after `polymorph operator`. */}}
{{- define "polymorph.args" -}}
- operator
{{- if .Values.watchNamespaces }}
{{- range .Values.watchNamespaces }}
- --namespace
- {{ . | quote }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
{{- if not (include "polymorph.peering" .) }}
- --standalone
{{- end }}
- --metrics-port
- {{ .Values.ports.metrics | quote }}
- --health-port
- {{ .Values.ports.health | quote }}
{{- end }}

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

{{/* The operator image and the engine image (sandbox pods): repository:tag, the tag defaulting to appVersion. */}}
{{- define "polymorph.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "polymorph.engineImage" -}}
{{- printf "%s:%s" .Values.engineImage.repository (default .Chart.AppVersion .Values.engineImage.tag) }}
{{- end }}

{{/* Whether kopf peering is on: a standby replica needs it. */}}
{{- define "polymorph.peering" -}}
{{- if gt (int .Values.replicas) 1 }}true{{ end }}
{{- end }}

{{/*
The RBAC table: every API permission the operator uses, and no other, in one place. Each row
says where it is granted:
  watched       in each watched namespace (a Role each), or cluster-wide when watching all;
  clusterWide   only when the operator watches the whole cluster (kopf scans the CRDs then;
                with a list of namespaces it scans nothing, so nothing is cluster-scoped);
  peering       kopf peering, only when replicas > 1 (namespaced or cluster-wide, as the mode).
No row holds a wildcard. tests/operator runs the operator on the real control plane and checks
its calls, as the API server's audit log records them, against the rendered roles: every call
granted, and every granted verb used, except those a row lists under `unexercised` with the
reason (the templates ignore that key).
*/}}
{{- define "polymorph.rbacTable" -}}
# get: a CompileJob reads its deployment. patch: kopf's finalizer (the timers need one).
- where: watched
  apiGroups: [polymorph.dev]
  resources: [modeldeployments]
  verbs: [get, list, watch, patch]
# create: the fleet drift loop opens CompileJobs. patch: kopf's finalizer.
- where: watched
  apiGroups: [polymorph.dev]
  resources: [compilejobs]
  verbs: [list, watch, create, patch]
# kopf's progress and the operator's status are merge-patches of the status subresource.
- where: watched
  apiGroups: [polymorph.dev]
  resources: [modeldeployments/status, compilejobs/status]
  verbs: [patch]
# The stable and canary Deployments: watched (an index), made, scaled, and the canary removed.
- where: watched
  apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
# The Service of a deployment and the ConfigMap of a CompileJob. Deleting their owner removes
# them (owner references, the garbage collector); the operator never deletes them itself.
- where: watched
  apiGroups: [""]
  resources: [services, configmaps]
  verbs: [get, create, patch]
  unexercised:
    patch: apply() merge-patches a Service or ConfigMap that differs from its desired form (a changed engine port or CompileJob spec); the scenario never changes one after it is made
# The sandbox Job of a CompileJob (made again if it is lost; removed with its CompileJob).
- where: watched
  apiGroups: [batch]
  resources: [jobs]
  verbs: [get, create, patch]
  unexercised:
    patch: apply() merge-patches a Job whose labels or annotations differ from the desired ones; the scenario makes each Job once
# The sandbox Job's pods, read while it has any: a pod that cannot be scheduled (or pull its
# image) makes the CompileJob Pending with the scheduler's reason, not "Running".
- where: watched
  apiGroups: [""]
  resources: [pods]
  verbs: [list]
# An Event for every decision (core/v1; kopf posts none: its log-line Events are off).
- where: watched
  apiGroups: [""]
  resources: [events]
  verbs: [create]
- where: clusterWide
  apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
# kopf keeps each replica's priority and lifetime in the peering object's status.
- where: peering
  apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  clusterResources: [clusterkopfpeerings]
  verbs: [list, watch, patch]
{{- end }}

{{/*
The rules of one role, from the table. Call with (dict "root" $ "scope" "cluster"|"namespace"):
  cluster     the ClusterRole when watching all namespaces: every row;
  namespace   the Role in one watched namespace: watched rows and namespaced peering.
*/}}
{{- define "polymorph.rbacRules" -}}
{{- $root := .root }}
{{- $scope := .scope }}
{{- $peering := include "polymorph.peering" $root }}
{{- range (include "polymorph.rbacTable" $root | fromYamlArray) }}
{{- $resources := .resources }}
{{- if and (eq .where "peering") (eq $scope "cluster") }}{{ $resources = .clusterResources }}{{ end }}
{{- $in := or
  (eq .where "watched")
  (and (eq .where "clusterWide") (eq $scope "cluster"))
  (and (eq .where "peering") $peering) }}
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

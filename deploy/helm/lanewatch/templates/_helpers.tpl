{{- define "lanewatch.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "lanewatch.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "lanewatch.labels" -}}
{{ include "lanewatch.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- define "lanewatch.checkMode" -}}
{{- if not (has .Values.mode (list "daemonset" "sidecar")) -}}
{{- fail (printf "mode %q: want daemonset or sidecar" .Values.mode) -}}
{{- end -}}
{{- end -}}

{{/* The agent's container, in either mode. */}}
{{- define "lanewatch.agentContainer" -}}
{{- $daemonset := eq .Values.mode "daemonset" -}}
name: lanewatch
image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
imagePullPolicy: {{ .Values.image.pullPolicy }}
args:
  - run
  - --output={{ .Values.output }}
  - --memory-limit=$(LANEWATCH_MEMORY_LIMIT)
  - --web.listen-address=:{{ .Values.ports.metrics }}
  {{- if $daemonset }}
  - --path.sysfs=/host/sys
  - --path.rootfs=/proc/1/root
  - --otlp.grpc-listen=:{{ .Values.ports.otlpGRPC }}
  - --otlp.http-listen=:{{ .Values.ports.otlpHTTP }}
  {{- else }}
  - --otlp.grpc-listen=127.0.0.1:{{ .Values.ports.otlpGRPC }}
  - --otlp.http-listen=127.0.0.1:{{ .Values.ports.otlpHTTP }}
  {{- end }}
  {{- range .Values.extraArgs }}
  - {{ . | quote }}
  {{- end }}
env:
  - name: LANEWATCH_MEMORY_LIMIT   # the container's memory limit, in bytes: the agent's ceiling
    valueFrom:
      resourceFieldRef:
        containerName: lanewatch
        resource: limits.memory
  {{- if $daemonset }}
  - name: NVIDIA_VISIBLE_DEVICES
    value: {{ .Values.nvidia.visibleDevices | quote }}
  - name: NVIDIA_DRIVER_CAPABILITIES   # utility: NVML and DCGM, no compute
    value: utility
  {{- end }}
  {{- with .Values.otlp.upstream }}
  - name: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
    value: {{ . | quote }}
  - name: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
    value: {{ $.Values.otlp.protocol | quote }}
  - name: OTEL_EXPORTER_OTLP_TRACES_INSECURE
    value: {{ $.Values.otlp.insecure | quote }}
  {{- end }}
  - name: K8S_NODE_NAME
    valueFrom:
      fieldRef:
        fieldPath: spec.nodeName
  - name: K8S_POD_NAME
    valueFrom:
      fieldRef:
        fieldPath: metadata.name
  - name: OTEL_RESOURCE_ATTRIBUTES
    value: k8s.node.name=$(K8S_NODE_NAME),k8s.pod.name=$(K8S_POD_NAME)
  {{- with .Values.extraEnv }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
ports:
  - name: metrics
    containerPort: {{ .Values.ports.metrics }}
  {{- if $daemonset }}
  - name: otlp-grpc
    containerPort: {{ .Values.ports.otlpGRPC }}
  - name: otlp-http
    containerPort: {{ .Values.ports.otlpHTTP }}
  {{- end }}
# Beside a server (sidecar) no readiness probe: the pod's readiness is the server's,
# never taken away by a burst of dropped events.
livenessProbe:       # alive: the process serves HTTP
  httpGet:
    path: /healthz
    port: metrics
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
{{- if $daemonset }}
readinessProbe:      # ready: probes attached, reader running, drops under the threshold
  httpGet:
    path: /readyz
    port: metrics
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
{{- end }}
resources:
  {{- toYaml .Values.resources | nindent 2 }}
securityContext:
  privileged: false
  # The image's user. Kubernetes gives a non-root process no ambient
  # capabilities: the agent's come from the file capabilities of the image's
  # /agent (permitted only; it raises them itself), bounded by the set
  # below. allowPrivilegeEscalation: false (no_new_privs) keeps file
  # capabilities only where the runtime's launching process already holds
  # them (cmd/agent TestRunFileCapabilities: from a launcher without them,
  # all five missing), so it stays true; escalation beyond the set below
  # is still impossible.
  allowPrivilegeEscalation: true
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  readOnlyRootFilesystem: true
  seccompProfile:
    {{- toYaml .Values.seccompProfile | nindent 4 }}
  # The minimum found by test (cmd/agent/caps_test.go, docs/operating.md "Privileges"): not root,
  # not SYS_ADMIN; on kernels before 5.11 add SYS_RESOURCE (the BPF memlock limit).
  capabilities:
    drop: [ALL]
    add:
      - BPF                 # load the BPF programs, maps and ring buffer
      - PERFMON             # attach uprobes and tracepoints (perf events)
      - SYS_PTRACE          # read other users' /proc/PID/maps, /proc/PID/root and their libraries
      - DAC_READ_SEARCH     # read /proc/PID/environ (mode 0400): CUDA_VISIBLE_DEVICES, so the GPU
      - CHECKPOINT_RESTORE  # open /proc/PID/map_files: a library replaced on disk since it was mapped
{{- if $daemonset }}
volumeMounts:
  - name: host-sys   # GPU placement, link capacity, RDMA ports of the host (--path.sysfs)
    mountPath: /host/sys
    readOnly: true
{{- end }}
{{- end -}}

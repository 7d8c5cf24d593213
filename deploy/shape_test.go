package deploy

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// objects renders the chart in mode with extra values and decodes every object.
func objects(t *testing.T, mode string, values map[string]any) []any {
	t.Helper()
	ch, err := Chart(".")
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]any{"mode": mode}
	for k, v := range values {
		vals[k] = v
	}
	files, err := Render(ch, vals)
	if err != nil {
		t.Fatal(err)
	}
	var objs []any
	for name, text := range files {
		objs = append(objs, decodeAll(t, mode+"/"+name, text)...)
	}
	return objs
}

func find[T any](t *testing.T, objs []any) T {
	t.Helper()
	var found []T
	for _, o := range objs {
		if v, ok := o.(T); ok {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("%d objects of type %T, want 1", len(found), zero)
	}
	return found[0]
}

// podOf is the pod template of the mode's workload.
func podOf(t *testing.T, mode string, objs []any) corev1.PodTemplateSpec {
	t.Helper()
	if mode == "daemonset" {
		return find[*appsv1.DaemonSet](t, objs).Spec.Template
	}
	return find[*appsv1.Deployment](t, objs).Spec.Template
}

func container(t *testing.T, pod corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range pod.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

// flagValue is the value of --name=value in args ("" and false if absent).
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// testedCapabilities are the capabilities docs/operating.md's setpriv example grants:
// the minimum cmd/agent/caps_test.go found.
func testedCapabilities(t *testing.T) []corev1.Capability {
	t.Helper()
	readme, err := os.ReadFile("../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`--ambient-caps (\S+)`).FindSubmatch(readme)
	if m == nil {
		t.Fatal("docs/operating.md: no setpriv --ambient-caps example")
	}
	var caps []corev1.Capability
	for _, c := range strings.Split(string(m[1]), ",") {
		caps = append(caps, corev1.Capability(strings.ToUpper(strings.TrimPrefix(c, "+"))))
	}
	slices.Sort(caps)
	return caps
}

// imageUser is the user and group the image runs as (Containerfile's USER).
func imageUser(t *testing.T) (int64, int64) {
	t.Helper()
	b, err := os.ReadFile("../Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^USER (\d+):(\d+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("Containerfile: no numeric USER uid:gid")
	}
	uid, _ := strconv.ParseInt(string(m[1]), 10, 64)
	gid, _ := strconv.ParseInt(string(m[2]), 10, 64)
	return uid, gid
}

// imageFileCaps are the file capabilities the image's /agent carries
// (scripts/image/build.sh), as the names capabilities.add takes.
func imageFileCaps(t *testing.T) []corev1.Capability {
	t.Helper()
	b, err := os.ReadFile("../scripts/image/build.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^caps=(\S+)=p$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("scripts/image/build.sh: no caps=…=p (permitted only)")
	}
	var caps []corev1.Capability
	for _, c := range strings.Split(string(m[1]), ",") {
		caps = append(caps, corev1.Capability(strings.ToUpper(strings.TrimPrefix(c, "cap_"))))
	}
	slices.Sort(caps)
	return caps
}

// checkAgentSecurity: the agent is not privileged, runs as the image's
// user, and has exactly the capabilities the agent was tested with, which
// are the image's file capabilities (Kubernetes gives a non-root process
// no ambient ones); escalation stays allowed, or no_new_privs could take
// the file capabilities away.
func checkAgentSecurity(t *testing.T, mode string, c corev1.Container) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil || sc.Privileged == nil || *sc.Privileged || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot ||
		sc.RunAsUser == nil || *sc.RunAsUser == 0 || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Fatalf("%s: agent security context %+v: want privileged false, non-root, read-only root", mode, sc)
	}
	if uid, gid := imageUser(t); sc.RunAsGroup == nil || *sc.RunAsUser != uid || *sc.RunAsGroup != gid {
		t.Errorf("%s: runAsUser %d runAsGroup %s: want the image's user %d:%d (Containerfile)", mode, *sc.RunAsUser, fmt.Sprint(deref(sc.RunAsGroup)), uid, gid)
	}
	if sc.AllowPrivilegeEscalation == nil || !*sc.AllowPrivilegeEscalation {
		t.Errorf("%s: allowPrivilegeEscalation %v: want true (no_new_privs may drop the image's file capabilities)", mode, sc.AllowPrivilegeEscalation)
	}
	if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: seccompProfile %+v: want RuntimeDefault", mode, sc.SeccompProfile)
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Fatalf("%s: capabilities %+v: want drop [ALL]", mode, sc.Capabilities)
	}
	added := slices.Clone(sc.Capabilities.Add)
	slices.Sort(added)
	if want := testedCapabilities(t); !slices.Equal(added, want) {
		t.Errorf("%s: capabilities added %v, want the tested minimum %v", mode, added, want)
	}
	if file := imageFileCaps(t); !slices.Equal(added, file) {
		t.Errorf("%s: capabilities added %v, the image's file capabilities %v: want the same", mode, added, file)
	}
}

// TestLocalhostSeccomp: seccompProfile from the values reaches the agent's
// container as given (docs/deploy.md: the Localhost profile installed on nodes).
func TestLocalhostSeccomp(t *testing.T) {
	for _, mode := range Modes {
		objs := objects(t, mode, map[string]any{"seccompProfile": map[string]any{"type": "Localhost", "localhostProfile": "lanewatch.json"}})
		sc := container(t, podOf(t, mode, objs).Spec, "lanewatch").SecurityContext
		if p := sc.SeccompProfile; p == nil || p.Type != corev1.SeccompProfileTypeLocalhost || p.LocalhostProfile == nil || *p.LocalhostProfile != "lanewatch.json" {
			t.Errorf("%s: seccompProfile %+v: want Localhost lanewatch.json", mode, p)
		}
	}
}

// checkProbesAndMemory: liveness on /healthz and (DaemonSet) readiness on
// /readyz at the metrics port the agent listens on; the memory limit is passed to
// --memory-limit and leaves the measured peak room.
func checkProbesAndMemory(t *testing.T, mode string, c corev1.Container) {
	t.Helper()
	listen, _ := flagValue(c.Args, "web.listen-address")
	var metricsPort int32
	for _, p := range c.Ports {
		if p.Name == "metrics" {
			metricsPort = p.ContainerPort
		}
	}
	if metricsPort == 0 || !strings.HasSuffix(listen, ":"+itoa(metricsPort)) || strings.HasPrefix(listen, "127.") {
		t.Errorf("%s: --web.listen-address %q, metrics port %d: the kubelet and Prometheus must reach it", mode, listen, metricsPort)
	}
	probes := []struct {
		probe *corev1.Probe
		path  string
	}{{c.LivenessProbe, "/healthz"}, {c.ReadinessProbe, "/readyz"}}
	if mode == "sidecar" {
		// The pod's readiness is the server's: the agent's drops must not take it away.
		if c.ReadinessProbe != nil {
			t.Errorf("sidecar: the agent has a readiness probe, which would take the server out of its Service")
		}
		probes = probes[:1]
	}
	for _, p := range probes {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "metrics" {
			t.Errorf("%s: want an HTTP probe on %s at port metrics, got %+v", mode, p.path, p.probe)
		}
	}
	limit, ok := c.Resources.Limits[corev1.ResourceMemory]
	if !ok {
		t.Fatalf("%s: no memory limit", mode)
	}
	if _, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
		t.Errorf("%s: a CPU limit throttles the reader into dropping events", mode)
	}
	measuredPeak := resource.MustParse("114Mi") // make rss: docs/measurements.md, "Agent memory"
	request := c.Resources.Requests[corev1.ResourceMemory]
	if request.Cmp(measuredPeak) <= 0 || limit.Cmp(request) < 0 {
		t.Errorf("%s: memory request %s, limit %s: want the request above the measured peak %s, the limit above the request", mode, &request, &limit, &measuredPeak)
	}
	// The agent refuses a ceiling leaving the Go heap under 64 MiB once the
	// ring (4 MiB, twice) and 64 MiB for C libraries are taken.
	if minimum := resource.MustParse("136Mi"); limit.Cmp(minimum) < 0 {
		t.Errorf("%s: memory limit %s under the agent's minimum %s", mode, &limit, &minimum)
	}
	v, _ := flagValue(c.Args, "memory-limit")
	env, ok := strings.CutPrefix(v, "$(")
	env, _ = strings.CutSuffix(env, ")")
	var ref *corev1.ResourceFieldSelector
	for _, e := range c.Env {
		if e.Name == env && e.ValueFrom != nil {
			ref = e.ValueFrom.ResourceFieldRef
		}
	}
	if !ok || ref == nil || ref.Resource != "limits.memory" || ref.ContainerName != c.Name || !ref.Divisor.IsZero() {
		t.Errorf("%s: --memory-limit=%s is not the container's memory limit in bytes (env %q: %+v)", mode, v, env, ref)
	}
}

func itoa(n int32) string { return resource.NewQuantity(int64(n), resource.DecimalSI).String() }

func TestDaemonSet(t *testing.T) {
	objs := objects(t, "daemonset", nil)
	pod := podOf(t, "daemonset", objs)
	spec := pod.Spec
	if !spec.HostPID || spec.HostNetwork || spec.HostIPC || spec.ShareProcessNamespace != nil {
		t.Errorf("hostPID %v hostNetwork %v hostIPC %v: want the host's PID namespace only", spec.HostPID, spec.HostNetwork, spec.HostIPC)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("the service account token is mounted: the agent never calls the API server")
	}
	if spec.NodeSelector["nvidia.com/gpu.present"] != "true" {
		t.Errorf("nodeSelector %v: want nvidia.com/gpu.present=true", spec.NodeSelector)
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tl corev1.Toleration) bool {
		return tl.Key == "nvidia.com/gpu" && tl.Effect == corev1.TaintEffectNoSchedule && tl.Operator == corev1.TolerationOpExists
	}) {
		t.Errorf("tolerations %+v: want nvidia.com/gpu NoSchedule", spec.Tolerations)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want the agent alone", len(spec.Containers))
	}
	c := container(t, spec, "lanewatch")
	checkAgentSecurity(t, "daemonset", c)
	checkProbesAndMemory(t, "daemonset", c)
	if v, _ := flagValue(c.Args, "path.sysfs"); v != "/host/sys" {
		t.Errorf("--path.sysfs=%q, want the host's /sys mounted at /host/sys", v)
	}
	var hostPaths []string
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths = append(hostPaths, v.HostPath.Path)
			if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == v.Name && m.MountPath == "/host/sys" }) {
				t.Errorf("host path %s is not mounted at --path.sysfs /host/sys", v.HostPath.Path)
			}
		}
	}
	if !slices.Equal(hostPaths, []string{"/sys"}) {
		t.Errorf("host paths %v: want /sys alone (/proc is the host's through hostPID)", hostPaths)
	}
	for _, m := range c.VolumeMounts {
		if !m.ReadOnly {
			t.Errorf("volume %s mounted writable at %s", m.Name, m.MountPath)
		}
	}
	for _, flag := range []string{"otlp.grpc-listen", "otlp.http-listen"} {
		if v, _ := flagValue(c.Args, flag); !strings.HasPrefix(v, ":") {
			t.Errorf("--%s=%q: the node's servers reach the agent through its Service, not on loopback", flag, v)
		}
	}
}

func TestSidecar(t *testing.T) {
	objs := objects(t, "sidecar", nil)
	spec := podOf(t, "sidecar", objs).Spec
	if spec.ShareProcessNamespace == nil || !*spec.ShareProcessNamespace || spec.HostPID || spec.HostNetwork {
		t.Errorf("shareProcessNamespace %v hostPID %v hostNetwork %v: want the pod's PID namespace shared, nothing of the host's",
			spec.ShareProcessNamespace, spec.HostPID, spec.HostNetwork)
	}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			t.Errorf("sidecar mounts host path %s", v.HostPath.Path)
		}
	}
	agent := container(t, spec, "lanewatch")
	server := container(t, spec, "sglang")
	checkAgentSecurity(t, "sidecar", agent)
	checkProbesAndMemory(t, "sidecar", agent)
	listen, _ := flagValue(agent.Args, "otlp.grpc-listen")
	endpoint, _ := flagValue(server.Args, "otlp-traces-endpoint")
	if !strings.HasPrefix(listen, "127.0.0.1:") || endpoint != listen {
		t.Errorf("server --otlp-traces-endpoint=%q, agent --otlp.grpc-listen=%q: want the agent's loopback receiver", endpoint, listen)
	}
	if !slices.Contains(server.Args, "--enable-trace") {
		t.Error("the server's tracing is off")
	}
	for _, e := range server.Env {
		if e.Name == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" && e.Value != "http://"+listen {
			t.Errorf("server OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=%q, want http://%s", e.Value, listen)
		}
	}
	if gpus := server.Resources.Limits["nvidia.com/gpu"]; gpus.IsZero() {
		t.Error("the server asks for no GPU")
	}
}

// TestUpstream: otlp.upstream becomes the agent's OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
// in both modes; without it no endpoint is set (forwarding off).
func TestUpstream(t *testing.T) {
	const upstream = "http://otel-collector.observability:4317"
	for _, mode := range Modes {
		for _, want := range []string{"", upstream} {
			objs := objects(t, mode, map[string]any{"otlp": map[string]any{"upstream": want}})
			c := container(t, podOf(t, mode, objs).Spec, "lanewatch")
			got := ""
			for _, e := range c.Env {
				if e.Name == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" {
					got = e.Value
				}
			}
			if got != want {
				t.Errorf("%s, otlp.upstream %q: agent OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=%q", mode, want, got)
			}
		}
	}
}

// TestServiceReachesAgent: the Service selects the workload's pods, each
// target port is a port of theirs, and the ServiceMonitor selects the
// Service and scrapes its metrics port.
func TestServiceReachesAgent(t *testing.T) {
	for _, mode := range Modes {
		objs := objects(t, mode, nil)
		pod := podOf(t, mode, objs)
		svc := find[*corev1.Service](t, objs)
		sm := find[*monitoringv1.ServiceMonitor](t, objs)
		if !selects(svc.Spec.Selector, pod.Labels) {
			t.Errorf("%s: Service selector %v does not select the pods %v", mode, svc.Spec.Selector, pod.Labels)
		}
		var podPorts []string
		for _, c := range pod.Spec.Containers {
			for _, p := range c.Ports {
				podPorts = append(podPorts, p.Name)
			}
		}
		var svcPorts []string
		for _, p := range svc.Spec.Ports {
			svcPorts = append(svcPorts, p.Name)
			if !slices.Contains(podPorts, p.TargetPort.String()) {
				t.Errorf("%s: Service port %s targets %s, not a pod port %v", mode, p.Name, p.TargetPort.String(), podPorts)
			}
		}
		if !selects(sm.Spec.Selector.MatchLabels, svc.Labels) {
			t.Errorf("%s: ServiceMonitor selector %v does not select the Service %v", mode, sm.Spec.Selector.MatchLabels, svc.Labels)
		}
		if len(sm.Spec.Endpoints) != 1 || !slices.Contains(svcPorts, sm.Spec.Endpoints[0].Port) || sm.Spec.Endpoints[0].Path != "/metrics" {
			t.Errorf("%s: ServiceMonitor endpoints %+v: want /metrics on a Service port %v", mode, sm.Spec.Endpoints, svcPorts)
		}
	}
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// checkObject checks what strict decoding cannot: the object's name,
// namespace and labels are valid, and a workload's pod template is
// consistent (selector, names, probe ports, mounts).
func checkObject(t *testing.T, where string, obj any) {
	t.Helper()
	var meta metav1.ObjectMeta
	var pod *corev1.PodTemplateSpec
	var selector *metav1.LabelSelector
	switch o := obj.(type) {
	case *appsv1.DaemonSet:
		meta, pod, selector = o.ObjectMeta, &o.Spec.Template, o.Spec.Selector
	case *appsv1.Deployment:
		meta, pod, selector = o.ObjectMeta, &o.Spec.Template, o.Spec.Selector
	case *corev1.Service:
		meta = o.ObjectMeta
	case *corev1.ConfigMap:
		meta = o.ObjectMeta
	case *monitoringv1.ServiceMonitor:
		meta = o.ObjectMeta
	case *monitoringv1.PrometheusRule:
		meta = o.ObjectMeta
	}
	if errs := validation.IsDNS1123Subdomain(meta.Name); len(errs) > 0 {
		t.Errorf("%s: name %q: %v", where, meta.Name, errs)
	}
	if meta.Namespace != Namespace {
		t.Errorf("%s: %s in namespace %q, want %q", where, meta.Name, meta.Namespace, Namespace)
	}
	checkLabels(t, where, meta.Labels)
	if pod == nil {
		return
	}
	checkLabels(t, where, pod.Labels)
	if selector == nil || !selects(selector.MatchLabels, pod.Labels) {
		t.Errorf("%s: selector %v does not select its own pods %v", where, selector, pod.Labels)
	}
	volumes := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = true
	}
	for _, c := range pod.Spec.Containers {
		checkContainer(t, where, c, volumes)
	}
}

func checkLabels(t *testing.T, where string, labels map[string]string) {
	t.Helper()
	for k, v := range labels {
		if errs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(errs) > 0 {
			t.Errorf("%s: label %s=%s: %v", where, k, v, errs)
		}
	}
}

func checkContainer(t *testing.T, where string, c corev1.Container, volumes map[string]bool) {
	t.Helper()
	if errs := validation.IsDNS1123Label(c.Name); len(errs) > 0 {
		t.Errorf("%s: container %q: %v", where, c.Name, errs)
	}
	ports := map[string]bool{}
	for _, p := range c.Ports {
		if errs := validation.IsValidPortName(p.Name); len(errs) > 0 || ports[p.Name] {
			t.Errorf("%s: container %s port name %q: %v (or given twice)", where, c.Name, p.Name, errs)
		}
		ports[p.Name] = true
	}
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
		if p != nil && p.HTTPGet != nil && !ports[p.HTTPGet.Port.String()] {
			t.Errorf("%s: container %s probes port %s, not one of its ports", where, c.Name, p.HTTPGet.Port.String())
		}
	}
	for _, e := range c.Env {
		if errs := validation.IsEnvVarName(e.Name); len(errs) > 0 {
			t.Errorf("%s: container %s env %q: %v", where, c.Name, e.Name, errs)
		}
	}
	for _, m := range c.VolumeMounts {
		if !volumes[m.Name] {
			t.Errorf("%s: container %s mounts volume %s, which the pod does not have", where, c.Name, m.Name)
		}
	}
}

// TestWithoutOperator: with the ServiceMonitor, PrometheusRule and dashboard
// off (a cluster without the Prometheus Operator) only the workload and its
// Service are rendered.
func TestWithoutOperator(t *testing.T) {
	off := map[string]any{"enabled": false}
	for _, mode := range Modes {
		objs := objects(t, mode, map[string]any{"serviceMonitor": off, "prometheusRule": off, "dashboard": off})
		if len(objs) != 2 {
			t.Errorf("mode %s: %d objects, want the workload and its Service", mode, len(objs))
		}
		podOf(t, mode, objs)
		find[*corev1.Service](t, objs)
	}
}

// deref is *p, or nil.
func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

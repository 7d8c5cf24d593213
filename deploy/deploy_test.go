package deploy

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// newObject returns an empty object of the Go type for apiVersion and kind:
// every kind the chart may render, nothing else.
func newObject(apiVersion, kind string) (any, error) {
	switch apiVersion + " " + kind {
	case "apps/v1 DaemonSet":
		return &appsv1.DaemonSet{}, nil
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, nil
	case "v1 Service":
		return &corev1.Service{}, nil
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}, nil
	case "monitoring.coreos.com/v1 PrometheusRule":
		return &monitoringv1.PrometheusRule{}, nil
	}
	return nil, fmt.Errorf("no Go type for apiVersion %q kind %q", apiVersion, kind)
}

// decodeStrict decodes one YAML document into its typed object: a field
// the type does not have, or one given twice, is an error.
func decodeStrict(doc string) (any, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
		return nil, err
	}
	obj, err := newObject(tm.APIVersion, tm.Kind)
	if err != nil {
		return nil, err
	}
	if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
		return nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	return obj, nil
}

func decodeAll(t *testing.T, where, stream string) []any {
	t.Helper()
	var objs []any
	for i, doc := range Documents(stream) {
		obj, err := decodeStrict(doc)
		if err != nil {
			t.Errorf("%s, document %d: %v", where, i+1, err)
			continue
		}
		objs = append(objs, obj)
	}
	if len(objs) == 0 {
		t.Errorf("%s: no objects", where)
	}
	return objs
}

func loadChart(t *testing.T) map[string]map[string]string {
	t.Helper()
	ch, err := Chart(".")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]string{}
	for _, mode := range Modes {
		if out[mode], err = Render(ch, map[string]any{"mode": mode}); err != nil {
			t.Fatalf("mode %s: %v", mode, err)
		}
	}
	return out
}

func TestDecodeStrictRejects(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"unknown field", "apiVersion: v1\nkind: Service\nspec:\n  selectr: {a: b}\n", `unknown field "selectr"`},
		{"unknown nested field", "apiVersion: apps/v1\nkind: DaemonSet\nspec:\n  template:\n    spec:\n      containers: [{name: a, securityContext: {privilegd: false}}]\n", "privilegd"},
		{"duplicate field", "apiVersion: v1\nkind: ConfigMap\ndata: {a: b}\ndata: {c: d}\n", "already set"},
		{"wrong type", "apiVersion: v1\nkind: Service\nspec:\n  ports: 9464\n", "cannot unmarshal"},
		{"unknown kind", "apiVersion: v1\nkind: Pod\n", `kind "Pod"`},
		{"CRD field misspelt", "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nspec:\n  endpoint: []\n", `unknown field "endpoint"`},
	} {
		_, err := decodeStrict(tc.doc)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

// TestChartRendersStrictly renders the chart in both modes and decodes
// every object strictly into its Kubernetes or prometheus-operator type,
// then checks what the types cannot: names, labels and port references.
func TestChartRendersStrictly(t *testing.T) {
	for mode, files := range loadChart(t) {
		var kinds []string
		for name, text := range files {
			for _, obj := range decodeAll(t, mode+"/"+name, text) {
				kinds = append(kinds, reflect.TypeOf(obj).Elem().Name())
				checkObject(t, mode+"/"+name, obj)
			}
		}
		slices.Sort(kinds)
		want := map[string][]string{
			"daemonset": {"ConfigMap", "DaemonSet", "PrometheusRule", "Service", "ServiceMonitor"},
			"sidecar":   {"ConfigMap", "Deployment", "PrometheusRule", "Service", "ServiceMonitor"},
		}[mode]
		if !slices.Equal(kinds, want) {
			t.Errorf("mode %s rendered %v, want %v", mode, kinds, want)
		}
	}
}

// TestManifestsDecodeStrictly decodes every plain manifest under kubernetes/.
func TestManifestsDecodeStrictly(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join(ManifestDir, "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no manifests in %s: %v", ManifestDir, err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, obj := range decodeAll(t, p, string(b)) {
			checkObject(t, p, obj)
		}
	}
}

func TestBadModeFails(t *testing.T) {
	ch, err := Chart(".")
	if err != nil {
		t.Fatal(err)
	}
	_, err = Render(ch, map[string]any{"mode": "deamonset"})
	if err == nil || !strings.Contains(err.Error(), `mode "deamonset": want daemonset or sidecar`) {
		t.Errorf("mode deamonset: err = %v", err)
	}
}

// TestGeneratedFilesCurrent fails when a generated file differs from what
// the chart and dashboards/ make now.
func TestGeneratedFilesCurrent(t *testing.T) {
	files, err := Generate(".")
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range files {
		got, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is stale (%v): run `make deploy-generate` and commit", p, err)
		}
	}
	if len(files) != 6 {
		t.Errorf("generated %d files, want 6", len(files))
	}
}

// TestPrometheusRuleIsRulesFile: the rendered PrometheusRule's groups are
// dashboards/lanewatch.rules.yml's, field for field (the rules file also
// decodes strictly into the operator's type, so nothing of it is dropped).
func TestPrometheusRuleIsRulesFile(t *testing.T) {
	rulesYAML, err := os.ReadFile(RulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var fromFile monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(rulesYAML, &fromFile); err != nil {
		t.Fatalf("%s: %v", RulesFile, err)
	}
	var generic map[string]any
	if err := yaml.Unmarshal(rulesYAML, &generic); err != nil {
		t.Fatal(err)
	}
	streams := map[string]string{}
	for mode, files := range loadChart(t) {
		streams["mode "+mode] = files["prometheusrule.yaml"]
	}
	plain, err := os.ReadFile(filepath.Join(ManifestDir, "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	streams[filepath.Join(ManifestDir, "prometheusrule.yaml")] = string(plain)
	for mode, stream := range streams {
		objs := decodeAll(t, mode, stream)
		if len(objs) != 1 {
			t.Fatalf("mode %s: %d PrometheusRules", mode, len(objs))
		}
		pr := objs[0].(*monitoringv1.PrometheusRule)
		if !reflect.DeepEqual(pr.Spec, fromFile) {
			t.Errorf("%s: PrometheusRule spec differs from %s", mode, RulesFile)
		}
		var rendered map[string]any
		if err := yaml.Unmarshal([]byte(Documents(stream)[0]), &rendered); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(rendered["spec"], generic) {
			t.Errorf("%s: PrometheusRule spec (as YAML) differs from %s", mode, RulesFile)
		}
	}
	if n := len(fromFile.Groups); n == 0 || len(fromFile.Groups[0].Rules) == 0 {
		t.Errorf("%s: %d groups, nothing compared", RulesFile, n)
	}
}

// TestDashboardConfigMapIsDashboard: the ConfigMap holds the dashboard's
// bytes, unchanged.
func TestDashboardConfigMapIsDashboard(t *testing.T) {
	want, err := os.ReadFile(DashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	for mode, files := range loadChart(t) {
		objs := decodeAll(t, mode, files["dashboard.yaml"])
		cm := objs[0].(*corev1.ConfigMap)
		if got := cm.Data["lanewatch.json"]; got != string(want) {
			t.Errorf("mode %s: ConfigMap lanewatch.json (%d bytes) is not %s (%d bytes)", mode, len(got), DashboardFile, len(want))
		}
	}
}

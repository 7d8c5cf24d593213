package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// collectorConfig is the part of an OpenTelemetry Collector configuration
// the test checks: the components and the pipelines naming them.
type collectorConfig struct {
	Receivers  map[string]any `json:"receivers"`
	Processors map[string]any `json:"processors"`
	Exporters  map[string]any `json:"exporters"`
	Service    struct {
		Pipelines map[string]struct {
			Receivers  []string `json:"receivers"`
			Processors []string `json:"processors"`
			Exporters  []string `json:"exporters"`
		} `json:"pipelines"`
	} `json:"service"`
}

// TestCollectorConfig: every component a pipeline names is configured, the
// traces pipeline takes OTLP and exports it, and the receiver listens on
// the port the chart's otlp.upstream example names.
func TestCollectorConfig(t *testing.T) {
	b, err := os.ReadFile("collector/otelcol.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c collectorConfig
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		t.Fatalf("collector/otelcol.yaml: %v", err)
	}
	traces, ok := c.Service.Pipelines["traces"]
	if !ok || len(traces.Receivers) == 0 || len(traces.Exporters) == 0 {
		t.Fatalf("no traces pipeline with receivers and exporters: %+v", c.Service.Pipelines)
	}
	for _, p := range c.Service.Pipelines {
		for kind, names := range map[string][]string{"receiver": p.Receivers, "processor": p.Processors, "exporter": p.Exporters} {
			defined := map[string]map[string]any{"receiver": c.Receivers, "processor": c.Processors, "exporter": c.Exporters}[kind]
			for _, n := range names {
				if _, ok := defined[n]; !ok {
					t.Errorf("pipeline names %s %q, which is not configured", kind, n)
				}
			}
		}
	}
	if !slices.Contains(traces.Receivers, "otlp") || !strings.Contains(string(b), "endpoint: 0.0.0.0:4317") {
		t.Error("the traces pipeline does not receive OTLP gRPC on 4317, where the agents send")
	}
}

// TestPrometheusConfig runs promtool on collector/prometheus.yml (and so on
// the rules file it loads).
func TestPrometheusConfig(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found (apt-get install prometheus)")
	}
	out, err := exec.Command(promtool, "check", "config", filepath.Join("collector", "prometheus.yml")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "SUCCESS: 1 rule files found") {
		t.Errorf("promtool check config: %v\n%s", err, out)
	}
}

package deploy

import (
	"testing"

	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
)

// TestHelmLint runs `helm lint --strict`'s checks (Helm's lint package) on
// the chart in both modes: Chart.yaml, values, every template rendered and
// its objects' names; any warning or error fails.
func TestHelmLint(t *testing.T) {
	for _, mode := range Modes {
		linter := lint.AllWithKubeVersion(ChartDir, map[string]any{"mode": mode}, Namespace, nil)
		for _, m := range linter.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("mode %s: %s", mode, m)
			} else {
				t.Logf("mode %s: %s", mode, m)
			}
		}
	}
}

package collectors

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseBehaviourEnv(t *testing.T) {
	for _, tc := range []struct {
		block string
		want  map[string]string
	}{
		{"PATH=/bin\x00CUDA_VISIBLE_DEVICES=2,3\x00SECRET_TOKEN=x\x00", map[string]string{"CUDA_VISIBLE_DEVICES": "2,3"}},
		{"CUDA_DEVICE_ORDER=PCI_BUS_ID\x00CUDA_VISIBLE_DEVICES=GPU-8a4f\x00CUDA_VISIBLE_DEVICES=1", // last wins, no final NUL
			map[string]string{"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1"}},
		{"CUDA_VISIBLE_DEVICES=\x00", map[string]string{"CUDA_VISIBLE_DEVICES": ""}}, // set but empty: no GPU at all
		{"CUDA_VISIBLE_DEVICES\x00=3\x00\x00", map[string]string{}},                  // no '=': skipped
		{"", map[string]string{}},
	} {
		if got := ParseBehaviourEnv([]byte(tc.block)); !maps.Equal(got, tc.want) {
			t.Errorf("%q: %v, want %v", tc.block, got, tc.want)
		}
	}
}

// This test's environment written as an environ file of a procfs fixture,
// and this process's real one: only the listed variables come back.
func TestReadBehaviourEnv(t *testing.T) {
	t.Setenv("CUDA_VISIBLE_DEVICES", "1,0")
	t.Setenv("LANEWATCH_TEST_SECRET", "do-not-read")
	dir := t.TempDir()
	env := []byte(strings.Join(os.Environ(), "\x00") + "\x00")
	pidDir := filepath.Join(dir, "4242")
	if err := os.MkdirAll(pidDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pidDir, "environ"), env, 0o400); err != nil {
		t.Fatal(err)
	}
	got, err := ReadBehaviourEnv(dir, 4242)
	if err != nil || got["CUDA_VISIBLE_DEVICES"] != "1,0" || len(got) != 1 {
		t.Errorf("%v %v", got, err)
	}
	if _, err := ReadBehaviourEnv(dir, 1); err == nil || !strings.Contains(err.Error(), "1/environ") {
		t.Errorf("missing process: %v", err)
	}
	if got, err := ReadBehaviourEnv("/proc", os.Getpid()); err != nil || got["LANEWATCH_TEST_SECRET"] != "" {
		t.Errorf("live: %v %v", got, err)
	}
}

func FuzzParseBehaviourEnv(f *testing.F) {
	f.Add([]byte("PATH=/bin\x00CUDA_VISIBLE_DEVICES=0\x00"))
	f.Add([]byte("=\x00\x00CUDA_DEVICE_ORDER"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for k := range ParseBehaviourEnv(b) {
			if k != "CUDA_VISIBLE_DEVICES" && k != "CUDA_DEVICE_ORDER" {
				t.Fatalf("kept %q", k)
			}
		}
	})
}

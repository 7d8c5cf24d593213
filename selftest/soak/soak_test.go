package soak

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/internal/testenv"
)

// The soak for a minute, as `make soak` runs it for ten: the agent binary
// (built from this tree) against the reference workload with churn,
// normal and hostile OTLP traffic, scrapes and a flapping upstream. Every
// record matches its truth, no drop, no growth after warm-up, a clean
// exit on SIGINT with no BPF link or program left.
func TestSoak(t *testing.T) {
	testenv.RequireRoot(t)
	refDir := testenv.RefDir(t)
	bin := filepath.Join(t.TempDir(), "agent")
	build := exec.Command("go", "build", "-o", bin, "github.com/lanewatch/lanewatch/cmd/agent")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var out, agentLog bytes.Buffer
	rep, err := Run(context.Background(), Config{AgentBin: bin, RefDir: refDir, Duration: time.Minute, Interval: 5 * time.Second,
		WarmUp: 15 * time.Second, Hostile: DefaultHostile, Out: &out, AgentLog: &agentLog,
		// make soak holds the exit to 2 s; here, among make test's other
		// packages, the limit only catches a hang (the time is printed).
		ExitLimit: 10 * time.Second})
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		if p := filepath.Join(os.TempDir(), "lanewatch-soak-test-agent.log"); os.WriteFile(p, agentLog.Bytes(), 0o644) == nil {
			t.Logf("the agent's log: %s", p)
		}
		t.Fatalf("soak failed: %d failures", len(rep.Failures))
	}
}

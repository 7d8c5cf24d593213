package agent_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/judge"
)

// A healthy decode loop with periodic layered loads (refpath decode-loop-loads:
// per step 4 small pageable metadata copies, 40 launches, a token read-back and
// one sync; every 20 steps 16 x 4 MiB from a pinned pool, an event per layer
// waited on by compute), traced with --kernels and judged as `agent run`
// judges a window, on a GPU whose link capacity is known: it raises no WARN
// nor FAIL. (Before issue 20 it raised pageable-copy FAIL, fragmented-copies
// WARN, host-sync-in-loop WARN and too-little-in-flight WARN.)
func TestEvaluatorDecodeLoopLoadsSilent(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	r := startAgent(t, agent.Config{Kernels: true,
		Libs: []string{filepath.Join(ref, "plain", "libcudart.so.12"), filepath.Join(ref, "lib", "libcuda.so.1")}})
	cmd := runScenario(t, ref, "decode-loop-loads", filepath.Join(t.TempDir(), "truth.jsonl"))
	pid := cmd.Process.Pid
	waitExit(t, r.col, pid)

	const gpu = "0000:3b:00.0" // a Gen4 x16 link: 25 GB/s each way
	place := func(p uint32) checks.Placement {
		if p != uint32(pid) {
			return checks.Placement{Why: "not the scenario's process"}
		}
		return checks.Placement{GPU: gpu, InboundGBs: 25, OutboundGBs: 25}
	}
	e := judge.NewEvaluator(judge.EvaluatorConfig{Interval: time.Second, Kernels: true, Place: place})
	start := time.Now()
	acts := r.col.TakeActivities(uint32(pid))
	for i := range acts {
		e.Activity(&acts[i])
	}
	got := r.col.Take(uint32(pid))
	for i := range got {
		e.Transfer(&got[i])
	}
	v := e.Evaluate(start.Add(time.Second))
	if len(got) == 0 || len(acts) == 0 {
		t.Fatalf("%d transfers, %d activities of pid %d", len(got), len(acts), pid)
	}
	for _, f := range v.Findings {
		line := string(f.Severity) + " " + f.Rule + " " + f.Subject + ": " + f.Summary + " [" + strings.Join(f.Evidence, "; ") + "]"
		if f.Severity == correlate.SevInfo {
			t.Log(line)
			continue
		}
		t.Error(line)
	}
}

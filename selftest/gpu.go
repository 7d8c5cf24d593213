package selftest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/judge"
	"github.com/lanewatch/lanewatch/selftest/refenv"
)

// GPUCountersLine says, once, where this host's GPU counters come from.
func GPUCountersLine() string {
	c, err := agent.OpenGPU(agent.GPUConfig{})
	if err != nil {
		return "GPU counters: unavailable (" + err.Error() + ")"
	}
	defer c.Close()
	return "GPU counters: " + c.Source()
}

// kernelCopyRun runs the kernel-copy scenario on a shared reference GPU and
// reads that GPU's counters through the reference NVML stand-in with the
// agent's real NVML code: the counters must match the lane model's bytes
// within 2%, and the bytes moved by SMs (the sgl-kernel stand-in's
// launches, whose bytes no probe states) must come out as unattributed
// traffic in the right direction, within 2%. Each launch must be a record
// moved by SMs with its kernel, stream, layer and GPU (CheckSMRecords), the
// evaluator must count them on both lanes of the GPU, and each layer's
// span must carry the request of the current-form SGLang spans covering it
// (smSpansCheck).
func kernelCopyRun(ctx context.Context, refDir, tmp string, col *Collector, cfg Config, drops lossCount) Result {
	res := Result{Scenario: "kernel-copy", Runtime: "nvml"}
	fail := func(format string, args ...any) Result {
		res.Problems = append(res.Problems, fmt.Sprintf(format, args...))
		return res
	}
	before := drops()
	gpu := fmt.Sprintf("selftest-%d", os.Getpid())
	truth := filepath.Join(tmp, "kernel-copy.jsonl")
	cmd := exec.CommandContext(ctx, filepath.Join(refDir, "bin", "kvpath"), "--scenario", "kernel-copy", "--truth", truth, "--hold")
	cmd.Env = append(os.Environ(), refenv.SharedGPU(gpu))
	cmd.Stderr = cfg.drivers()
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		return fail("start kernel-copy: %v", err)
	}
	defer os.Remove(refenv.LaneFile(gpu))
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || !strings.HasPrefix(line, "ready") {
		cmd.Process.Kill()
		cmd.Wait()
		return fail("kernel-copy did not get ready: %q %v", line, err)
	}
	go io.Copy(io.Discard, stdout)
	res.PID = uint32(cmd.Process.Pid)

	counters, err := agent.OpenGPU(agent.GPUConfig{Source: "nvml", NVMLLibrary: filepath.Join(refDir, "nvml", "libnvidia-ml.so.1")})
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return fail("reference NVML: %v", err)
	}
	defer counters.Close()
	s0, err0 := counters.Sample()
	name := refenv.NVMLName(gpu)
	ref := findGPU(s0, name)
	if err0 != nil || ref == nil {
		cmd.Process.Kill()
		cmd.Wait()
		return fail("the reference NVML shows no GPU %s: %v", name, err0)
	}
	// The selftest knows where it put the process: the evaluator is told
	// so through its placement, as production code is told by the host.
	lane := refenv.LaneGBs()
	placed := checks.Placement{GPU: ref.BusID, InboundGBs: lane, OutboundGBs: lane, Why: "reference GPU " + name}
	eval := judge.NewEvaluator(judge.EvaluatorConfig{Place: func(uint32) checks.Placement { return placed }, GPU: counters})
	start := time.Now()
	eval.Evaluate(start) // opens the window and takes the first counter snapshot

	io.WriteString(stdin, "go\n")
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		res.Problems = append(res.Problems, fmt.Sprintf("kernel-copy: %v", err))
	}
	if err := (&proc{pid: res.PID}).waitExit(col, cfg.Timeout); err != nil {
		res.Problems = append(res.Problems, err.Error())
	}
	got := col.Take(res.PID)
	for i := range got {
		eval.Transfer(&got[i])
	}
	sm, copies := splitSM(got)
	s1, err1 := counters.Sample()
	v := eval.Evaluate(time.Now())
	judgeDesigned(&res, "kernel-copy", v.Findings)
	res.Drops = drops(res.PID) - before
	if err0 != nil || err1 != nil {
		return fail("read counters: %v %v", err0, err1)
	}

	end, err := readKernelCopyEnd(truth)
	if err != nil {
		return fail("%v", err)
	}
	// The probed copies are checked like any scenario's.
	calls, err := ReadTruthFile(truth)
	if err != nil {
		return fail("%v", err)
	}
	Compare(&res, calls, copies)
	want := launches(calls)
	res.WantRecords += len(want)
	res.Got += len(sm)
	smProblems := CheckSMRecords(calls, sm)
	res.OtherErrs += len(smProblems)
	res.Problems = append(res.Problems, smProblems...)
	spanProblems, matched := smSpansCheck(ctx, calls, sm, cfg)
	res.OtherErrs += len(spanProblems)
	if len(spanProblems) > 5 {
		spanProblems = spanProblems[:5]
	}
	res.Problems = append(res.Problems, spanProblems...)

	rx, tx, ok := deltaOf(s0, s1, name)
	if !ok {
		return fail("the reference NVML shows no GPU %s", name)
	}
	within := func(what string, gotB, wantB float64) {
		if wantB == 0 || math.Abs(gotB-wantB) > 0.02*wantB {
			res.OtherErrs++
			res.Problems = append(res.Problems, fmt.Sprintf("%s: %.0f bytes, want %.0f (±2%%)", what, gotB, wantB))
		}
	}
	within("counter RX (host→device)", float64(rx), float64(end.Lane.H2D))
	within("counter TX (device→host)", float64(tx), float64(end.Lane.D2H))
	for _, l := range v.Lanes {
		if l.GPU != placed.GPU {
			continue
		}
		if l.SMTransfers != len(want) {
			res.OtherErrs++
			res.Problems = append(res.Problems, fmt.Sprintf("%s lane: %d SM transfers, the scenario launched %d", l.Direction, l.SMTransfers, len(want)))
		}
		if !l.HasMeasured {
			continue
		}
		unattributed := l.Unattributed * v.Window.Seconds()
		switch l.Direction {
		case checks.Inbound:
			within("unattributed inbound", unattributed, float64(end.Kernel.H2D))
		case checks.Outbound:
			within("unattributed outbound", unattributed, float64(end.Kernel.D2H))
		}
		res.Latency += fmt.Sprintf("%s unattributed %.0f MiB ", l.Direction, unattributed/(1<<20))
	}
	if res.Latency == "" {
		res.OtherErrs++
		res.Problems = append(res.Problems, "the evaluator measured no lane of "+name)
	}
	res.Latency += fmt.Sprintf("; %d SM transfers, %d layers with their request", len(sm), matched)
	return res
}

// kernelCopyEnd is the end line of the kernel-copy truth: bytes per
// direction on the lanes, by the copy-kernel stand-in and by probed copies.
type kernelCopyEnd struct {
	Lane, Kernel, Copy struct{ H2D, D2H uint64 }
}

func readKernelCopyEnd(path string) (kernelCopyEnd, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return kernelCopyEnd{}, err
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var raw struct {
		Lane   map[string]uint64 `json:"lane_bytes"`
		Kernel map[string]uint64 `json:"kernel_bytes"`
		Copy   map[string]uint64 `json:"copy_bytes"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &raw); err != nil || raw.Lane == nil {
		return kernelCopyEnd{}, fmt.Errorf("%s: end line without lane_bytes: %v", path, err)
	}
	var e kernelCopyEnd
	e.Lane.H2D, e.Lane.D2H = raw.Lane["h2d"], raw.Lane["d2h"]
	e.Kernel.H2D, e.Kernel.D2H = raw.Kernel["h2d"], raw.Kernel["d2h"]
	e.Copy.H2D, e.Copy.D2H = raw.Copy["h2d"], raw.Copy["d2h"]
	return e, nil
}

// findGPU is the reading of the named GPU in a snapshot, nil without one.
func findGPU(s collectors.GPUSnapshot, name string) *collectors.GPUReading {
	for i := range s.GPUs {
		if s.GPUs[i].Name == name {
			return &s.GPUs[i]
		}
	}
	return nil
}

// deltaOf is how many bytes the named GPU's counters moved between two
// snapshots, RX (host→device) and TX.
func deltaOf(a, b collectors.GPUSnapshot, name string) (rx, tx uint64, ok bool) {
	ra, rb := findGPU(a, name), findGPU(b, name)
	if ra == nil || rb == nil || !ra.HasPCIeBytes || !rb.HasPCIeBytes {
		return 0, 0, false
	}
	return rb.PCIeRxBytes - ra.PCIeRxBytes, rb.PCIeTxBytes - ra.PCIeTxBytes, true
}

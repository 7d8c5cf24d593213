package selftest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/judge"
	"github.com/lanewatch/lanewatch/selftest/refenv"
	"github.com/lanewatch/lanewatch/topology"
)

// LinkTrain sets the PCIe link of the reference GPU the link-trains-up
// scenario runs on, as the NVML stand-in reports it (generation, width):
// its maximum, the state it trains to under load and the state it idles at
// once its lanes have been idle IdleMS.
type LinkTrain struct {
	Name              string // the result row
	Max, Loaded, Idle [2]int
	IdleMS            int
	CounterInterval   time.Duration // how often the evaluator reads the counters
	Iterations        int           // kvpath --iterations; 0: the scenario's 16
	WantDegraded      bool          // link-degraded must fail (Loaded below Max)
}

// LinkTrainsUp idles at Gen1 x8 and trains to its maximum, Gen3 x8 (7.88
// GB/s per direction), under load. The scenario's two flows share the
// reference lane's 4 GB/s: half the trained maximum, twice the 2 GB/s of the
// idle state, so a capacity read at idle would call the lane saturated.
var LinkTrainsUp = LinkTrain{Name: "link-trains-up", Max: [2]int{3, 8}, Loaded: [2]int{3, 8}, Idle: [2]int{1, 8}, IdleMS: 300,
	CounterInterval: 100 * time.Millisecond}

// LinkStaysDown is the same GPU whose link trains only to Gen2 x8 under
// load: link-degraded must fail.
var LinkStaysDown = LinkTrain{Name: "link-stays-down", Max: [2]int{3, 8}, Loaded: [2]int{2, 8}, Idle: [2]int{1, 8}, IdleMS: 300,
	CounterInterval: 100 * time.Millisecond, WantDegraded: true}

func gbs(gw [2]int) float64 { return topology.LinkGBs(topology.GenGTs(gw[0]), gw[1]) }

// setEnv sets the variables for the NVML stand-in, which reads them when
// NVML is initialised in this process; the returned function restores them.
func setEnv(kv ...[2]string) (restore func()) {
	var undo []func()
	for _, p := range kv {
		old, had := os.LookupEnv(p[0])
		os.Setenv(p[0], p[1])
		undo = append(undo, func() {
			if had {
				os.Setenv(p[0], old)
			} else {
				os.Unsetenv(p[0])
			}
		})
	}
	return func() {
		for _, u := range undo {
			u()
		}
	}
}

func pair(k, v string) [2]string { return [2]string{k, v} }

// linkTrainRun runs link-trains-up on a shared reference GPU whose link (in
// the NVML stand-in) idles below its maximum and trains up under load, and
// judges it with the agent's own code: its NVML collector, the evaluator
// reading the counters every lt.CounterInterval, and the host link check fed
// with the evaluator's reads under load. It requires that
//
//   - the stand-in reads the idle state before the copies (the link is
//     idle-downclocked when the evaluator first sees it);
//   - the lane capacity the evaluator uses is the trained maximum, not the
//     idle state's, and the same-direction overlap of the two flows is
//     judged against it and not flagged;
//   - the link state read under load is the loaded one, and link-degraded
//     fails exactly when it is below the maximum;
//   - and, as for every scenario, every copy is reported as the truth says.
func linkTrainRun(ctx context.Context, refDir, tmp string, col *Collector, cfg Config, drops lossCount, lt LinkTrain) Result {
	res := Result{Scenario: lt.Name, Runtime: "nvml"}
	fail := func(format string, args ...any) Result {
		res.OtherErrs++
		res.Problems = append(res.Problems, fmt.Sprintf(format, args...))
		return res
	}
	before := drops()
	restore := setEnv(pair(refenv.NVMLMaxLink(lt.Max[0], lt.Max[1])), pair(refenv.NVMLLink(lt.Loaded[0], lt.Loaded[1])),
		pair(refenv.NVMLIdleLink(lt.Idle[0], lt.Idle[1])), pair(refenv.NVMLIdleMS(lt.IdleMS)))
	defer restore()
	gpu := fmt.Sprintf("selftest-link-%d", os.Getpid())
	truth := filepath.Join(tmp, lt.Name+".jsonl")
	args := []string{"--scenario", "link-trains-up", "--truth", truth, "--hold"}
	if lt.Iterations > 0 {
		args = append(args, "--iterations", strconv.Itoa(lt.Iterations))
	}
	cmd := exec.CommandContext(ctx, filepath.Join(refDir, "bin", "kvpath"), args...)
	cmd.Env = append(os.Environ(), refenv.SharedGPU(gpu))
	cmd.Stderr = cfg.drivers()
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		return fail("start link-trains-up: %v", err)
	}
	defer os.Remove(refenv.LaneFile(gpu))
	kill := func() { cmd.Process.Kill(); cmd.Wait() }
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || !strings.HasPrefix(line, "ready") {
		kill()
		return fail("link-trains-up did not get ready: %q %v", line, err)
	}
	go io.Copy(io.Discard, stdout)
	res.PID = uint32(cmd.Process.Pid)

	counters, err := agent.OpenGPU(agent.GPUConfig{Source: "nvml", NVMLLibrary: filepath.Join(refDir, "nvml", "libnvidia-ml.so.1")})
	if err != nil {
		kill()
		return fail("reference NVML: %v", err)
	}
	defer counters.Close()
	s0, err := counters.Sample()
	name := refenv.NVMLName(gpu)
	ref := findGPU(s0, name)
	if err != nil || ref == nil {
		kill()
		return fail("the reference NVML shows no GPU %s: %v", name, err)
	}
	idle := *ref
	// As agent run wires them: every counter reading feeds the link watch,
	// and a GPU whose capacity the host does not know (this one is in no
	// sysfs) gets the counters' maximum. The selftest knows where it put
	// the process, not the GPU's link: the capacity is the agent's to find.
	links := agent.NewLinkWatch(3 * lt.CounterInterval)
	watched := agent.WatchLinks(counters, links)
	placed := checks.Placement{GPU: ref.BusID, Why: "reference GPU " + name}
	eval := judge.NewEvaluator(judge.EvaluatorConfig{Place: func(uint32) checks.Placement { return placed }, GPU: watched,
		CounterInterval: lt.CounterInterval, LinkCapacity: agent.LaneCapacity(nil, links)})
	eval.Evaluate(time.Now()) // opens the window with a first counter reading

	// The counters are read every CounterInterval while the copies run, as
	// the evaluator's Run loop and the metrics' scrapes do.
	stop := make(chan struct{})
	var sampling sync.WaitGroup
	sampling.Add(1)
	go func() {
		defer sampling.Done()
		t := time.NewTicker(lt.CounterInterval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				watched.Sample()
			}
		}
	}()
	io.WriteString(stdin, "go\n")
	stdin.Close()
	began := time.Now()
	werr := cmd.Wait()
	// An idle tail as long as the copies took (and at least two readings,
	// so the last copies under load count): the window's lanes are busy at
	// most half of it, by construction. The copies run at the reference
	// lane's 4 GB/s, half the trained link, so a window they filled would be
	// link-underused by design; this row judges the capacity, not that.
	time.Sleep(max(2*lt.CounterInterval, time.Since(began)))
	close(stop)
	sampling.Wait()
	if werr != nil {
		res.Problems = append(res.Problems, fmt.Sprintf("link-trains-up: %v", werr))
	}
	if err := (&proc{pid: res.PID}).waitExit(col, cfg.Timeout); err != nil {
		res.Problems = append(res.Problems, err.Error())
	}
	got := col.Take(res.PID)
	for i := range got {
		eval.Transfer(&got[i])
	}
	loads := links.Take()
	v := eval.Evaluate(time.Now())
	judgeDesigned(&res, lt.Name, v.Findings)
	res.Drops = drops(res.PID) - before
	calls, err := ReadTruthFile(truth)
	if err != nil {
		return fail("%v", err)
	}
	Compare(&res, calls, got)

	// Idle before the copies: the stand-in trained the link down.
	if idle.LinkGen != lt.Idle[0] || idle.LinkWidth != lt.Idle[1] || idle.MaxLinkGen != lt.Max[0] || idle.MaxLinkWidth != lt.Max[1] {
		fail("idle reading Gen%d x%d of max Gen%d x%d, want Gen%d x%d of Gen%d x%d", idle.LinkGen, idle.LinkWidth, idle.MaxLinkGen,
			idle.MaxLinkWidth, lt.Idle[0], lt.Idle[1], lt.Max[0], lt.Max[1])
	}
	// The lane capacity is the trained maximum.
	wantCap := gbs(lt.Max) * 1e9
	var inbound *judge.LaneRate
	for i := range v.Lanes {
		if l := &v.Lanes[i]; l.GPU == ref.BusID && l.Direction == checks.Inbound {
			inbound = l
		}
	}
	switch {
	case inbound == nil:
		fail("the evaluator has no inbound lane of %s", name)
	case inbound.Capacity != wantCap:
		fail("inbound lane capacity %.2f GB/s, want the trained maximum %.2f (idle state %.2f)", inbound.Capacity/1e9, wantCap/1e9, gbs(lt.Idle))
	}
	// The two flows' overlap is judged against it, and not flagged.
	judged := false
	for _, c := range v.Checks {
		if c.Name == checks.CheckOverlap && c.Scope == "GPU "+ref.BusID && c.Status != checks.Skip {
			judged = true
		}
	}
	res.Overlap = "none"
	for _, f := range v.Findings {
		if f.Rule == "same-direction-overlap" && strings.Contains(f.Subject, ref.BusID) {
			res.Overlap = "flagged"
			res.OverlapErr = true
			res.Problems = append(res.Problems, "finding: "+f.Summary)
		}
	}
	if !judged {
		fail("no same-direction overlap judgement of %s: %+v", name, v.Checks)
	}
	// The link as read under load, and link-degraded.
	ld, ok := loads[ref.BusID]
	if !ok || ld.GTs != topology.GenGTs(lt.Loaded[0]) || ld.Width != lt.Loaded[1] {
		fail("link under load %+v (read %v), want Gen%d x%d", ld, ok, lt.Loaded[0], lt.Loaded[1])
	}
	host, err := checks.ReadHost("/proc", "/sys", "")
	if err != nil {
		return fail("%v", err)
	}
	host.Loads = loads
	lc := host.LinkCheck()
	degraded := 0
	for _, f := range lc.Findings {
		if f.Rule == "link-degraded" && f.Subject == topology.KindGPU+" "+ref.BusID {
			degraded++
			res.Problems = append(res.Problems, "finding: "+f.Summary)
		}
	}
	if (degraded == 1) != lt.WantDegraded || degraded > 1 {
		fail("%d link-degraded finding(s) for %s, want %v: %s", degraded, name, lt.WantDegraded, lc.Detail)
	}
	laneCap := 0.0
	if inbound != nil {
		laneCap = inbound.Capacity
	}
	res.Latency = fmt.Sprintf("capacity %.2f GB/s (idle %.2f); Gen%d x%d under load at %.2f GB/s", laneCap/1e9, gbs(lt.Idle),
		topology.Generation(ld.GTs), ld.Width, ld.Bps/1e9)
	return res
}

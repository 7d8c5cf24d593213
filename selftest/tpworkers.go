package selftest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/selftest/refenv"
)

// refDevices is the agent's DeviceMap in the selftest (docs/design.md,
// "Placement"): a reference process's CUDA GPUs are the ones its environment
// names (LW_REF_GPUS or LW_REF_GPU), with the PCI identities the reference
// driver and the NVML stand-in give them; its ordinals come from the
// production mapping over them (agent.DeviceMap: CUDA_VISIBLE_DEVICES,
// CUDA_DEVICE_ORDER). A process on private lanes has no PCI identity: its
// GPU is unknown.
func refDevices(procRoot string, log *slog.Logger) correlate.DeviceMap {
	return func(pid uint32, ordinal int) string {
		names := refenv.GPUsOf(procRoot, pid)
		if len(names) == 0 {
			return ""
		}
		gpus := make([]collectors.CUDAGPU, 0, len(names))
		for _, n := range names {
			gpus = append(gpus, collectors.CUDAGPU{BusID: refenv.BusID(n), Model: "reference GPU"})
		}
		return agent.DeviceMap(collectors.NewEnvCache(procRoot), gpus, log)(pid, ordinal)
	}
}

// tpWorkersRun runs tp-workers (refpath/kvpath/tpworkers.c) on one runtime
// build: a worker process per rank, each seeing every reference GPU of
// LW_REF_GPUS and choosing its device per thread. Rank 0 asks every
// device's PCI bus id as NCCL does, the others never do (the agent then
// places their ordinals with its DeviceMap). Every rank's records are
// compared with its truth, the GPU of every copy included. The workers are
// held once done until the agent handed on all their copies: the agent reads
// a process's environment when it first needs one of its ordinals, which a
// process that already exited no longer has.
func tpWorkersRun(ctx context.Context, kvpath, runtime, tmp string, col *Collector, cfg Config, drops lossCount) []Result {
	before := drops()
	var names []string
	for i := 0; i < 3; i++ {
		names = append(names, fmt.Sprintf("st%d-%s-tp%d", os.Getpid(), runtime, i))
	}
	defer func() {
		for _, n := range names {
			os.Remove(refenv.LaneFile(n))
		}
	}()
	truth := filepath.Join(tmp, runtime+"-tp-workers.jsonl")
	cmd := exec.CommandContext(ctx, kvpath, "--scenario", "tp-workers", "--truth", truth, "--hold")
	cmd.Env = append(os.Environ(), refenv.SharedGPUs(names...))
	if runtime == "cet" {
		cmd.Env = append(cmd.Env, "LD_LIBRARY_PATH="+filepath.Join(cfg.RefDir, "cet")+":"+filepath.Join(cfg.RefDir, "lib"))
	}
	cmd.Stderr = cfg.drivers()
	fail := func(format string, args ...any) []Result {
		return []Result{{Scenario: "tp-workers", Runtime: runtime, Problems: []string{fmt.Sprintf(format, args...)}}}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return fail("%v", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fail("%v", err)
	}
	if err := cmd.Start(); err != nil {
		return fail("start tp-workers: %v", err)
	}
	held := tpHold(bufio.NewReader(stdout), col, cfg.Timeout)
	io.WriteString(stdin, "go\n")
	stdin.Close()
	io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		return fail("tp-workers: %v", err)
	}
	if held != nil {
		return fail("%v", held)
	}
	ranks, err := tpRanks(truth)
	if err != nil {
		return fail("%v", err)
	}
	var out []Result
	for r := 0; r < ranks; r++ {
		path := strings.TrimSuffix(truth, ".jsonl") + fmt.Sprintf("-rank%d.jsonl", r)
		res := Result{Scenario: "tp-workers", Runtime: fmt.Sprintf("%s/r%d", runtime, r)}
		calls, err := ReadTruthFile(path)
		if err != nil || len(calls) == 0 {
			res.Problems = append(res.Problems, fmt.Sprintf("rank %d truth: %v (%d calls)", r, err, len(calls)))
			out = append(out, res)
			continue
		}
		res.PID = calls[0].PID
		if err := (&proc{pid: res.PID}).waitExit(col, cfg.Timeout); err != nil {
			res.Problems = append(res.Problems, err.Error())
		}
		Compare(&res, calls, col.Take(res.PID))
		out = append(out, res)
	}
	pids := []uint32{uint32(cmd.Process.Pid)}
	for _, r := range out {
		pids = append(pids, r.PID)
	}
	dropped := drops(pids...) - before
	for i := range out {
		out[i].Drops = dropped
	}
	return out
}

// tpHold reads the held workers' "copied <pid> <copies>" lines up to "held"
// and waits until the collector has that many records of each.
func tpHold(out *bufio.Reader, col *Collector, timeout time.Duration) error {
	want := map[uint32]int{}
	for {
		line, err := out.ReadString('\n')
		if err != nil {
			return fmt.Errorf("tp-workers: expected copied lines and held, got %q: %v", line, err)
		}
		if line == "held\n" {
			break
		}
		var pid uint32
		var n int
		if _, err := fmt.Sscanf(line, "copied %d %d", &pid, &n); err != nil {
			return fmt.Errorf("tp-workers: %q: %v", line, err)
		}
		want[pid] = n
	}
	deadline := time.Now().Add(timeout)
	for pid, n := range want {
		for col.records(pid) < n {
			if time.Now().After(deadline) {
				return fmt.Errorf("tp-workers: the agent handed on %d of pid %d's %d copies within %s", col.records(pid), pid, n, timeout)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// records is how many records the collector holds of pid.
func (c *Collector) records(pid uint32) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byPID[pid])
}

// tpRanks reads how many workers the tp-workers parent started from its end line.
func tpRanks(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var end struct {
		End   bool `json:"end"`
		Ranks int  `json:"ranks"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &end); err != nil || !end.End || end.Ranks < 2 {
		return 0, fmt.Errorf("%s: end line without ranks (%v)", path, err)
	}
	return end.Ranks, nil
}

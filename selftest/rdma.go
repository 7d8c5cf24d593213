package selftest

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/selftest/refenv"
)

// rdmaRoles are rdmapath's two processes; each has its reference GPU,
// refenv.RDMAGPU(role).
var rdmaRoles = []string{"prefill", "decode"}

// RDMAScenarios run two processes (prefill and decode roles) on the
// reference RDMA provider. Each role's row compares its records and
// ordering facts (ordering.go) with its truth; the decode row, which holds
// both roles' records, carries the scenario's verdict (checkDesigned:
// pd-overlap flagged for overlap, the ordering and in-flight shapes theirs).
var RDMAScenarios = append([]string{"pd-transfer", "pd-overlap", "pd-send-duplex", "rdma-read",
	"rdma-write-serial", "rdma-write-pipelined"}, OrderingScenarios...)

// rdmaRun runs one RDMA scenario and returns a result per role.
func rdmaRun(ctx context.Context, refDir, scenario, tmp string, col *Collector, cfg Config, drops lossCount) []Result {
	dir := filepath.Join(tmp, scenario)
	os.MkdirAll(dir, 0o755)
	before := drops()
	// --settle-file: the roles wait after opening the device, as a server
	// sets up long before KV flows, until the agent resolved both roles'
	// provider (found from the first context), so its data path is probed
	// before the first work request however loaded the machine is.
	settled := filepath.Join(dir, "settled")
	os.Remove(settled)
	cmd := exec.CommandContext(ctx, filepath.Join(refDir, "bin", "rdmapath"), "--scenario", scenario, "--truth-dir", dir, "--settle-file", settled)
	cmd.Stderr = cfg.drivers()
	var problems []string
	runErr := cmd.Start()
	if runErr == nil {
		if err := waitProviders(cmd.Process.Pid, col, cfg.Timeout); err != nil {
			problems = append(problems, err.Error())
		}
		os.WriteFile(settled, nil, 0o644) // released either way: a role waiting on it would only time out
		runErr = cmd.Wait()
	}

	roles := rdmaRoles
	truths := map[string][]TruthCall{}
	pids := map[string]uint32{}
	if runErr != nil {
		problems = append(problems, fmt.Sprintf("rdmapath: %v", runErr))
	}
	for _, role := range roles {
		calls, err := ReadTruthFile(filepath.Join(dir, scenario+"-"+role+".jsonl"))
		if err != nil || len(calls) == 0 {
			problems = append(problems, fmt.Sprintf("%s truth: %v", role, err))
			continue
		}
		truths[role], pids[role] = calls, calls[0].PID
	}
	var all []correlate.Transfer
	got := map[string][]correlate.Transfer{}
	for _, role := range roles {
		if pid, ok := pids[role]; ok {
			if err := (&proc{pid: pid}).waitExit(col, cfg.Timeout); err != nil {
				problems = append(problems, err.Error())
			}
			got[role] = col.Take(pid)
			all = append(all, got[role]...)
		}
	}
	dropped := drops(slices.Collect(maps.Values(pids))...) - before

	var out []Result
	for _, role := range roles {
		res := Result{Scenario: scenario, Runtime: role, PID: pids[role], Drops: dropped, Problems: slices.Clone(problems)}
		compareRDMA(&res, truths[role], got[role])
		checkOrdering(&res, scenario, truths[role], got[role])
		out = append(out, res)
	}
	if _, ok := pids["decode"]; ok {
		var procs []scenarioProc
		for _, role := range roles {
			if pid, ok := pids[role]; ok {
				procs = append(procs, scenarioProc{pid: pid, gpu: refenv.BusID(refenv.RDMAGPU(role)), truth: truths[role]})
			}
		}
		checkOverlap(&out[1], scenario, procs, all)
		noteInflight(&out[1], scenario, procs, all)
		var acts []correlate.Activity
		for _, p := range procs {
			acts = append(acts, col.TakeActivities(p.pid)...)
		}
		checkDesigned(&out[1], scenario, procs, all, acts)
	}
	return out
}

// CompareRDMA matches an RDMA role's records with its truth: every work
// request by queue pair and wr_id, the copies as Compare does (the soak's
// ledger, selftest/soak).
func CompareRDMA(res *Result, truth []TruthCall, got []correlate.Transfer) {
	compareRDMA(res, truth, got)
}

// compareRDMA matches every work request of the truth with the agent's, by
// queue pair and wr_id, and the copies as the CUDA scenarios do.
func compareRDMA(res *Result, truth []TruthCall, got []correlate.Transfer) {
	var copies []correlate.Transfer
	wrs := map[[3]uint64]correlate.Transfer{}
	var duplicates []string
	for _, g := range got {
		switch g.Op {
		case event.OpPostSend, event.OpPostRecv:
			k := wrKey(g.Op == event.OpPostRecv, g.QPNum, g.WRID)
			if _, dup := wrs[k]; dup {
				duplicates = append(duplicates, fmt.Sprintf("%s QP %d wr %d reported twice", g.Op, g.QPNum, g.WRID))
			}
			wrs[k] = g
		default:
			copies = append(copies, g)
		}
	}
	Compare(res, truth, copies)
	// The peer: the process whose memory a known rkey names.
	var peer uint32
	for _, t := range truth {
		if t.PeerPID != 0 {
			peer = t.PeerPID
		}
	}
	matched := map[[3]uint64]bool{}
	defer func() {
		extra := len(duplicates)
		for k, g := range wrs {
			if !matched[k] {
				extra++
				duplicates = append(duplicates, fmt.Sprintf("%s QP %d wr %d not posted by the scenario", g.Op, g.QPNum, g.WRID))
			}
		}
		if extra > 0 {
			res.OtherErrs += extra
			res.Got += extra // duplicates and strays are records too
			slices.Sort(duplicates)
			for _, d := range duplicates {
				if len(res.Problems) < 8 {
					res.Problems = append(res.Problems, d)
				}
			}
		}
	}()
	completions := map[[3]uint64]TruthCall{}
	for _, t := range truth {
		if t.Op == TruthCompletion {
			completions[wrKey(t.CQ == "recv", t.QPNum, t.WRID)] = t
		}
	}
	problem := func(format string, args ...any) {
		if len(res.Problems) < 8 {
			res.Problems = append(res.Problems, fmt.Sprintf(format, args...))
		}
	}
	var truthLat, agentLat []uint64
	for _, t := range truth {
		if t.Op != TruthPostSend && t.Op != TruthPostRecv {
			continue
		}
		recv := t.Op == TruthPostRecv
		k := wrKey(recv, t.QPNum, t.WRID)
		done, completed := completions[k]
		want := t.Bytes
		if recv && completed {
			want = done.ByteLen // a receive's size is what arrived
		}
		res.WantRecords++
		res.WantBytes += want
		g, ok := wrs[k]
		if !ok {
			problem("%s QP %d wr %d not seen", t.Op, t.QPNum, t.WRID)
			continue
		}
		matched[k] = true
		res.Got++
		res.GotBytes += g.Bytes
		if t.Op == TruthPostSend && t.RemoteMem != "" && t.RemoteMem != "recv_buffer" {
			remote := g.Dst
			if g.Direction == correlate.DirRDMARead {
				remote = g.Src
			}
			wantPeer := uint32(0)
			if t.RemoteMem != "unknown" {
				wantPeer = peer
			}
			if mem := wrMem(t.RemoteMem); remote.Mem != mem || g.PeerPID != wantPeer {
				res.MemoryErrs++
				problem("%s QP %d wr %d: remote memory %s peer %d, want %s peer %d", t.Op, t.QPNum, t.WRID, remote.Mem, g.PeerPID, mem, wantPeer)
			}
		}
		if g.Bytes != want {
			res.OtherErrs++
			problem("%s QP %d wr %d: %d bytes, want %d", t.Op, t.QPNum, t.WRID, g.Bytes, want)
		}
		if dir := wrDirection(t); g.Direction != dir {
			res.DirectionErrs++
			problem("%s QP %d wr %d (%s): direction %s, want %s", t.Op, t.QPNum, t.WRID, t.Opcode, g.Direction, dir)
		}
		local := g.Src
		if g.Direction == correlate.DirRDMARead || recv {
			local = g.Dst
		}
		if mem := wrMem(t.LocalMem); local.Mem != mem {
			res.MemoryErrs++
			problem("%s QP %d wr %d: local memory %s, want %s", t.Op, t.QPNum, t.WRID, local.Mem, mem)
		}
		if !completed {
			continue // unsignaled: complete when a later request on the queue is
		}
		if g.CompleteNs == 0 || g.Status != correlate.WCStatusName(done.Status) {
			res.OtherErrs++
			problem("%s QP %d wr %d: completion %q at %d, want %s", t.Op, t.QPNum, t.WRID, g.Status, g.CompleteNs,
				correlate.WCStatusName(done.Status))
			continue
		}
		// The agent stamps inside the calls the truth brackets: any load
		// on the machine widens the brackets, never moves a stamp out.
		if g.SubmitNs < t.TPostNs || g.SubmitNs > t.TPostEnd || g.CompleteNs < done.TPollBeg || g.CompleteNs > done.TPollNs {
			res.OtherErrs++
			problem("%s QP %d wr %d: posted %d completed %d, truth posted in [%d,%d] completed in [%d,%d]", t.Op, t.QPNum, t.WRID,
				g.SubmitNs, g.CompleteNs, t.TPostNs, t.TPostEnd, done.TPollBeg, done.TPollNs)
		}
		truthLat = append(truthLat, done.TPollNs-t.TPostNs)
		agentLat = append(agentLat, g.CompleteNs-g.SubmitNs)
	}
	if len(truthLat) > 0 {
		slices.Sort(truthLat)
		slices.Sort(agentLat)
		res.Latency = fmt.Sprintf("p50 %s/%s p99 %s/%s", us(correlate.Percentile(agentLat, 50)), us(correlate.Percentile(truthLat, 50)), us(correlate.Percentile(agentLat, 99)), us(correlate.Percentile(truthLat, 99)))
	}
}

// isFindingNote tells a problem line that only reports a finding.
// waitProviders waits until the agent resolved a verbs context of both
// roles, the launcher's two children.
func waitProviders(launcher int, col *Collector, timeout time.Duration) error {
	children := fmt.Sprintf("/proc/%d/task/%d/children", launcher, launcher)
	for deadline := time.Now().Add(timeout); ; time.Sleep(5 * time.Millisecond) {
		b, err := os.ReadFile(children)
		if err != nil {
			return fmt.Errorf("rdmapath (pid %d) ended before the agent resolved its roles' verbs provider", launcher)
		}
		resolved := 0
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.ParseUint(f, 10, 32); err == nil && col.ProviderResolved(uint32(pid)) {
				resolved++
			}
		}
		if resolved == 2 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the agent resolved the verbs provider of %d of the 2 roles (children of pid %d) in %s", resolved, launcher, timeout)
		}
	}
}

func isFindingNote(p string) bool { return strings.HasPrefix(p, "finding: ") }

func wrKey(recv bool, qp uint32, id uint64) [3]uint64 {
	r := uint64(0)
	if recv {
		r = 1
	}
	return [3]uint64{r, uint64(qp), id}
}

func wrDirection(t TruthCall) string {
	if t.Op == TruthPostRecv {
		return correlate.DirRecv
	}
	switch t.Opcode {
	case "RDMA_WRITE":
		return correlate.DirRDMAWrite
	case "RDMA_WRITE_WITH_IMM":
		return correlate.DirWriteImm
	case "RDMA_READ":
		return correlate.DirRDMARead
	case "SEND", "SEND_WITH_IMM":
		return correlate.DirSend
	}
	return correlate.DirUnknown
}

// wrMem is what the agent must report of a region rdmapath's truth names:
// device memory, host memory CUDA pinned, or host memory only the NIC
// registered — unknown, since the agent cannot tell it from device memory
// it never saw made (docs/design.md, "Correlation").
func wrMem(local string) event.MemKind {
	switch local {
	case "device":
		return event.MemDevice
	case "pinned":
		return event.MemPinned
	}
	return event.MemUnknown
}

func us(ns uint64) string { return fmt.Sprintf("%.0fµs", float64(ns)/1e3) }

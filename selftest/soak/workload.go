package soak

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lanewatch/lanewatch/selftest"
)

// The reference scenarios the workload cycles through: every CUDA
// scenario of the selftest that runs on its own, on both runtime builds,
// the dlopen driver, and the RDMA scenarios (two processes each). Each is
// a short-lived process (tens of milliseconds to a second): the churn.
var churnScenarios = []string{"hicache-load", "pageable-load", "fragmented-load", "writeback-duplex", "h2d-overlap", "default-kind",
	"api-coverage", "failing-copies", "vmm-pool-managed", "no-overlap", "big-and-trickle",
	"inflight-serial", "inflight-queued", "layer-compute", "layer-compute-sync", "layer-compute-item"}

// kind is one way of starting reference processes.
type kind struct {
	name string
	run  func(ctx context.Context) error
}

// workload starts reference processes one after another in each of its
// slots and hands every finished one with its truth to the ledger (and
// to onFinished: the normal OTLP traffic sends the spans a server would
// have sent for it).
type workload struct {
	refDir     string
	tmp        string
	ledger     *ledger
	onFinished func(kind string, truth []selftest.TruthCall)
	kinds      []kind
	next       atomic.Uint64
	seq        atomic.Uint64

	mu      sync.Mutex
	started int // processes started
	errs    int // runs that failed (the workload, not the agent)
	errList []string
}

func newWorkload(refDir, tmp string, l *ledger, onFinished func(kind string, truth []selftest.TruthCall)) *workload {
	w := &workload{refDir: refDir, tmp: tmp, ledger: l, onFinished: onFinished}
	for _, rt := range []string{"plain", "cet"} {
		for _, sc := range churnScenarios {
			w.kinds = append(w.kinds, kind{name: rt + "/" + sc, run: func(ctx context.Context) error { return w.kvpath(ctx, rt, sc) }})
		}
	}
	w.kinds = append(w.kinds, kind{name: "kvdl", run: w.kvdl})
	for _, sc := range selftest.RDMAScenarios {
		w.kinds = append(w.kinds, kind{name: "rdma/" + sc, run: func(ctx context.Context) error { return w.rdma(ctx, sc) }})
	}
	return w
}

// runNext runs the next kind in turn: one slot's piece of work.
func (w *workload) runNext(ctx context.Context) {
	k := w.kinds[w.next.Add(1)%uint64(len(w.kinds))]
	if err := k.run(ctx); err != nil && ctx.Err() == nil {
		w.fail(fmt.Errorf("%s: %w", k.name, err))
	}
}

// finish tells the ledger a process exited and sends its spans.
func (w *workload) finish(f *finished, kind string, end uint64, truth []selftest.TruthCall, rdma bool) {
	w.ledger.exit(f, kind, end, truth, rdma)
	if w.onFinished != nil && !rdma {
		w.onFinished(kind, truth)
	}
}

func (w *workload) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.errs++
	if len(w.errList) < 20 {
		w.errList = append(w.errList, err.Error())
	}
}

func (w *workload) counts() (started, errs int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.started, w.errs
}

func (w *workload) errorList() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.errList...)
}

func (w *workload) startedOne(n int) {
	w.mu.Lock()
	w.started += n
	w.mu.Unlock()
}

func (w *workload) truthPath(name string) string {
	return filepath.Join(w.tmp, fmt.Sprintf("%s-%d.jsonl", strings.ReplaceAll(name, "/", "-"), w.seq.Add(1)))
}

// boundedBuffer keeps the first bytes written to it (a process's stderr).
type boundedBuffer struct{ bytes.Buffer }

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if room := 4096 - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// kvpath runs one scenario on a runtime build.
func (w *workload) kvpath(ctx context.Context, rt, scenario string) error {
	truth := w.truthPath(rt + "-" + scenario)
	defer os.Remove(truth)
	cmd := exec.CommandContext(ctx, filepath.Join(w.refDir, "bin", "kvpath"), "--scenario", scenario, "--truth", truth)
	if rt == "cet" {
		cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(w.refDir, "cet")+":"+filepath.Join(w.refDir, "lib"))
	}
	return w.single(cmd, rt+"/"+scenario, truth)
}

// kvdl loads the runtime with dlopen after it started, then copies.
func (w *workload) kvdl(ctx context.Context) error {
	truth := w.truthPath("kvdl")
	defer os.Remove(truth)
	cmd := exec.CommandContext(ctx, filepath.Join(w.refDir, "bin", "kvdl"), "--lib", filepath.Join(w.refDir, "plain", "libcudart.so.12"),
		"--truth", truth, "--copies", "40", "--interval-ms", "2", "--settle-ms", "100")
	return w.single(cmd, "kvdl", truth)
}

// single runs one reference process whose truth is one file. The ledger
// knows it from before its first call: its pid is known once started,
// and it cannot call before it executed.
func (w *workload) single(cmd *exec.Cmd, kind, truth string) error {
	var stderr boundedBuffer
	cmd.Stderr = &stderr
	start := monoNow()
	if err := cmd.Start(); err != nil {
		return err
	}
	w.startedOne(1)
	f := w.ledger.begin(uint32(cmd.Process.Pid), kind, start)
	err := cmd.Wait()
	end := monoNow()
	if err != nil {
		w.ledger.abandon(f)
		return fmt.Errorf("pid %d exited: %v: %s", cmd.Process.Pid, err, stderr.String())
	}
	calls, err := selftest.ReadTruthFile(truth)
	if err != nil {
		w.ledger.abandon(f)
		return err
	}
	w.finish(f, kind, end, calls, false)
	return nil
}

// rdma runs an RDMA scenario: rdmapath forks a prefill and a decode
// process on the reference provider's shared-memory wire. The ledger
// learns the roles' pids as they appear among the launcher's children;
// the roles pause after opening the device (--settle-ms, as a server
// sets up long before KV flows), well before their first work request.
func (w *workload) rdma(ctx context.Context, scenario string) error {
	dir, err := os.MkdirTemp(w.tmp, "rdma-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cmd := exec.CommandContext(ctx, filepath.Join(w.refDir, "bin", "rdmapath"), "--scenario", scenario, "--truth-dir", dir, "--settle-ms", "300",
		"--timeout-s", "30")
	// A wire of its own: two RDMA runs at once (the other slot, another
	// program's selftest) would otherwise meet on the default one.
	cmd.Env = append(os.Environ(), fmt.Sprintf("LW_REF_WIRE=soak%d-%d", os.Getpid(), w.seq.Add(1)))
	var stderr boundedBuffer
	cmd.Stderr = &stderr
	start := monoNow()
	if err := cmd.Start(); err != nil {
		return err
	}
	w.startedOne(3)
	roles := map[uint32]*finished{}
	exited := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			for _, pid := range children(cmd.Process.Pid) {
				if roles[pid] == nil {
					roles[pid] = w.ledger.begin(pid, "rdma/"+scenario, start)
				}
			}
			select {
			case <-exited:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	err = cmd.Wait()
	end := monoNow()
	close(exited)
	<-watched
	defer func() {
		for _, f := range roles {
			if !f.exited {
				w.ledger.abandon(f)
			}
		}
	}()
	if err != nil {
		return fmt.Errorf("rdmapath %s: %v: %s", scenario, err, stderr.String())
	}
	for _, role := range []string{"prefill", "decode"} {
		calls, err := selftest.ReadTruthFile(filepath.Join(dir, scenario+"-"+role+".jsonl"))
		if err != nil {
			return err
		}
		if len(calls) == 0 {
			return fmt.Errorf("%s %s: empty truth", scenario, role)
		}
		f := roles[calls[0].PID]
		if f == nil { // not seen among the children: its records may wait unclaimed
			f = w.ledger.begin(calls[0].PID, "rdma/"+scenario, start)
			roles[calls[0].PID] = f
		}
		w.finish(f, "rdma/"+scenario+"/"+role, end, calls, true)
	}
	return nil
}

// children lists the child processes of pid (empty once it exited).
func children(pid int) []uint32 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return nil
	}
	var out []uint32
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.ParseUint(f, 10, 32); err == nil {
			out = append(out, uint32(n))
		}
	}
	return out
}

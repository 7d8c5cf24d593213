package selftest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/selftest/refenv"
	"github.com/lanewatch/lanewatch/topology"
	"golang.org/x/sys/unix"
)

// StorageScenario (refpath/kvpath/storage_load.c) reads each layer from a
// file on this machine's disk straight into its registered pool (bound to
// node 0), then loads it H2D. The selftest runs it twice with the file's
// block device placed by injection (the machine has one node and a virtio
// disk): on the pool's node, where storage-far-pool must not fire, and on
// node 1, where it must.
const StorageScenario = "storage-load"

// storagePlacement places block devices where the selftest says: the real
// PCI function (or the device's name where it has none) on node.
type storagePlacement struct {
	topo *topology.Host
	node atomic.Int64
}

func (p *storagePlacement) place(name string) topology.BlockPlacement {
	b := topology.BlockPlacement{Name: name, NUMANode: -1}
	if p.topo != nil {
		b = p.topo.PlaceBlock("/sys", name)
	}
	if b.BDF == "" {
		b.BDF, b.Unknown = "selftest:"+name, ""
	}
	b.NUMANode = int(p.node.Load())
	return b
}

// storageRuns are the two placements: the device on the pool's node 0, and
// on node 1, of another socket in the layout the selftest designs
// (nodesOn: this machine's sysfs may have one node).
var storageRuns = []struct {
	name string
	node int
	fire bool
}{{"storage-near-pool", 0, false}, {"storage-far-pool", 1, true}}

// storageDir finds a directory on a block device whose file system takes
// O_DIRECT: under the reference build, else the temporary directory.
func storageDir(refDir string) (string, error) {
	var tried []string
	for _, d := range []string{filepath.Join(refDir, "storage-tmp"), os.TempDir()} {
		why := directOK(d)
		if why == "" {
			return d, nil
		}
		tried = append(tried, d+": "+why)
	}
	return "", fmt.Errorf("no directory on a block device that takes O_DIRECT (%s)", strings.Join(tried, "; "))
}

func directOK(dir string) string {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err.Error()
	}
	p := filepath.Join(dir, "probe")
	if err := os.WriteFile(p, make([]byte, 4096), 0o600); err != nil {
		return err.Error()
	}
	defer os.Remove(p)
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		return "O_DIRECT: " + err.Error()
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err.Error()
	}
	if name, err := collectors.BlockDeviceName("/sys", uint64(st.Dev)); name == "" || err != nil {
		return fmt.Sprintf("on no block device (%d:%d) %v", unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev)), err)
	}
	return ""
}

// storageTruth is the scenario's end line.
type storageTruth struct {
	Reads    int    `json:"storage_reads"`
	Bytes    uint64 `json:"storage_bytes"`
	Direct   int    `json:"direct"`
	Dev      string `json:"storage_dev"`
	PoolNode int    `json:"pool_node"`
}

func readStorageTruth(path string) (storageTruth, error) {
	var t storageTruth
	if err := readEnd(path, &t); err != nil || t.Dev == "" {
		return storageTruth{}, fmt.Errorf("%s: end line: no storage truth (%v)", path, err)
	}
	return t, nil
}

// readEndField reads one number of a truth file's end line.
func readEndField(path, key string, v *uint64) error {
	m := map[string]json.RawMessage{}
	if err := readEnd(path, &m); err != nil {
		return err
	}
	raw, ok := m[key]
	if !ok {
		return fmt.Errorf("%s: end line has no %s", path, key)
	}
	return json.Unmarshal(raw, v)
}

// readEnd decodes the last non-blank line of a truth file.
func readEnd(path string, v any) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var last []byte
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) > 0 {
			last = append(last[:0], sc.Bytes()...)
		}
	}
	if err := json.Unmarshal(last, v); err != nil {
		return fmt.Errorf("%s: end line %q: %w", path, last, err)
	}
	return nil
}

// storageRun runs storage-load once per placement: the records compared
// with the truth as every scenario's are, the reads' flow with the truth's
// byte for byte, and the storage-into-the-pool verdict with the run's.
func storageRun(ctx context.Context, kvpath, tmp string, col *Collector, cfg Config, drops lossCount,
	st *agent.StorageReads, sp *storagePlacement) []Result {
	dir, dirErr := storageDir(cfg.RefDir)
	var out []Result
	for _, run := range storageRuns {
		res := Result{Scenario: run.name, Runtime: "plain"}
		if dirErr != nil {
			res.Problems = append(res.Problems, dirErr.Error())
			out = append(out, res)
			continue
		}
		sp.node.Store(int64(run.node))
		truthPath := filepath.Join(tmp, run.name+".jsonl")
		before := drops()
		p, err := startHeld(ctx, cfg, kvpath, StorageScenario, truthPath, []string{refenv.StorageDir(dir)})
		if err != nil {
			res.Problems = append(res.Problems, err.Error())
			out = append(out, res)
			continue
		}
		res.PID = p.pid
		if err := p.releaseReads(st, cfg.Timeout); err != nil {
			res.Problems = append(res.Problems, err.Error())
		}
		_, got := p.finish(&res, col, cfg.Timeout, drops, before)
		checkDesigned(&res, res.Scenario, []scenarioProc{{pid: p.pid, gpu: privateGPU(p.pid)}}, got, col.TakeActivities(p.pid))
		var flows []checks.StorageFlow
		for _, f := range st.Flows() {
			if f.PID == p.pid {
				flows = append(flows, f)
			}
		}
		var h2d uint64
		for _, t := range got {
			if !t.Failed() && t.Direction == "H2D" {
				h2d += t.Bytes
			}
		}
		checkStorage(&res, truthPath, run.node, run.fire, flows, h2d)
		out = append(out, res)
	}
	return out
}

// releaseReads lets a held storage-load make its reads once the agent
// watches it and knows its pool (its registration handled: the reads are
// resolved on another goroutine than the calls), reads its "read N" line,
// waits until the agent resolved N reads of it (while its fds and pool are
// still there), then lets it exit.
func (p *proc) releaseReads(st *agent.StorageReads, timeout time.Duration) error {
	var pool uint64
	if _, err := fmt.Sscanf(p.ready, "ready %d pool %v", new(int), &pool); err != nil {
		p.release()
		return fmt.Errorf("%s: ready line %q: %v", StorageScenario, p.ready, err)
	}
	deadline := time.Now().Add(timeout)
	for !st.Watching(p.pid) || !st.InPool(p.pid, pool) {
		if time.Now().After(deadline) {
			p.release()
			return fmt.Errorf("%s: the agent did not watch pid %d's reads and know its pool %#x within %s", StorageScenario, p.pid, pool, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
		return err
	}
	line, err := p.out.ReadString('\n')
	var n int
	if err != nil || !strings.HasPrefix(line, "read ") {
		return fmt.Errorf("%s: expected a read line, got %q: %v", StorageScenario, line, err)
	}
	if _, err := fmt.Sscanf(line, "read %d", &n); err != nil {
		return fmt.Errorf("%s: %q: %w", StorageScenario, line, err)
	}
	for st.Seen(p.pid) < n {
		if time.Now().After(deadline) {
			p.release()
			return fmt.Errorf("%s: the agent resolved %d of %d reads within %s", StorageScenario, st.Seen(p.pid), n, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return p.release()
}

// checkStorage compares the agent's flows of the scenario's reads with its
// truth (one device, the file's; every byte direct into the pool on the
// pool's node) and the verdict with the placement's: the device on node
// deviceNode, storage-far-pool firing exactly when fire.
func checkStorage(res *Result, truthPath string, deviceNode int, fire bool, flows []checks.StorageFlow, h2d uint64) {
	problem := func(format string, args ...any) {
		res.OtherErrs++
		res.Problems = append(res.Problems, fmt.Sprintf(format, args...))
	}
	t, err := readStorageTruth(truthPath)
	if err != nil {
		problem("storage: %v", err)
		return
	}
	if t.Direct != 1 {
		problem("storage: the file was read through the page cache (O_DIRECT refused): not storage DMA into the pool, nothing to judge")
		return
	}
	if t.PoolNode != 0 {
		problem("storage: the pool's pages are on node %d, not node 0 where the scenario bound them", t.PoolNode)
		return
	}
	var dev *checks.StorageFlow
	for i, f := range flows {
		var maj, mnr uint32
		if _, err := fmt.Sscanf(t.Dev, "%d:%d", &maj, &mnr); err != nil {
			problem("storage: storage_dev %q: %v", t.Dev, err)
			return
		}
		if name, _ := collectors.BlockDeviceName("/sys", unix.Mkdev(maj, mnr)); name == f.Device {
			dev = &flows[i]
		}
	}
	if dev == nil {
		problem("storage: no reads reported from the file's device %s (flows %+v)", t.Dev, flows)
		return
	}
	if got := dev.DirectPool[t.PoolNode]; got != t.Bytes || len(dev.DirectPool) != 1 || dev.Reads < t.Reads {
		problem("storage: %s: %d reads, direct into the pool by node %v; the scenario read %d B in %d reads, all on node %d",
			dev.Device, dev.Reads, dev.DirectPool, t.Bytes, t.Reads, t.PoolNode)
	}
	var r checks.Report
	r.Add(checks.StorageDirectCheck(fmt.Sprintf("pid %d", res.PID), flows, h2d, nodesOn([]int{0, 1}, []int{0, 1}).NodeSide))
	c := r.Checks[0]
	res.raise(c.Findings...)
	fired := false
	for _, f := range c.Findings {
		fired = fired || f.Rule == "storage-far-pool"
	}
	want := checks.Pass
	if fire {
		want = checks.Warn
	}
	if fired != fire || c.Status != want {
		problem("storage: device on node %d, pool on node %d: %s with storage-far-pool %v, want %s and %v (%s)",
			deviceNode, t.PoolNode, c.Status, fired, want, fire, c.Detail)
		return
	}
	res.Problems = append(res.Problems, fmt.Sprintf("finding: %s %s: %d reads, %d B direct into the pool on node %d, device on node %d: storage-far-pool %v",
		c.Name, c.Status, dev.Reads, t.Bytes, t.PoolNode, deviceNode, fired))
}

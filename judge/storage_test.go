package judge_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/judge"
	"github.com/lanewatch/lanewatch/topology"
)

// uplinkHost: GPU 0000:19:00.0 and nvme0n1 below one Gen4 x16 switch.
func uplinkHost() checks.StorageHost {
	gen4 := topology.Link{CurSpeedGTs: 16, MaxSpeedGTs: 16, CurWidth: 16, MaxWidth: 16, Known: true}
	f := func(bdf string, class uint32, chain ...string) *topology.Function {
		parent := ""
		if len(chain) > 1 {
			parent = chain[len(chain)-2]
		}
		return &topology.Function{BDF: bdf, Class: class, Parent: parent, Chain: chain, Link: gen4}
	}
	rp, usp, dsp := "0000:15:01.0", "0000:16:00.0", "0000:17:00.0"
	t := &topology.Host{Functions: map[string]*topology.Function{
		rp: f(rp, 0x060400, rp), usp: f(usp, 0x060400, rp, usp), dsp: f(dsp, 0x060400, rp, usp, dsp),
		"0000:19:00.0": f("0000:19:00.0", 0x030200, rp, usp, dsp, "0000:19:00.0"),
		"0000:1a:00.0": f("0000:1a:00.0", 0x010802, rp, usp, dsp, "0000:1a:00.0"),
	}}
	return checks.StorageHost{Topo: t,
		Place: func(n string) topology.BlockPlacement {
			return topology.BlockPlacement{Name: n, BDF: "0000:1a:00.0", RootPort: rp, Switch: usp}
		},
		Whole: func(string) bool { return true }}
}

func writeDiskstats(t *testing.T, proc string, sectorsRead uint64) {
	t.Helper()
	line := fmt.Sprintf("259 0 nvme0n1 100 0 %d 5 0 0 0 0 0 1500 12 0 0 0 0 0 0\n", sectorsRead)
	if err := os.WriteFile(filepath.Join(proc, "diskstats"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
}

// The window's disk reads and the GPU's D2H through one switch uplink: the
// read rate is whatever 1 TB over the window's few milliseconds makes, far
// above the uplink, so the verdict does not depend on how long the window
// took (under 40 s). H2D alone, the opposite direction, must not fire; an
// evaluator with Disks reports the check every window.
func TestDiskWindowUplink(t *testing.T) {
	proc := t.TempDir()
	writeDiskstats(t, proc, 0)
	d := judge.NewDiskWindow(proc, uplinkHost())
	writeDiskstats(t, proc, 2e9) // 1 TB of 512-byte sectors
	uplink := func(lanes []judge.LaneRate) checks.Check {
		t.Helper()
		for _, c := range judge.Judge(judge.NewWindow(false), &judge.Env{Lanes: lanes, DiskRates: d.Rates, Storage: uplinkHost()}).Checks {
			if c.Name == checks.CheckStorageUplink {
				return c
			}
		}
		t.Fatal("no storage vs H2D check")
		return checks.Check{}
	}
	c := uplink([]judge.LaneRate{{GPU: "0000:19:00.0", Direction: checks.Outbound, Demand: 5e9}})
	if len(c.Findings) != 1 || c.Findings[0].Rule != "storage-shared-uplink" || !strings.Contains(c.Findings[0].Summary, "storage reads and GPU D2H") {
		t.Fatalf("%s %q %+v", c.Status, c.Detail, c.Findings)
	}
	writeDiskstats(t, proc, 4e9)
	c = uplink([]judge.LaneRate{{GPU: "0000:19:00.0", Direction: checks.Inbound, Demand: 5e9}})
	if len(c.Findings) != 0 || c.Status != checks.Pass {
		t.Fatalf("reads beside H2D: %s %q %+v", c.Status, c.Detail, c.Findings)
	}

	e := judge.NewEvaluator(judge.EvaluatorConfig{Interval: time.Second, Disks: d})
	writeDiskstats(t, proc, 4e9) // idle since
	v := e.Evaluate(time.Now())
	found := false
	for _, c := range v.Checks {
		if c.Name == checks.CheckStorageUplink {
			found = c.Status == checks.Skip && c.Detail == "no storage device was busy"
		}
	}
	if !found {
		t.Errorf("evaluator checks %+v: want the idle storage vs H2D SKIP", v.Checks)
	}
}

type fixedFlows []checks.StorageFlow

func (f fixedFlows) Flows() []checks.StorageFlow { return f }

// The evaluator judges each window's storage reads per process: a pool
// read from a device placed on node 1 while its pages are on node 0 is a
// WARN with storage-far-pool among the verdict's findings.
func TestEvaluatorStorageChecks(t *testing.T) {
	far := checks.StorageFlow{PID: 7, Device: "nvme0n1", Reads: 16, DirectPool: map[int]uint64{0: 32 << 20},
		Place: topology.BlockPlacement{Name: "nvme0n1", BDF: "0000:1a:00.0", NUMANode: 1}}
	// Node N on package N: node 1 is another socket.
	numa := gpuOnNode{host: &topology.Host{Nodes: []topology.Node{{ID: 0, Package: 0}, {ID: 1, Package: 1}}}}
	e := judge.NewEvaluator(judge.EvaluatorConfig{Interval: time.Second, Storage: fixedFlows{far}, NUMA: numa})
	v := e.Evaluate(time.Now())
	var c *checks.Check
	for i := range v.Checks {
		if v.Checks[i].Name == checks.CheckStorageDirect && v.Checks[i].Scope == "pid 7" {
			c = &v.Checks[i]
		}
	}
	if c == nil || c.Status != checks.Warn || len(v.Findings) != 1 || v.Findings[0].Rule != "storage-far-pool" {
		t.Fatalf("checks %+v findings %+v", v.Checks, v.Findings)
	}
}

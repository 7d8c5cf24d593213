package checks

import (
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/topology"
)

// switchHost: a Gen4 x16 switch (upstream port 0000:16:00.0) with GPU
// 0000:19:00.0 and NVMe nvme0n1 below it, and nvme1n1 on a root port of
// its own; uplinkKnown false leaves the link speeds of the switch and its
// root port unknown.
func switchHost(uplinkKnown bool) StorageHost {
	gen4 := topology.Link{CurSpeedGTs: 16, MaxSpeedGTs: 16, CurWidth: 16, MaxWidth: 16, Known: true}
	up := gen4
	if !uplinkKnown {
		up = topology.Link{}
	}
	f := func(bdf string, class uint32, link topology.Link, chain ...string) *topology.Function {
		parent := ""
		if len(chain) > 1 {
			parent = chain[len(chain)-2]
		}
		return &topology.Function{BDF: bdf, Class: class, NUMANode: 0, Parent: parent, Chain: chain, Link: link}
	}
	rp, usp, d1, d2 := "0000:15:01.0", "0000:16:00.0", "0000:17:00.0", "0000:17:01.0"
	t := &topology.Host{Functions: map[string]*topology.Function{
		rp:             f(rp, 0x060400, up, rp),
		usp:            f(usp, 0x060400, up, rp, usp),
		d1:             f(d1, 0x060400, gen4, rp, usp, d1),
		d2:             f(d2, 0x060400, gen4, rp, usp, d2),
		"0000:19:00.0": f("0000:19:00.0", 0x030200, gen4, rp, usp, d1, "0000:19:00.0"),
		"0000:1a:00.0": f("0000:1a:00.0", 0x010802, gen4, rp, usp, d2, "0000:1a:00.0"),
		"0000:a0:01.0": f("0000:a0:01.0", 0x060400, gen4, "0000:a0:01.0"),
		"0000:a1:00.0": f("0000:a1:00.0", 0x010802, gen4, "0000:a0:01.0", "0000:a1:00.0"),
	}}
	places := map[string]topology.BlockPlacement{
		"nvme0n1": {Name: "nvme0n1", BDF: "0000:1a:00.0", NUMANode: 0, RootPort: rp, Switch: usp},
		"nvme1n1": {Name: "nvme1n1", BDF: "0000:a1:00.0", NUMANode: 0, RootPort: "0000:a0:01.0"},
	}
	return StorageHost{Topo: t,
		Place: func(n string) topology.BlockPlacement { return places[n] },
		Whole: func(n string) bool { return !strings.HasSuffix(n, "p1") }}
}

func TestStorageUplinkCheck(t *testing.T) {
	const gb = 1e9
	disk := func(name string, read, write float64) collectors.DiskRate {
		return collectors.DiskRate{Name: name, Interval: 10 * time.Second, ReadBytesPerSec: read, WriteBytesPerSec: write, ReadsPerSec: 1}
	}
	gpu := func(h2d, d2h float64) GPURates {
		return GPURates{"0000:19:00.0": {Inbound: h2d, Outbound: d2h}}
	}
	cases := []struct {
		name   string
		h      StorageHost
		rates  []collectors.DiskRate
		gpu    GPURates
		status Status
		detail string
	}{
		{"reads and D2H fill the uplink up", switchHost(true), []collectors.DiskRate{disk("nvme0n1", 8*gb, 0), disk("nvme0n1p1", 8*gb, 0)}, gpu(0, 18*gb),
			Warn, "switch 0000:16:00.0 up: storage 8.00 GB/s + GPU 18.00 GB/s of 31.51 GB/s"},
		{"reads and H2D: opposite directions", switchHost(true), []collectors.DiskRate{disk("nvme0n1", 8*gb, 0)}, gpu(20*gb, 0),
			Pass, "switch 0000:16:00.0 down: storage 0.00 GB/s + GPU 20.00 GB/s"},
		{"writes and H2D fill it down", switchHost(true), []collectors.DiskRate{disk("nvme0n1", 0, 6*gb)}, gpu(20*gb, 0),
			Warn, "host memory: H2D to 0000:19:00.0 (N0) 20.00 GB/s, nvme0n1 on N0 read 0.00 GB/s write 6.00 GB/s"},
		{"disk on its own root port", switchHost(true), []collectors.DiskRate{disk("nvme1n1", 8*gb, 0)}, gpu(20*gb, 0),
			Skip, "no busy storage device shares a switch with a GPU (nvme1n1: no switch)"},
		{"uplink capacity unknown", switchHost(false), []collectors.DiskRate{disk("nvme0n1", 8*gb, 0)}, gpu(0, 20*gb),
			Info, "uplink capacity unknown"},
	}
	for _, c := range cases {
		got := c.h.UplinkCheck(c.rates, c.gpu)
		var r Report
		r.Add(got)
		got = r.Checks[0]
		if got.Status != c.status || !strings.Contains(got.Detail, c.detail) {
			t.Errorf("%s: %s %q, want %s containing %q", c.name, got.Status, got.Detail, c.status, c.detail)
		}
		if (got.Status == Warn) != (len(got.Findings) == 1) {
			t.Errorf("%s: %d findings", c.name, len(got.Findings))
		}
	}
}

func TestStorageDirectCheck(t *testing.T) {
	place := func(node int) topology.BlockPlacement {
		return topology.BlockPlacement{Name: "nvme0n1", BDF: "0000:1a:00.0", NUMANode: node}
	}
	flow := func(node int, f func(*StorageFlow)) []StorageFlow {
		s := StorageFlow{PID: 9, Device: "nvme0n1", Place: place(node), Reads: 32, DirectPool: map[int]uint64{}}
		f(&s)
		return []StorageFlow{s}
	}
	cases := []struct {
		name    string
		flows   []StorageFlow
		h2d     uint64
		status  Status
		detail  string
		finding bool
	}{
		{"direct into the pool, near", flow(0, func(s *StorageFlow) { s.DirectPool[0] = 64 << 20 }), 64 << 20,
			Pass, "every byte read straight into the pool", false},
		{"direct into the pool, far", flow(1, func(s *StorageFlow) { s.DirectPool[0] = 64 << 20 }), 64 << 20,
			Warn, "direct into the pool 64.0 MiB (N0=64.0 MiB)", true},
		{"page cache into the pool", flow(0, func(s *StorageFlow) { s.CachedPool = 64 << 20 }), 64 << 20,
			Warn, "the kernel copies it into the pool (T_stage)", false},
		{"into other memory, then H2D", flow(0, func(s *StorageFlow) { s.DirectOther = 64 << 20 }), 64 << 20,
			Warn, "a staging hop (T_stage) before H2D", false},
		{"into other memory, no H2D", flow(0, func(s *StorageFlow) { s.CachedOther = 64 << 20 }), 0,
			Info, "not judged", false},
		{"direct into the pool, NPS4 sibling node", flow(5, func(s *StorageFlow) { s.DirectPool[4] = 64 << 20 }), 64 << 20,
			Info, "every byte read straight into the pool", true},
		{"direct into the pool, device node unknown", flow(-1, func(s *StorageFlow) { s.DirectPool[0] = 64 << 20 }), 64 << 20,
			Pass, "the node of nvme0n1 is unknown: storage-far-pool not judged", false},
	}
	for _, c := range cases {
		var r Report
		sides := twoSockets.NodeSide
		if c.flows[0].Place.NUMANode > 1 {
			sides = nps4.NodeSide
		}
		r.Add(StorageDirectCheck("pid 9", c.flows, c.h2d, sides))
		got := r.Checks[0]
		if got.Status != c.status || !strings.Contains(got.Detail, c.detail) || (len(got.Findings) > 0) != c.finding {
			t.Errorf("%s: %s %q %d findings", c.name, got.Status, got.Detail, len(got.Findings))
		}
		if c.finding && got.Findings[0].Rule != "storage-far-pool" {
			t.Errorf("%s: %+v", c.name, got.Findings[0])
		}
	}
}

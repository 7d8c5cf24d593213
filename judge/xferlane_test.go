package judge

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/internal/sysfstest"
	"github.com/lanewatch/lanewatch/topology"
)

// xferGPU is the GPU of xferHost: under one PCIe switch with mlx5_0 (PIX),
// as each GPU of the 8xH100 topo -m sample (topo_m/sglang-issue-30401_*);
// mlx5_1 on another host bridge of its node (NODE), mlx5_4 on the other
// socket (SYS).
const xferGPU = "0000:19:00.0"

// xferHost reads that host from a sysfs tree with the real layout, with
// the RDMA devices named (none: the GPU alone).
func xferHost(t *testing.T, nics ...string) *topology.Host {
	t.Helper()
	bridge := func(bdf, parent, hb string) sysfstest.Func {
		return sysfstest.Func{BDF: bdf, Parent: parent, HB: hb, Class: "0x060400", Vendor: "0x1000", Device: "0xc030", NUMA: "0"}
	}
	fx := sysfstest.Host{
		Nodes: []sysfstest.Node{{CPUs: "0-47", Distance: "10 21"}, {CPUs: "48-95", Distance: "21 10"}},
		Funcs: []sysfstest.Func{bridge("0000:15:01.0", "", "pci0000:15"), bridge("0000:16:00.0", "0000:15:01.0", ""),
			bridge("0000:17:00.0", "0000:16:00.0", ""), bridge("0000:17:01.0", "0000:16:00.0", ""),
			{BDF: xferGPU, Parent: "0000:17:01.0", Class: "0x030200", Vendor: "0x10de", Device: "0x2330", NUMA: "0"}},
	}
	nic := func(bdf, parent, hb, node, name string) sysfstest.Func {
		return sysfstest.Func{BDF: bdf, Parent: parent, HB: hb, Class: "0x020700", Vendor: "0x15b3", Device: "0x1021", NUMA: node, RDMA: []string{name}}
	}
	for _, n := range []sysfstest.Func{nic("0000:18:00.0", "0000:17:00.0", "", "0", "mlx5_0"),
		nic("0000:37:00.0", "", "pci0000:37", "0", "mlx5_1"), nic("0000:97:00.0", "", "pci0000:97", "1", "mlx5_4")} {
		if slices.Contains(nics, n.RDMA[0]) {
			fx.Funcs = append(fx.Funcs, n)
		}
	}
	h, err := topology.Read(sysfstest.Build(t, fx))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// The lanes check over windows of transfer-library records, shaped as the
// UCX probes report them (ucp_put_nbx: op xfer_put, the lane's transport
// and device, the GPU of the local buffer when known).
func TestXferLaneCheck(t *testing.T) {
	withNICs, noNICs, farOnly := xferHost(t, "mlx5_0", "mlx5_1", "mlx5_4"), xferHost(t), xferHost(t, "mlx5_1", "mlx5_4")
	put := func(transport, device, gpu string, n int) []correlate.Transfer {
		var out []correlate.Transfer
		for i := range n {
			out = append(out, correlate.Transfer{PID: 4, API: "ucp_put_nbx", Op: event.OpXferPut, Mover: correlate.MoverNIC,
				Direction: correlate.DirRDMAWrite, Bytes: 1 << 20, Transport: transport, NetDevice: device, GPU: gpu,
				SubmitNs: uint64(1000 * (i + 1)), CompleteNs: uint64(1000*(i+1) + 500), LatencyNs: 500})
		}
		return out
	}
	notSeen := put("unknown", "", xferGPU, 3)
	for i := range notSeen {
		notSeen[i].TransportReason = "transport_not_seen"
	}
	smallSends := put("tcp", "eth0", xferGPU, 5)
	for i := range smallSends {
		smallSends[i].Op, smallSends[i].API, smallSends[i].Bytes, smallSends[i].Direction = event.OpXferSend, "ucp_am_send_nbx", 64, correlate.DirSend
	}
	placed := func(gpu, why string) func(uint32) checks.Placement {
		return func(uint32) checks.Placement { return checks.Placement{GPU: gpu, Why: why} }
	}
	for _, c := range []struct {
		name      string
		transfers []correlate.Transfer
		nics      NICPlace
		place     func(uint32) checks.Placement
		status    checks.Status
		rules     string
		detail    string
	}{
		{"tcp while a PIX device is by the GPU", put("tcp", "lo", xferGPU, 20), withNICs, nil, checks.Warn, "kv-transfer-tcp-fallback",
			"GPU 0000:19:00.0: tcp on lo: 20 transfers, 20 MiB; nearest RDMA device mlx5_0 (PIX)"},
		{"the far device", put("rc_mlx5", "mlx5_4:1", xferGPU, 20), withNICs, nil, checks.Warn, "kv-transfer-far-device",
			"rc_mlx5 on mlx5_4:1 (SYS): 20 transfers"},
		{"the NODE device while PIX exists", put("rc_mlx5", "mlx5_1:1", xferGPU, 2), withNICs, nil, checks.Warn, "kv-transfer-far-device", "mlx5_1:1 (NODE)"},
		{"the nearest device", put("rc_mlx5", "mlx5_0:1", xferGPU, 20), withNICs, nil, checks.Pass, "", "rc_mlx5 on mlx5_0:1 (PIX): 20 transfers"},
		{"same host", put("posix", "memory", xferGPU, 20), withNICs, nil, checks.Pass, "", "posix on memory: 20 transfers"},
		{"tcp on a host without RDMA", put("tcp", "lo", xferGPU, 20), noNICs, nil, checks.Info, "",
			"no RDMA device on this host: the network stack is the best lane it has"},
		// RDMA devices only across a host bridge (NODE) or the socket may
		// serve another network: tcp is not judged a fallback.
		{"tcp while the RDMA devices are far", put("tcp", "lo", xferGPU, 20), farOnly, nil, checks.Info, "",
			"nearest RDMA device mlx5_1 (NODE): none near the GPU (PIX/PXB), so the network stack is not judged a fallback"},
		{"rdma lane on a host without RDMA devices read", put("rc_mlx5", "mlx5_0:1", xferGPU, 1), noNICs, nil, checks.Pass, "", "no RDMA device on this host"},
		{"transport unknown", notSeen, withNICs, nil, checks.Pass, "", "unknown on device unknown: 3 transfers, 3 MiB; nearest RDMA device mlx5_0 (PIX) | transport unknown: 3 transport_not_seen"},
		{"control messages on tcp", smallSends, withNICs, nil, checks.Pass, "", "tcp on eth0: 0 transfers, 0 B, 5 control messages"},
		{"the process's GPU when the record names none", put("tcp", "eth0", "", 4), withNICs, placed(xferGPU, ""), checks.Warn, "kv-transfer-tcp-fallback",
			"GPU 0000:19:00.0: tcp on eth0: 4 transfers"},
		{"no GPU known", put("tcp", "eth0", "", 4), withNICs, placed("", "GPU of pid 4 unknown: no placement configured"), checks.Skip, "",
			"GPU unknown (GPU of pid 4 unknown: no placement configured): tcp on eth0: 4 transfers, 4 MiB: not judged"},
		{"no topology", put("tcp", "lo", xferGPU, 4), nil, nil, checks.Skip, "", "the host's RDMA devices are unknown (no PCI topology): not judged"},
		{"a GPU not in the PCI tree", put("tcp", "lo", "0000:ee:00.0", 4), withNICs, nil, checks.Skip, "",
			"where the GPU sits from the RDMA devices is unknown (not in the PCI tree): not judged"},
		{"tcp and the far device at once", append(put("tcp", "eth0", xferGPU, 1), put("dc_mlx5", "mlx5_4:1", xferGPU, 1)...), withNICs, nil, checks.Warn,
			"kv-transfer-tcp-fallback,kv-transfer-far-device", "dc_mlx5 on mlx5_4:1 (SYS): 1 transfers, 1 MiB; tcp on eth0: 1 transfers"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := NewWindow(false)
			for i := range c.transfers {
				w.Transfer(&c.transfers[i])
			}
			// A copy beside them is no lane of a transfer library.
			w.Transfer(&correlate.Transfer{PID: 5, Op: event.OpCopy, Direction: correlate.DirH2D, Bytes: 1 << 20, GPU: xferGPU})
			place := c.place
			if place == nil {
				place = placed("", "no placement")
			}
			env := &Env{Place: place, Capacity: func(string) float64 { return 0 }}
			if c.nics != nil {
				env.NICs = c.nics
			}
			var got []checks.Check
			for _, ch := range Judge(w.Rotate(), env).Checks {
				if ch.Name == CheckXferLanes {
					got = append(got, ch)
				}
			}
			if len(got) != 1 {
				t.Fatalf("%d lanes checks, want one (pid 4's): %+v", len(got), got)
			}
			var rules []string
			for _, f := range got[0].Findings {
				rules = append(rules, f.Rule)
			}
			if got[0].Scope != "pid 4" || got[0].Status != c.status || strings.Join(rules, ",") != c.rules || !strings.Contains(got[0].Detail, c.detail) {
				t.Errorf("%s %s %v: %s; want %s [%s] %q", got[0].Scope, got[0].Status, rules, got[0].Detail, c.status, c.rules, c.detail)
			}
		})
	}
}

// A process's lanes are bounded: past maxXferLanes its transfers are
// counted, not kept.
func TestXferLanesBounded(t *testing.T) {
	facts := xferFacts{}
	for i := range maxXferLanes + 10 {
		facts.Transfer(&correlate.Transfer{PID: 1, Op: event.OpXferGet, Bytes: 8, Transport: "tcp", NetDevice: fmt.Sprintf("eth%d", i)})
	}
	if x := facts[1]; len(x.lanes) != maxXferLanes || x.over != 10 {
		t.Errorf("%d lanes, %d over; want %d and 10", len(x.lanes), x.over, maxXferLanes)
	}
}

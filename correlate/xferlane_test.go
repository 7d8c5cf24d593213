package correlate

import (
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/topology"
)

// hgxGPU0 is GPU0's row of the 8xH100 topo -m sample
// (topo_m/sglang-issue-30401_*): mlx5_0 PIX, mlx5_1..3 NODE, mlx5_4..7 SYS.
var hgxGPU0 = map[string]topology.Relation{"mlx5_0": "PIX", "mlx5_1": "NODE", "mlx5_2": "NODE", "mlx5_3": "NODE",
	"mlx5_4": "SYS", "mlx5_5": "SYS", "mlx5_6": "SYS", "mlx5_7": "SYS"}

// dellaGPU0 is GPU0's row of the old-format Della sample
// (topo_m/princeton_della-*): mlx5_0 NODE, mlx5_1 SYS; no PIX/PXB NIC.
var dellaGPU0 = map[string]topology.Relation{"mlx5_0": "NODE", "mlx5_1": "SYS"}

// Lanes as the transfer libraries name them: ucx_info -d on this machine
// lists tcp on lo and eth0, posix/sysv/cma on memory; UCX names an RDMA
// lane device:port; libfabric names its provider and domain.
var (
	tcpLo    = XferLane{Transport: "tcp", Device: "lo", Transfers: 2000, Bytes: 2000 << 20}
	tcpEth   = XferLane{Transport: "tcp", Device: "eth0", Transfers: 10, Bytes: 10 << 20}
	ofiTCP   = XferLane{Transport: "tcp;ofi_rxm", Device: "eth0", Transfers: 200, Bytes: 200 << 16}
	sockets  = XferLane{Transport: "sockets", Device: "eth0", Transfers: 1, Bytes: 1 << 20}
	posix    = XferLane{Transport: "posix", Device: "memory", Transfers: 2000, Bytes: 2000 << 20}
	cma      = XferLane{Transport: "cma", Device: "memory", Transfers: 5, Bytes: 5 << 20}
	cudaIPC  = XferLane{Transport: "cuda_ipc", Device: "cuda", Transfers: 64, Bytes: 64 << 20}
	unknownT = XferLane{Transport: "unknown", Transfers: 100, Bytes: 100 << 20}
	rcNear   = XferLane{Transport: "rc_mlx5", Device: "mlx5_0:1", Transfers: 512, Bytes: 512 << 20}
	rcNode   = XferLane{Transport: "rc_mlx5", Device: "mlx5_1:1", Transfers: 512, Bytes: 512 << 20}
	dcSys    = XferLane{Transport: "dc_mlx5", Device: "mlx5_5:1", Transfers: 256, Bytes: 256 << 20}
	verbsSys = XferLane{Transport: "verbs;ofi_rxm", Device: "mlx5_4", Transfers: 8, Bytes: 8 << 20}
	// only control messages on tcp: none counted as data
	tcpCtl = XferLane{Transport: "tcp", Device: "eth0", Messages: 40}
)

func TestTransportFallback(t *testing.T) {
	pxbOnly := map[string]topology.Relation{"mlx5_0": "PXB"}
	for _, c := range []struct {
		name  string
		lanes []XferLane
		rdma  map[string]topology.Relation
		fire  string // in the summary when it fires
	}{
		{"ucx tcp on loopback, PIX device by the GPU", []XferLane{tcpLo}, hgxGPU0, "2000 KV transfers (2.0 GiB) for GPU g went over tcp on lo while RDMA device mlx5_0 is PIX"},
		{"tcp beside rc: the tcp part fell back", []XferLane{rcNear, tcpEth}, hgxGPU0, "10 KV transfers (10 MiB) for GPU g went over tcp on eth0"},
		{"libfabric tcp;ofi_rxm", []XferLane{ofiTCP}, pxbOnly, "over tcp;ofi_rxm on eth0 while RDMA device mlx5_0 is PXB"},
		{"sockets provider", []XferLane{sockets}, hgxGPU0, "over sockets on eth0"},
		// Della's GPU has RDMA devices only across a host bridge (NODE) or
		// the socket: they may serve another network, so tcp is not judged.
		{"only far devices: not judged a fallback", []XferLane{tcpLo}, dellaGPU0, ""},
		{"rdma near", []XferLane{rcNear}, hgxGPU0, ""},
		{"rdma far is the other rule's", []XferLane{dcSys}, hgxGPU0, ""},
		{"same host: posix, cma", []XferLane{posix, cma}, hgxGPU0, ""},
		{"gpu transport", []XferLane{cudaIPC}, hgxGPU0, ""},
		{"transport unknown: never a fallback", []XferLane{unknownT}, hgxGPU0, ""},
		{"control messages only", []XferLane{rcNear, tcpCtl}, hgxGPU0, ""},
		{"no RDMA device: tcp is the best lane", []XferLane{tcpLo}, map[string]topology.Relation{}, ""},
		{"RDMA devices' place unknown (GPU not in the tree)", []XferLane{tcpLo}, map[string]topology.Relation{"mlx5_0": "", "mlx5_1": ""}, ""},
		{"only X, NV# or odd relations", []XferLane{tcpLo}, map[string]topology.Relation{"mlx5_0": topology.RelSelf, "mlx5_1": "NV12", "mlx5_2": "??"}, ""},
	} {
		f := TransportFallback(XferLanes{PID: 7, GPU: "g", Lanes: c.lanes, RDMA: c.rdma})
		if (f != nil) != (c.fire != "") {
			t.Errorf("%s: fired %v, want %v: %+v", c.name, f != nil, c.fire != "", f)
			continue
		}
		if f == nil {
			continue
		}
		if !strings.Contains(f.Summary, c.fire) || f.Subject != "pid 7 GPU g" || f.Severity != SevWarn || f.Checklist != ChecklistTransport {
			t.Errorf("%s: %q %q %s, want %q", c.name, f.Subject, f.Summary, f.Severity, c.fire)
		}
		if ev := strings.Join(f.Evidence, "\n"); !strings.Contains(ev, "RDMA devices by their place from the GPU: ") {
			t.Errorf("%s: evidence %q", c.name, ev)
		}
	}
	// The evidence names every lane: the fallen-back ones, the others with
	// their device's place.
	f := TransportFallback(XferLanes{PID: 7, GPU: "g", Lanes: []XferLane{rcNear, tcpEth}, RDMA: hgxGPU0})
	if ev := strings.Join(f.Evidence, "\n"); !strings.Contains(ev, "on the network stack: tcp on eth0: 10 transfers, 10 MiB") ||
		!strings.Contains(ev, "beside: rc_mlx5 on mlx5_0:1 (PIX): 512 transfers") ||
		!strings.Contains(ev, "mlx5_0 PIX, mlx5_1 NODE, mlx5_2 NODE, mlx5_3 NODE, mlx5_4 SYS") {
		t.Errorf("evidence %q", ev)
	}
}

func TestFarDevice(t *testing.T) {
	for _, c := range []struct {
		name  string
		lanes []XferLane
		rdma  map[string]topology.Relation
		fire  string
	}{
		{"SYS while PIX exists", []XferLane{dcSys}, hgxGPU0, "256 KV transfers (256 MiB) for GPU g went on mlx5_5 (SYS) while mlx5_0 is PIX"},
		{"NODE while PIX exists", []XferLane{rcNode}, hgxGPU0, "went on mlx5_1 (NODE) while mlx5_0 is PIX"},
		{"near and far rails: the far one", []XferLane{rcNear, dcSys}, hgxGPU0, "256 KV transfers"},
		{"libfabric verbs domain", []XferLane{verbsSys}, hgxGPU0, "went on mlx5_4 (SYS)"},
		{"Della: SYS while NODE exists", []XferLane{{Transport: "rc_verbs", Device: "mlx5_1:1", Transfers: 3, Bytes: 3}}, dellaGPU0, "went on mlx5_1 (SYS) while mlx5_0 is NODE"},
		{"the nearest", []XferLane{rcNear}, hgxGPU0, ""},
		{"as near as the nearest", []XferLane{{Transport: "rc_mlx5", Device: "mlx5_1:1", Transfers: 1}}, map[string]topology.Relation{"mlx5_0": "NODE", "mlx5_1": "NODE"}, ""},
		{"PXB beside PIX: one tier", []XferLane{{Transport: "rc_mlx5", Device: "mlx5_1:1", Transfers: 1}}, map[string]topology.Relation{"mlx5_0": "PIX", "mlx5_1": "PXB"}, ""},
		{"Della: the NODE one is the nearest", []XferLane{{Transport: "rc_mlx5", Device: "mlx5_0:1", Transfers: 1}}, dellaGPU0, ""},
		{"device not on this host", []XferLane{{Transport: "rc_mlx5", Device: "mlx5_9:1", Transfers: 1}}, hgxGPU0, ""},
		{"device unknown", []XferLane{{Transport: "rc_mlx5", Transfers: 1}}, hgxGPU0, ""},
		{"GPU's place unknown", []XferLane{dcSys}, map[string]topology.Relation{"mlx5_0": "", "mlx5_5": ""}, ""},
		{"tcp is not RDMA", []XferLane{tcpEth}, hgxGPU0, ""},
		{"control messages only", []XferLane{{Transport: "rc_mlx5", Device: "mlx5_5:1", Messages: 9}}, hgxGPU0, ""},
	} {
		f := FarDevice(XferLanes{PID: 7, GPU: "g", Lanes: c.lanes, RDMA: c.rdma})
		if (f != nil) != (c.fire != "") {
			t.Errorf("%s: fired %v, want %v: %+v", c.name, f != nil, c.fire != "", f)
			continue
		}
		if f != nil && (!strings.Contains(f.Summary, c.fire) || f.Subject != "pid 7 GPU g" || f.Checklist != ChecklistNIC) {
			t.Errorf("%s: %q %q, want %q", c.name, f.Subject, f.Summary, c.fire)
		}
	}
}

func TestRDMADeviceOf(t *testing.T) {
	rel := map[string]topology.Relation{"mlx5_0": "PIX", "rdmap0s6": "PIX", "mlx5_10": "SYS"}
	for dev, want := range map[string]string{
		"mlx5_0": "mlx5_0", "mlx5_0:1": "mlx5_0", "mlx5_10:2": "mlx5_10", // UCX: device:port
		"rdmap0s6-rdm": "rdmap0s6", "rdmap0s6-dgrm": "rdmap0s6", "mlx5_0-dgram": "mlx5_0", "mlx5_0-xrc": "mlx5_0", // libfabric domains
		"mlx5_1:1": "", "lo": "", "memory": "", "": "", "mlx5_0x": "",
	} {
		if got := RDMADeviceOf(dev, rel); got != want {
			t.Errorf("RDMADeviceOf(%q) = %q, want %q", dev, got, want)
		}
	}
}

func TestXferData(t *testing.T) {
	for _, c := range []struct {
		op    event.Op
		bytes uint64
		want  bool
	}{
		{event.OpXferPut, 8, true}, {event.OpXferGet, 32 << 10, true},
		{event.OpXferSend, 64 << 10, true}, {event.OpXferSend, 64<<10 - 1, false},
		{event.OpPostSend, 1 << 20, false}, {event.OpCopy, 1 << 20, false},
	} {
		if got := XferData(&Transfer{Op: c.op, Bytes: c.bytes}); got != c.want {
			t.Errorf("%s %d bytes: %v, want %v", c.op, c.bytes, got, c.want)
		}
	}
}

package selftest

import (
	"fmt"
	"slices"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/judge"
	"github.com/lanewatch/lanewatch/topology"
)

// Transfer-library lanes (kv-transfer-tcp-fallback, kv-transfer-far-device):
// a UCX client's puts, judged as agent run's evaluator judges a window, on
// a host placed by injection — the GPU and the RDMA NICs cannot exist
// here. The host is one GPU of the 8xH100 topo -m sample
// (topo_m/sglang-issue-30401_*): mlx5_0 under its PCIe switch (PIX),
// mlx5_1 on another host bridge of its node (NODE), mlx5_4 on the other
// socket (SYS); or the same GPU with no RDMA device.
//
// The records are shaped, not the agent's: until the UCX probes report
// ucx_perftest's puts (issue 22, point 1), each row builds the records
// they will report for `ucx_perftest -t ucp_put_bw -s 1048576` with the
// row's UCX_TLS — api ucp_put_nbx, op xfer_put, 1 MiB each, the transport
// and device `ucx_info -d` names for it ("tcp" on "lo", "posix" on
// "memory", "rc_mlx5" on "mlx5_0:1"), the GPU when the buffer is GPU
// memory (-m cuda; else the process's placement names it), posted →
// completed latency. What each row checks is the verdict: the rules
// raised against the design (designed, written by hand) and the lanes
// check's status, so a silent row was judged, not skipped.

// XferScenarios are the transfer-library lane rows.
var XferScenarios = []string{"xfer-tcp-fallback", "xfer-tcp-no-rdma", "xfer-far-device", "xfer-near-device", "xfer-same-host"}

// xferRow is one row: what the client ran and the lane UCX took for it,
// the injected host, and the lanes check's designed status.
type xferRow struct {
	tls               string // UCX_TLS of the client
	transport, device string // the lane's transport and device, as UCX names them
	gpuBuffer         bool   // -m cuda: the records name the GPU of the buffer
	nics              bool   // the host has its RDMA devices
	status            checks.Status
}

var xferRows = map[string]xferRow{
	// tcp on loopback while mlx5_0 is PIX to the GPU: the fallback.
	"xfer-tcp-fallback": {tls: "tcp", transport: "tcp", device: "lo", nics: true, status: checks.Warn},
	// the same run on a host with no RDMA device: tcp is the best lane.
	"xfer-tcp-no-rdma": {tls: "tcp", transport: "tcp", device: "lo", status: checks.Info},
	// GPU memory over mlx5_4, across the socket, while mlx5_0 is PIX.
	"xfer-far-device": {tls: "rc_mlx5,self", transport: "rc_mlx5", device: "mlx5_4:1", gpuBuffer: true, nics: true, status: checks.Warn},
	// GPU memory over the PIX device.
	"xfer-near-device": {tls: "rc_mlx5,self", transport: "rc_mlx5", device: "mlx5_0:1", gpuBuffer: true, nics: true, status: checks.Pass},
	// same-host shared memory beside RDMA devices: no NIC needed.
	"xfer-same-host": {tls: "posix,cma,self", transport: "posix", device: "memory", nics: true, status: checks.Pass},
}

const (
	// xferGPU is the injected GPU; xferPID the client of the shaped
	// records (no process runs).
	xferGPU = "0000:19:00.0"
	xferPID = 4242
	// xferPuts is how many puts of xferBytes a row's client makes,
	// xferWindow of them in flight at once.
	xferPuts   = 200
	xferBytes  = 1 << 20
	xferWindow = 8
)

// xferHost is the injected host: the GPU under one PCIe switch, with the
// RDMA devices when nics.
func xferHost(nics bool) *topology.Host {
	f := func(bdf string, class uint32, node int, hb string, chain ...string) *topology.Function {
		parent := ""
		if len(chain) > 1 {
			parent = chain[len(chain)-2]
		}
		return &topology.Function{BDF: bdf, Class: class, NUMANode: node, Parent: parent, HostBridge: hb, Chain: chain, IOMMUGroup: -1}
	}
	rp, usp, dsp0, dsp1 := "0000:15:01.0", "0000:16:00.0", "0000:17:00.0", "0000:17:01.0"
	h := &topology.Host{RDMA: map[string]string{}, Functions: map[string]*topology.Function{
		rp: f(rp, 0x060400, 0, "pci0000:15", rp), usp: f(usp, 0x060400, 0, "pci0000:15", rp, usp),
		dsp0: f(dsp0, 0x060400, 0, "pci0000:15", rp, usp, dsp0), dsp1: f(dsp1, 0x060400, 0, "pci0000:15", rp, usp, dsp1),
		xferGPU: f(xferGPU, 0x030200, 0, "pci0000:15", rp, usp, dsp1, xferGPU),
	}}
	if !nics {
		return h
	}
	for _, n := range []struct {
		name, bdf, hb string
		node          int
		chain         []string
	}{
		{"mlx5_0", "0000:18:00.0", "pci0000:15", 0, []string{rp, usp, dsp0, "0000:18:00.0"}},
		{"mlx5_1", "0000:38:00.0", "pci0000:37", 0, []string{"0000:37:01.0", "0000:38:00.0"}},
		{"mlx5_4", "0000:98:00.0", "pci0000:97", 1, []string{"0000:97:01.0", "0000:98:00.0"}},
	} {
		for i, bdf := range n.chain[:len(n.chain)-1] {
			if h.Functions[bdf] == nil {
				h.Functions[bdf] = f(bdf, 0x060400, n.node, n.hb, n.chain[:i+1]...)
			}
		}
		nic := f(n.bdf, 0x020700, n.node, n.hb, n.chain...)
		nic.RDMADevs = []string{n.name}
		h.Functions[n.bdf], h.RDMA[n.name] = nic, n.bdf
	}
	return h
}

// xferRecords are the records of the row's client: puts in windows of
// xferWindow posted together, each window completing before the next is
// posted, at 2 GB/s on RDMA transports (half the reference lane's 4 GB/s)
// and 1 GB/s over tcp. Eight in flight keep too-little-in-flight silent by
// construction (it needs fewer than two on average), whatever the rates.
func xferRecords(row xferRow) []correlate.Transfer {
	class := correlate.ClassOf(row.transport)
	mover := correlate.MoverOf(class)
	src, gpu := event.MemPinned, "" // ucp_mem_map'd host memory
	if row.gpuBuffer {
		src, gpu = event.MemDevice, xferGPU
	}
	window := uint64(xferWindow * xferBytes / 2) // ns at 2 GB/s
	if class == correlate.TransportNetwork {
		window *= 2
	}
	var out []correlate.Transfer
	for i := range uint64(xferPuts) {
		base := 1_000_000_000 + (i/xferWindow)*(window+1_000)
		submit, complete := base+(i%xferWindow)*100, base+window
		out = append(out, correlate.Transfer{PID: xferPID, TID: xferPID, API: "ucp_put_nbx", Op: event.OpXferPut, Mover: mover,
			Direction: correlate.DirRDMAWrite, Bytes: xferBytes, BatchIndex: -1, Layer: -1,
			Src: correlate.Side{Addr: 0x7f0000000000 + i*xferBytes, Mem: src}, Dst: correlate.Side{Addr: 0x7e0000000000 + i*xferBytes, Mem: event.MemUnknown},
			GPU: gpu, Transport: row.transport, NetDevice: row.device, RemoteAddr: 0x7e0000000000 + i*xferBytes, Endpoint: 0x55550000,
			SubmitNs: submit, CompleteNs: complete, LatencyNs: complete - submit})
	}
	return out
}

// xferRun judges one row's window of shaped records and compares its
// verdict with the design: the rules raised, and the lanes check's status.
func xferRun(name string) Result {
	row, ok := xferRows[name]
	if !ok {
		return Result{Scenario: name, OtherErrs: 1, Problems: []string{fmt.Sprintf("no transfer-library row %q (rows: %v)", name, XferScenarios)}}
	}
	res := JudgeXfer(name, xferPID, xferRecords(row))
	res.Runtime = "shaped"
	return res
}

// JudgeXfer judges the records of process pid as the row name's window,
// on the row's injected host with pid placed on its GPU, and compares the
// verdict with the row's design. The agent's tests hand it the records a
// real ucx_perftest client produced.
func JudgeXfer(name string, pid uint32, records []correlate.Transfer) Result {
	res := Result{Scenario: name}
	row, ok := xferRows[name]
	if !ok {
		res.OtherErrs++
		res.Problems = append(res.Problems, fmt.Sprintf("no transfer-library row %q (rows: %v)", name, XferScenarios))
		return res
	}
	v := windowVerdict([]scenarioProc{{pid: pid, gpu: xferGPU}}, records, nil, xferHost(row.nics))
	noteFindings(&res, v.Findings)
	judgeDesigned(&res, name, v.Findings)
	i := slices.IndexFunc(v.Checks, func(c checks.Check) bool { return c.Name == judge.CheckXferLanes })
	switch {
	case i < 0:
		res.OtherErrs++
		res.Problems = append(res.Problems, "no "+judge.CheckXferLanes+" check in the window's judgement")
	case v.Checks[i].Status != row.status:
		res.OtherErrs++
		res.Problems = append(res.Problems, fmt.Sprintf("%s: %s, designed %s (UCX_TLS=%s): %s", judge.CheckXferLanes, v.Checks[i].Status, row.status,
			row.tls, v.Checks[i].Detail))
	}
	return res
}

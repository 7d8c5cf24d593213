package selftest

import (
	"slices"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/topology"
)

// Every transfer-library row gives its designed verdict: the firing rows
// raise their rule, the silent ones nothing above INFO, and each lanes
// check has its designed status (a silent row was judged, not skipped).
func TestXferRows(t *testing.T) {
	if len(xferRows) != len(XferScenarios) {
		t.Fatalf("%d rows, %d names", len(xferRows), len(XferScenarios))
	}
	for _, name := range XferScenarios {
		res := xferRun(name)
		if !res.OK() {
			t.Errorf("%s: %v", name, res.Problems)
		}
		if want := designedAmong(name, "kv-transfer-tcp-fallback", "kv-transfer-far-device"); !slices.Equal(res.Raised, want) {
			t.Errorf("%s raised %v, designed %v", name, res.Raised, want)
		}
	}
	if res := xferRun("xfer-nonesuch"); res.OK() || !strings.Contains(strings.Join(res.Problems, " "), "no transfer-library row") {
		t.Errorf("an unknown row: %+v", res)
	}
}

// A row whose judgement differs from its design fails, naming both: the
// same records judged on the other host.
func TestXferRowMismatch(t *testing.T) {
	saved := xferRows["xfer-tcp-no-rdma"]
	defer func() { xferRows["xfer-tcp-no-rdma"] = saved }()
	row := saved
	row.nics = true // now the fallback fires, which the row's design does not name
	xferRows["xfer-tcp-no-rdma"] = row
	res := xferRun("xfer-tcp-no-rdma")
	text := strings.Join(res.Problems, " | ")
	if res.OK() || !strings.Contains(text, "designed to raise [], the agent's window raised [kv-transfer-tcp-fallback/warn]") ||
		!strings.Contains(text, "KV transfer lanes: WARN, designed INFO (UCX_TLS=tcp)") {
		t.Errorf("ok %v: %s", res.OK(), text)
	}
}

// The injected host places the RDMA devices as the sample's GPU0 row does
// (topo_m/sglang-issue-30401_*: mlx5_0 PIX, mlx5_1 NODE, mlx5_4 SYS), and
// the records are what the UCX rows will report.
func TestXferHostAndRecords(t *testing.T) {
	want := map[string]topology.Relation{"mlx5_0": "PIX", "mlx5_1": "NODE", "mlx5_4": "SYS"}
	if got := xferHost(true).RDMARelations(xferGPU); len(got) != len(want) || got["mlx5_0"] != "PIX" || got["mlx5_1"] != "NODE" || got["mlx5_4"] != "SYS" {
		t.Errorf("relations %v, want %v", got, want)
	}
	if got := xferHost(false).RDMARelations(xferGPU); len(got) != 0 {
		t.Errorf("a host without NICs has %v", got)
	}
	recs := xferRecords(xferRows["xfer-tcp-fallback"])
	r := recs[len(recs)-1]
	if len(recs) != xferPuts || r.API != "ucp_put_nbx" || !r.Op.IsXfer() || r.Bytes != 1<<20 || r.Transport != "tcp" || r.NetDevice != "lo" ||
		r.GPU != "" || r.Mover != correlate.MoverNIC || r.LatencyNs != r.CompleteNs-r.SubmitNs || r.Direction != correlate.DirRDMAWrite {
		t.Errorf("%d records, last %+v", len(recs), r)
	}
	if r := xferRecords(xferRows["xfer-far-device"])[0]; r.GPU != xferGPU || r.NetDevice != "mlx5_4:1" || r.Src.Mem != "device" {
		t.Errorf("a GPU buffer's record: %+v", r)
	}
}

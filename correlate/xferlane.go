package correlate

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/topology"
)

// The lane a transfer library chose for a KV transfer (docs/rules.md):
// kv-transfer-tcp-fallback, a transfer on the host's network stack while
// an RDMA device sits by its GPU, and kv-transfer-far-device, a transfer
// on an RDMA device farther from its GPU than another the host has. Both
// judge what the library did, record by record (its transport and
// device), where far-nic judges the map the server was given.

// ChecklistTransport is seed 002 §6's mixed form: TCP for the control
// plane, RDMA for the KV.
const ChecklistTransport = "RDMA (seed 002 §6): the control plane may use TCP/RPC, the KV data plane moves on RDMA; TCP in a log is not proof, a data transfer on TCP is"

var (
	_ = register(Rule{Name: "kv-transfer-tcp-fallback", Severities: []Severity{SevWarn}, Checklist: ChecklistTransport, Where: InWindow | InDiagnose,
		Remediation: "let the library open the RDMA device: `ucx_info -d` (or `fi_info`) in the server's container must list it " +
			"(/dev/infiniband mounted, a UCX or libfabric built with verbs/efa, memlock unlimited); UCX_TLS or FI_PROVIDER must not leave RDMA out; " +
			"then pin each GPU's process to its nearest device (UCX_NET_DEVICES=mlx5_0:1; `agent topo` prints the map)"})
	_ = register(Rule{Name: "kv-transfer-far-device", Severities: []Severity{SevWarn}, Checklist: ChecklistNIC, Where: InWindow | InDiagnose,
		Remediation: "pin each GPU's process to its nearest RDMA device (UCX_NET_DEVICES=mlx5_0:1, NIXL's device list, FI_VERBS_DEVICE_NAME or the " +
			"libfabric domain); `agent topo` prints each GPU's nearest device"})
)

// XferLanes is one process's transfer-library transfers for one GPU over a
// window, by lane, and where the host's RDMA devices sit from that GPU.
type XferLanes struct {
	PID   uint32
	GPU   string
	Lanes []XferLane
	// RDMA maps every RDMA device on the host's PCI tree to its relation
	// with GPU (topology.Host.RDMARelations): empty when the host has
	// none, "" where the relation is unknown.
	RDMA map[string]topology.Relation
}

// XferLane is the transfers one transport and device carried.
type XferLane struct {
	Transport string // as recorded: "tcp", "rc_mlx5", "tcp;ofi_rxm"; "" or "unknown" unknown
	Device    string // as recorded: "lo", "mlx5_0:1", "rdmap0s6-rdm"; "" unknown
	// Transfers and Bytes count the KV data (XferData); Messages the
	// control messages beside it, never judged.
	Transfers, Messages int
	Bytes               uint64
}

// controlMessage: a message (not a put or get) under 64 KiB is taken for
// the control plane — a notification, metadata — which seed 002 §6 says
// may travel on TCP beside an RDMA data plane. Puts and gets are data
// whatever their size (a KV block of one layer can be 32 KiB).
const controlMessage = smallCopy

// XferData reports whether a transfer library's record is KV data: a put
// or a get, or a message of 64 KiB or more.
func XferData(t *Transfer) bool {
	return t.Op == event.OpXferPut || t.Op == event.OpXferGet || (t.Op == event.OpXferSend && t.Bytes >= controlMessage)
}

// NearestRDMA is the RDMA device nearest a GPU among relations (lowest
// topology rank, PIX first; ties to the first name in sort order) and
// its relation; "" when none has a known relation.
func NearestRDMA(relations map[string]topology.Relation) (string, topology.Relation) {
	best, rank := "", 0
	for _, name := range slices.Sorted(maps.Keys(relations)) {
		if r := relations[name].Rank(); r > 0 && (best == "" || r < rank) {
			best, rank = name, r
		}
	}
	if best == "" {
		return "", ""
	}
	return best, relations[best]
}

// RDMADeviceOf names the RDMA device of a recorded device among the
// host's: UCX writes "mlx5_0:1" (device:port), libfabric a domain
// ("mlx5_0", "rdmap0s6-rdm", "mlx5_0-dgram"); "" when it is none of them.
func RDMADeviceOf(device string, relations map[string]topology.Relation) string {
	if _, ok := relations[device]; ok {
		return device
	}
	name, _, _ := strings.Cut(device, ":")
	for _, suffix := range []string{"", "-rdm", "-dgrm", "-dgram", "-xrc"} {
		if n, ok := strings.CutSuffix(name, suffix); ok {
			if _, known := relations[n]; known {
				return n
			}
		}
	}
	return ""
}

// TransportFallback fires when KV data went over the host's network stack
// (tcp, sockets: ClassOf TransportNetwork) while an RDMA device is near
// the transfers' GPU (PIX or PXB: seed 000's GPUDirect RDMA placement;
// a device only across a host bridge or the socket may serve another
// network, storage say, and is not judged): the library fell
// back from RDMA (a container without /dev/infiniband, a UCX without
// verbs so `ucx_info -d` lists no RDMA device, UCX_TLS leaving rc/dc
// out: ai-dynamo/dynamo#1314; ~100× slower in pull mode,
// vllm-project/vllm#52607). Silent on RDMA, same-host and GPU transports,
// on an unknown transport, and where the host has no RDMA device (TCP is
// then the best lane it has: the judge says so).
func TransportFallback(l XferLanes) *Finding {
	var net []XferLane
	transfers, bytes := 0, uint64(0)
	for _, ln := range l.Lanes {
		if ln.Transfers > 0 && ClassOf(ln.Transport) == TransportNetwork {
			net = append(net, ln)
			transfers += ln.Transfers
			bytes += ln.Bytes
		}
	}
	nearest, rel := NearestRDMA(l.RDMA)
	if len(net) == 0 || !NearGPU(rel) {
		return nil
	}
	ev := []string{"on the network stack: " + XferLanesText(net, nil)}
	if other := slices.DeleteFunc(slices.Clone(l.Lanes), func(ln XferLane) bool { return ClassOf(ln.Transport) == TransportNetwork }); len(other) > 0 {
		ev = append(ev, "beside: "+XferLanesText(other, l.RDMA))
	}
	ev = append(ev, "RDMA devices by their place from the GPU: "+relationsText(l.RDMA),
		"seed 002 §6: TCP may carry the control plane; puts, gets and messages of 64 KiB or more are the KV data plane")
	return newFinding("kv-transfer-tcp-fallback", SevWarn, fmt.Sprintf("pid %d GPU %s", l.PID, l.GPU),
		fmt.Sprintf("%d KV transfers (%s) for GPU %s went over %s while RDMA device %s is %s to the GPU: the library fell back from RDMA",
			transfers, bytesText(bytes), l.GPU, transportsText(net), nearest, rel),
		ev, "")
}

// NearGPU says whether a device at this relation is near a GPU: PIX or
// PXB, no host bridge between them (seed 000: GPUDirect RDMA should use a
// PIX/PXB NIC).
func NearGPU(r topology.Relation) bool {
	return r.Rank() > 0 && r.Rank() <= topology.RelPXB.Rank()
}

// FarDevice fires when KV data went on an RDMA device whose path to the
// transfers' GPU crosses a host bridge or the socket interconnect (PHB,
// NODE, SYS) while the host has a device nearer to it (seed 000: GPUDirect
// RDMA should use a PIX/PXB NIC; openucx/ucx#11259: UCX on the far NIC,
// half the bandwidth). PIX and PXB are one tier (neither crosses the host
// bridge), so a PXB device beside a PIX one is not far. Silent on a
// device as near as the nearest, on a device or GPU whose place is
// unknown, and on transports that are not RDMA.
func FarDevice(l XferLanes) *Finding {
	nearest, best := NearestRDMA(l.RDMA)
	if nearest == "" {
		return nil
	}
	var far []XferLane
	transfers, bytes := 0, uint64(0)
	for _, ln := range l.Lanes {
		if ln.Transfers == 0 || ClassOf(ln.Transport) != TransportRDMA {
			continue
		}
		r := l.RDMA[RDMADeviceOf(ln.Device, l.RDMA)].Rank()
		if r >= topology.RelPHB.Rank() && r > best.Rank() {
			far = append(far, ln)
			transfers += ln.Transfers
			bytes += ln.Bytes
		}
	}
	if len(far) == 0 {
		return nil
	}
	used := RDMADeviceOf(far[0].Device, l.RDMA)
	return newFinding("kv-transfer-far-device", SevWarn, fmt.Sprintf("pid %d GPU %s", l.PID, l.GPU),
		fmt.Sprintf("%d KV transfers (%s) for GPU %s went on %s (%s) while %s is %s to the GPU", transfers, bytesText(bytes), l.GPU,
			used, l.RDMA[used], nearest, best),
		[]string{
			"on a far device: " + XferLanesText(far, l.RDMA),
			"RDMA devices by their place from the GPU: " + relationsText(l.RDMA),
			"seed 000: GPUDirect RDMA should use a PIX/PXB NIC; a far one crosses the host bridge or the socket interconnect",
		}, "")
}

// XferLanesText lists lanes, each device with its place from the GPU when
// relations know it.
func XferLanesText(lanes []XferLane, relations map[string]topology.Relation) string {
	var out []string
	for _, ln := range lanes {
		t, d := cmp.Or(ln.Transport, "unknown"), cmp.Or(ln.Device, "device unknown")
		if rel := relations[RDMADeviceOf(ln.Device, relations)]; rel != "" {
			d += " (" + string(rel) + ")"
		}
		s := fmt.Sprintf("%s on %s: %d transfers, %s", t, d, ln.Transfers, bytesText(ln.Bytes))
		if ln.Messages > 0 {
			s += fmt.Sprintf(", %d control messages", ln.Messages)
		}
		out = append(out, s)
	}
	return strings.Join(out, "; ")
}

// transportsText names the lanes' transports and devices: "tcp on lo".
func transportsText(lanes []XferLane) string {
	var out []string
	for _, ln := range lanes {
		out = append(out, ln.Transport+" on "+cmp.Or(ln.Device, "device unknown"))
	}
	return strings.Join(slices.Compact(out), ", ")
}

// relationsText lists RDMA devices nearest first: "mlx5_0 PIX, mlx5_1 NODE".
func relationsText(relations map[string]topology.Relation) string {
	names := slices.Sorted(maps.Keys(relations))
	slices.SortStableFunc(names, func(a, b string) int { return rankOrder(relations[a]) - rankOrder(relations[b]) })
	var out []string
	for _, n := range names {
		out = append(out, n+" "+cmp.Or(string(relations[n]), "unknown"))
	}
	return strings.Join(out, ", ")
}

// rankOrder sorts unknown relations last.
func rankOrder(r topology.Relation) int {
	if r.Rank() < 0 {
		return 99
	}
	return r.Rank()
}

// OnGPULinkOnlyHere reports whether a transfer library's transfer is the
// only record of what its NIC moved: UCX's mlx5 transports (rc_mlx5,
// dc_mlx5, ud_mlx5) build their work queue entries and ring the doorbell
// themselves, so no verbs work request shows them (issue 22). Every other
// transport's bytes either show already — rc_verbs and libfabric's verbs
// provider post through libibverbs (work requests), cuda_ipc and cuda_copy
// are CUDA copies, and tcp from GPU memory stages through cuda_copy — or
// cross no GPU link (posix, cma), or are not known here (efa, an unknown
// name): placing them on a lane would count bytes twice or guess.
func OnGPULinkOnlyHere(t *Transfer) bool {
	core, _, _ := strings.Cut(t.Transport, ";")
	return t.Op.IsXfer() && (core == "rc_mlx5" || core == "dc_mlx5" || core == "ud_mlx5")
}

package correlate

import (
	"fmt"
	"slices"
)

// Where says where a rule is judged.
type Where uint8

const (
	// InWindow: every evaluation window of `agent run` (--evaluate-interval)
	// and the live window of `agent diagnose --sample`, from transfers.
	InWindow Where = 1 << iota
	// InHostCheck: `agent run`'s host and process checks
	// (--host-check-interval) and `agent diagnose`, from sysfs and procfs.
	InHostCheck
	// InDiagnose: `agent diagnose` only, which has input `agent run` lacks
	// (the server's NIC map, a counter window of its own).
	InDiagnose
)

// Rule is one finding rule as every consumer sees it: the exporters (the
// lanewatch_findings series it may have), the alert rules and their test,
// and the documentation.
type Rule struct {
	Name        string
	Severities  []Severity // every severity it can report
	Checklist   string     // the seed checklist item it applies
	Remediation string     // the general fix; a finding may be more precise
	Where       Where
}

// Rules is every finding rule, once: the exporters, the alerts' test and
// the generated docs/rules.md read it. Adding a rule: CONTRIBUTING.md,
// "Adding a window rule" (a window rule's judgement is a judge.Rule).
var Rules = []Rule{
	{Name: "remote-numa-pool", Severities: []Severity{SevFail, SevInfo}, Checklist: checkPoolNode, Where: InWindow | InHostCheck | InDiagnose,
		Remediation: "allocate the pool on its GPU's NUMA node (numactl --cpunodebind=N --membind=N, or the server's own NUMA binding)"},
	{Name: "numa-bind-skipped", Severities: []Severity{SevWarn}, Checklist: checkPoolNode, Where: InHostCheck | InDiagnose,
		Remediation: "install numactl and grant CAP_SYS_NICE, or bind explicitly with numactl"},
	{Name: "far-nic", Severities: []Severity{SevWarn}, Checklist: checkNIC, Where: InDiagnose,
		Remediation: "map each GPU to its nearest NIC (SGLang --disaggregation-ib-device, NCCL_IB_HCA, Mooncake/NIXL device lists); `agent topo` prints the map"},
	{Name: "link-degraded", Severities: []Severity{SevFail, SevInfo}, Checklist: checkLink, Where: InHostCheck | InDiagnose,
		Remediation: "fail: reseat the card or riser, check the slot's bifurcation and the BIOS PCIe speed setting, then retrain (reboot); " +
			"info (slot-limited): the slot sets the ceiling, move the card to a slot as wide and fast as it is if the bandwidth matters"},
	{Name: "link-underused", Severities: []Severity{SevWarn}, Checklist: checkUnderused, Where: InWindow,
		Remediation: "fix the likelier bottleneck the finding names before tuning the link; `agent diagnose --sample` checks pools, NUMA and pinning"},
	{Name: "pinned-pressure", Severities: []Severity{SevWarn, SevFail}, Checklist: checkPinnedMem, Where: InHostCheck | InDiagnose,
		Remediation: "size the host KV pool (e.g. SGLang --hicache-ratio/--hicache-size) to leave headroom; pinned pages cannot be swapped or reclaimed"},
	{Name: "iommu-translated", Severities: []Severity{SevWarn}, Checklist: checkIOMMU, Where: InHostCheck | InDiagnose,
		Remediation: "translation costs IOTLB misses on every DMA, and with ACS on, switch-local P2P is sent up to the root complex and back. " +
			"Do not turn the IOMMU off blindly: first confirm the mapping mode your GPU/NIC drivers require and measure a translation bottleneck; " +
			"then consider passthrough for these devices (iommu=pt) and ACS settings per the platform's GPUDirect guide"},
	// pageable-copy: fail/warn by the share of host↔GPU bytes pageable copies
	// carried, info for metadata-sized ones and small shares (rules.go).
	{Name: "pageable-copy", Severities: []Severity{SevFail, SevWarn, SevInfo}, Checklist: checkPinned, Where: InWindow | InDiagnose,
		Remediation: "register the host buffer (cudaHostRegister, or torch pin_memory()) once at start-up, or allocate it pinned (cudaHostAlloc)"},
	{Name: "fragmented-copies", Severities: []Severity{SevWarn}, Checklist: checkFragments, Where: InWindow | InDiagnose,
		Remediation: "coalesce pages into larger copies (a page-first/layer-first layout), or use a batched copy (cudaMemcpyBatchAsync) or a copy kernel"},
	{Name: "same-direction-overlap", Severities: []Severity{SevWarn}, Checklist: checkOverlap, Where: InWindow | InDiagnose,
		Remediation: "stagger the inbound transfers (e.g. HiCache loads vs PD RDMA receives) or move one to another path; opposite directions do not contend"},
	{Name: "rdma-congestion", Severities: []Severity{SevWarn, SevFail}, Checklist: checkCongestion, Where: InWindow | InDiagnose,
		Remediation: "check the fabric, not the host: ECN/PFC configuration (the RoCE priority must be lossless and match DCQCN's), " +
			"switch buffer and egress congestion toward this port, and whether PD traffic and other tenants share the priority"},
	{Name: "too-little-in-flight", Severities: []Severity{SevWarn}, Checklist: checkInFlight, Where: InWindow | InDiagnose,
		Remediation: "keep more in flight: queue more copies before synchronising (one sync or event per layer), or more work requests outstanding per queue pair; in flight must cover the path's bandwidth × turnaround"},
	// compute overlap (computeoverlap.go)
	{Name: "serialized-load", Severities: []Severity{SevWarn}, Checklist: checkComputeOverlap, Where: InWindow | InDiagnose,
		Remediation: "wait on the GPU, not the host: record an event on the load stream after each layer and make the compute stream wait for it (cudaStreamWaitEvent); never synchronize the load stream inside the layer loop"},
	{Name: "host-sync-in-loop", Severities: []Severity{SevWarn}, Checklist: checkComputeOverlap, Where: InWindow | InDiagnose,
		Remediation: "take the synchronize or the .item() out of the per-layer loop: read scalars once per step, keep them on the GPU, or copy them asynchronously into pinned memory and wait on an event later"},
	{Name: "cross-qp-notify", Severities: []Severity{SevFail, SevWarn}, Checklist: checkNotifyOrder, Where: InWindow | InDiagnose,
		Remediation: "announce data on the QP that carried it (RDMA_WRITE_WITH_IMM for the last WRITE, or a SEND after the WRITEs on the same QP), " +
			"or post the notification only after polling the WRITEs' successful completions"},
	{Name: "mr-dereg-in-flight", Severities: []Severity{SevFail}, Checklist: checkDeregOrder, Where: InWindow | InDiagnose,
		Remediation: "deregister (and free or reuse) a region only after every request using it completed: poll their completions " +
			"(a signaled request covers the unsignaled ones before it on its QP), or reference-count the buffer"},
	{Name: "storage-far-pool", Severities: []Severity{SevWarn, SevInfo}, Checklist: checkStorageDirect, Where: InWindow | InDiagnose,
		Remediation: "put the storage device and the pool it fills on one node: read into a pool bound to the device's node, or serve the GPU from storage on its own socket"},
	{Name: "storage-shared-uplink", Severities: []Severity{SevWarn}, Checklist: checkStorageUplink, Where: InWindow | InDiagnose,
		Remediation: "stagger storage I/O and the GPU's copies in that direction, or move the NVMe (or the KV cache files) behind another switch"},
}

// checkComputeOverlap is seed 000's L2→L1 item 3.
const checkComputeOverlap = "L2→L1: do H2D and compute really overlap on different streams; look for an accidental synchronize or .item()"

// RuleNamed returns the registry entry of a rule.
func RuleNamed(name string) (Rule, bool) {
	for _, r := range Rules {
		if r.Name == name {
			return r, true
		}
	}
	return Rule{}, false
}

// newFinding makes a finding of a registered rule: its name and checklist
// item come from the registry, the remediation too unless the finding has
// a more precise one. An unregistered rule is a programming error.
func newFinding(rule string, sev Severity, subject, summary string, evidence []string, remediation string) *Finding {
	r, ok := RuleNamed(rule)
	if !ok {
		panic(fmt.Sprintf("correlate: finding of unregistered rule %q", rule))
	}
	if !slices.Contains(r.Severities, sev) {
		panic(fmt.Sprintf("correlate: rule %q has no severity %q in the registry", rule, sev))
	}
	if remediation == "" {
		remediation = r.Remediation
	}
	return &Finding{Rule: r.Name, Severity: sev, Subject: subject, Summary: summary, Evidence: evidence,
		Remediation: remediation, Checklist: r.Checklist}
}

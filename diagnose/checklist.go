package diagnose

import (
	"slices"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/judge"
)

// ChecklistItem is one item of the checklist `agent diagnose` answers: the
// seed's item, and the rows of the report that answer it. Its rules are
// those whose entry quotes one of its Seeds (correlate.Rule.Checklist), and
// its rows from window rules are those rules' checks (judge.Rule.Check), so
// a rule added to an item needs no line here. docs/rules.md is generated
// from Checklist; checklist_test.go holds it in step with the registries.
type ChecklistItem struct {
	Item  string   // the seed's item, in short
	Seeds []string // the seed checklist texts its rules quote (correlate.Checklist*); none: no rule
	// HostRows are the report rows (check names) that answer it besides
	// the window rules' checks: the host and process checks, listings.
	HostRows []string
	Note     string // what the other cells leave out: a verdict without a rule, a flag it needs
}

// Rules are the finding rules of the item, in the registry's order.
func (it ChecklistItem) Rules() []string {
	var out []string
	for _, r := range correlate.Rules {
		if slices.Contains(it.Seeds, r.Checklist) {
			out = append(out, r.Name)
		}
	}
	return out
}

// Rows are the report rows that answer the item: its host rows, then the
// check of each window rule that raises one of its rules in diagnose.
func (it ChecklistItem) Rows() []string {
	rows := slices.Clone(it.HostRows)
	rules := it.Rules()
	for _, r := range judge.Rules() {
		for _, name := range r.Raises() {
			c, _ := correlate.RuleNamed(name)
			if slices.Contains(rules, name) && c.Where&correlate.InDiagnose != 0 && !slices.Contains(rows, r.Check()) {
				rows = append(rows, r.Check())
			}
		}
	}
	return rows
}

// Checklist is seed 000's checklist ("排查清单", items 1–8 in its order)
// with the path, link and RDMA items of seeds 000 and 002, in the order the
// documentation lists them.
var Checklist = []ChecklistItem{
	{Item: "path: how CPU, GPU, NIC, NVMe connect", HostRows: []string{"PCI topology", "H2D path per GPU"},
		Note: "no rule: INFO, WARN when a link above the GPU is narrower"},
	{Item: "path ceiling: each link's trained speed and width", HostRows: []string{"PCIe links"}, Seeds: []string{correlate.ChecklistLink}},
	{Item: "the link is not the bottleneck", Seeds: []string{correlate.ChecklistUnderused},
		Note: "`agent run` only: the GPU's link counters over its windows"},
	{Item: "IOMMU translation", HostRows: []string{"IOMMU"}, Seeds: []string{correlate.ChecklistIOMMU}},
	{Item: "GPUDirect RDMA through the nearest NIC", HostRows: []string{"RDMA NIC per GPU"}, Seeds: []string{correlate.ChecklistNIC}},
	{Item: "pinned memory is taken from the kernel", HostRows: []string{"pinned memory", "hugepages"}, Seeds: []string{correlate.ChecklistPinnedMem}},
	{Item: "1. is the source pinned", Seeds: []string{correlate.ChecklistPinned}},
	{Item: "2. the host pool's NUMA node; binding silently skipped", HostRows: []string{"numactl", "NUMA binding", "memory by NUMA node"},
		Seeds: []string{correlate.ChecklistPoolNode}},
	{Item: "3. H2D really overlaps compute; accidental synchronize / `.item()`", Seeds: []string{correlate.ChecklistComputeOverlap},
		Note: "serialized-load needs `--kernels`"},
	{Item: "4. cut into too many small pieces", Seeds: []string{correlate.ChecklistFragments}},
	{Item: "5. an RDMA receive on the GPU's inbound lane", Seeds: []string{correlate.ChecklistOverlap}},
	{Item: "6. storage straight into the registered pool", Seeds: []string{correlate.ChecklistStorageDirect},
		Note: "needs `--trace-storage-reads` (diagnose and run)"},
	{Item: "7. storage vs H2D: host memory, a shared switch uplink", HostRows: []string{"storage devices"}, Seeds: []string{correlate.ChecklistStorageUplink}},
	{Item: "8. GPUDirect Storage", HostRows: []string{"GPUDirect Storage"}, Note: "no rule: PASS, WARN compatibility mode, INFO, SKIP"},
	{Item: "seed 002 §8.3: in flight must cover B × L", Seeds: []string{correlate.ChecklistInFlight}},
	{Item: "seed 002 §5: completed is not consumable", Seeds: []string{correlate.ChecklistNotifyOrder, correlate.ChecklistDeregOrder}},
	{Item: "seed 002 §6: the KV data plane on RDMA, TCP for control only", Seeds: []string{correlate.ChecklistTransport},
		Note: "judged on the transfer libraries' records (UCX, libfabric): their transport and device"},
	{Item: "seed 002 §6.2: congestion (CNP, ECN, PFC)", Seeds: []string{correlate.ChecklistCongestion}},
}

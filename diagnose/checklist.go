package diagnose

// ChecklistItem is one item of the checklist `agent diagnose` answers: the
// seed's item, the rows of the report that answer it, and the finding rules
// it can report. docs/rules.md is generated from Checklist and
// correlate.Rules; checklist_test.go holds them in step with the registry
// and with the row names the checks emit.
type ChecklistItem struct {
	Item  string   // the seed's item, in short
	Rows  []string // the report rows (check names) that answer it; none: `agent run` alone judges it
	Rules []string // the rules it can report (correlate.Rules), each in one item only
	Note  string   // what the other cells leave out: a verdict without a rule, a flag it needs
}

// Checklist is seed 000's checklist ("排查清单", items 1–8 in its order)
// with the path, link and RDMA items of seeds 000 and 002, in the order the
// documentation lists them.
var Checklist = []ChecklistItem{
	{Item: "path: how CPU, GPU, NIC, NVMe connect", Rows: []string{"PCI topology", "H2D path per GPU"},
		Note: "no rule: INFO, WARN when a link above the GPU is narrower"},
	{Item: "path ceiling: each link's trained speed and width", Rows: []string{"PCIe links"}, Rules: []string{"link-degraded"}},
	{Item: "the link is not the bottleneck", Rules: []string{"link-underused"},
		Note: "`agent run` only: the GPU's link counters over its windows"},
	{Item: "IOMMU translation", Rows: []string{"IOMMU"}, Rules: []string{"iommu-translated"}},
	{Item: "GPUDirect RDMA through the nearest NIC", Rows: []string{"RDMA NIC per GPU"}, Rules: []string{"far-nic"}},
	{Item: "pinned memory is taken from the kernel", Rows: []string{"pinned memory", "hugepages"}, Rules: []string{"pinned-pressure"}},
	{Item: "1. is the source pinned", Rows: []string{"pageable copies"}, Rules: []string{"pageable-copy"}},
	{Item: "2. the host pool's NUMA node; binding silently skipped", Rows: []string{"numactl", "NUMA binding", "host pages of copies", "memory by NUMA node"},
		Rules: []string{"remote-numa-pool", "numa-bind-skipped"}},
	{Item: "3. H2D really overlaps compute; accidental synchronize / `.item()`", Rows: []string{"H2D vs compute overlap and syncs"},
		Rules: []string{"serialized-load", "host-sync-in-loop"}, Note: "serialized-load needs `--kernels`"},
	{Item: "4. cut into too many small pieces", Rows: []string{"fragmentation"}, Rules: []string{"fragmented-copies"}},
	{Item: "5. an RDMA receive on the GPU's inbound lane", Rows: []string{"same-direction overlap"}, Rules: []string{"same-direction-overlap"}},
	{Item: "6. storage straight into the registered pool", Rows: []string{"storage into the pool"}, Rules: []string{"storage-far-pool"},
		Note: "needs `--trace-storage-reads` (diagnose and run)"},
	{Item: "7. storage vs H2D: host memory, a shared switch uplink", Rows: []string{"storage vs H2D", "storage devices"}, Rules: []string{"storage-shared-uplink"}},
	{Item: "8. GPUDirect Storage", Rows: []string{"GPUDirect Storage"}, Note: "no rule: PASS, WARN compatibility mode, INFO, SKIP"},
	{Item: "seed 002 §8.3: in flight must cover B × L", Rows: []string{"in-flight sufficiency"}, Rules: []string{"too-little-in-flight"}},
	{Item: "seed 002 §5: completed is not consumable", Rows: []string{"RDMA ordering"}, Rules: []string{"cross-qp-notify", "mr-dereg-in-flight"}},
	{Item: "seed 002 §6.2: congestion (CNP, ECN, PFC)", Rows: []string{"RDMA congestion"}, Rules: []string{"rdma-congestion"}},
}

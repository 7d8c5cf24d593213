package topology

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

const smiTestdata = "testdata/topo_m"

// smiCell is one cell read off a sample by hand.
type smiCell struct{ a, b, raw string }

type smiSample struct {
	file    string
	devices []string
	nics    []string          // NICs(): RDMA names in column order
	legend  map[string]string // nil: no NIC Legend block
	nearest map[string]string
	cpu     map[string]string // nil: column absent
	numa    map[string]string
	gpuNUMA map[string]string
	// cell, when set, gives every cell of the matrix.
	cell func(a, b string) string
	// cells are spot checks (read off the text by hand).
	cells []smiCell
	// nearestNIC is NearestNIC() where it differs from nearest (NICs
	// without RDMA names); unnamed is UnnamedNICs().
	nearestNIC map[string]string
	unnamed    []string
	// notes are the parser's Notes, exactly.
	notes []string
	// gluedLabels: rows start with their name glued to their cells, which
	// only reads when each row starts a line (no one-line variant).
	gluedLabels bool
}

func smiSeq(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

func smiConcat(a ...[]string) []string {
	var out []string
	for _, s := range a {
		out = append(out, s...)
	}
	return out
}

// smiPerGPU builds a per-GPU map for GPU0..GPU(n-1).
func smiPerGPU(n int, f func(i int) string) map[string]string {
	m := map[string]string{}
	for i := 0; i < n; i++ {
		m[fmt.Sprintf("GPU%d", i)] = f(i)
	}
	return m
}

func smiIndexMap(vals ...string) map[string]string {
	m := map[string]string{}
	for i, v := range vals {
		m[fmt.Sprint(i)] = v
	}
	return m
}

func smiLegend(vals ...string) map[string]string {
	m := map[string]string{}
	for i, v := range vals {
		m[fmt.Sprintf("NIC%d", i)] = v
	}
	return m
}

// smiDevIndex returns the number in GPU<n>, NIC<n> or mlx5_<n>.
func smiDevIndex(d string) int {
	i := strings.LastIndexAny(d, "U_C") // GPU7, NIC7, mlx5_7
	var n int
	fmt.Sscan(d[i+1:], &n)
	return n
}

// smiHGX is the cell rule of an HGX board with 8 GPUs on an NVSwitch (nv)
// and one NIC per GPU behind the GPU's PCIe switch (near), GPUk with NICk;
// numa gives each device's NUMA node.
func smiHGX(nv, near string, numa func(d string) int) func(a, b string) string {
	return func(a, b string) string {
		ga, gb := smiIsGPU(a), smiIsGPU(b)
		switch {
		case a == b:
			return "X"
		case ga && gb:
			return nv
		case ga != gb && smiDevIndex(a) == smiDevIndex(b) && !strings.HasSuffix(a, "8") && !strings.HasSuffix(b, "8"):
			return near
		case numa(a) == numa(b):
			return "NODE"
		}
		return "SYS"
	}
}

// smiHalf puts devices 0-3 on NUMA node 0 and 4-7 on node 1.
func smiHalf(d string) int { return smiDevIndex(d) / 4 }

var smiSamples = []smiSample{
	{
		// Old format: mlx5_N columns, no NIC Legend, no GPU NUMA ID.
		file:    "princeton_della-i14g20_2xA100_2xmlx5_oldformat.txt",
		devices: []string{"GPU0", "GPU1", "mlx5_0", "mlx5_1"},
		nics:    []string{"mlx5_0", "mlx5_1"},
		nearest: smiIndexMap("mlx5_0", "mlx5_1"),
		cpu:     map[string]string{"GPU0": "0-63", "GPU1": "64-127"},
		numa:    map[string]string{"GPU0": "0", "GPU1": "1"},
		cell: func(a, b string) string {
			m := map[string]string{
				"GPU0 GPU0": "X", "GPU0 GPU1": "SYS", "GPU0 mlx5_0": "NODE", "GPU0 mlx5_1": "SYS",
				"GPU1 GPU1": "X", "GPU1 mlx5_0": "SYS", "GPU1 mlx5_1": "NODE",
				"mlx5_0 mlx5_0": "X", "mlx5_0 mlx5_1": "SYS",
				"mlx5_1 mlx5_1": "X",
			}
			if c, ok := m[a+" "+b]; ok {
				return c
			}
			return m[b+" "+a]
		},
	},
	{
		// IBM POWER9 (Traverse): NUMA nodes 0 and 8, NV3 pairs, two NICs
		// per socket behind one switch (NODE to both GPUs of the socket:
		// the tie goes to the lower name).
		file:    "princeton_traverse_4xV100_power9_4xmlx5_numa0_8_oldformat.txt",
		devices: smiConcat(smiSeq("GPU", 4), smiSeq("mlx5_", 4)),
		nics:    smiSeq("mlx5_", 4),
		nearest: smiIndexMap("mlx5_0", "mlx5_0", "mlx5_2", "mlx5_2"),
		cpu:     smiPerGPU(4, func(i int) string { return [2]string{"0-63", "64-127"}[i/2] }),
		numa:    smiPerGPU(4, func(i int) string { return [2]string{"0", "8"}[i/2] }),
		cell: func(a, b string) string {
			socket := func(d string) int { return smiDevIndex(d) / 2 }
			switch {
			case a == b:
				return "X"
			case socket(a) != socket(b):
				return "SYS"
			case smiIsGPU(a) && smiIsGPU(b):
				return "NV3"
			case !smiIsGPU(a) && !smiIsGPU(b):
				return "PIX"
			}
			return "NODE"
		},
		cells: []smiCell{
			{"GPU0", "GPU1", "NV3"}, {"GPU1", "GPU2", "SYS"}, {"GPU3", "mlx5_2", "NODE"},
			{"GPU3", "mlx5_3", "NODE"}, {"GPU0", "mlx5_3", "SYS"}, {"mlx5_2", "mlx5_3", "PIX"},
		},
	},
	{
		// Canonical HGX H100: GPUk-NICk PIX, NV18 mesh, 2 NUMA nodes.
		file:    "sglang-issue-30401_8xH100_8xmlx5_2numa_spaces.txt",
		devices: smiConcat(smiSeq("GPU", 8), smiSeq("NIC", 8)),
		nics:    smiSeq("mlx5_", 8),
		legend:  smiLegend(smiSeq("mlx5_", 8)...),
		nearest: smiIndexMap(smiSeq("mlx5_", 8)...),
		cpu: smiPerGPU(8, func(i int) string {
			return [2]string{"0-47,96-143", "48-95,144-191"}[i/4]
		}),
		numa:    smiPerGPU(8, func(i int) string { return fmt.Sprint(i / 4) }),
		gpuNUMA: smiPerGPU(8, func(int) string { return "N/A" }),
		cell:    smiHGX("NV18", "PIX", smiHalf),
		cells: []smiCell{
			{"GPU0", "NIC0", "PIX"}, {"GPU0", "NIC3", "NODE"}, {"GPU0", "NIC4", "SYS"},
			{"GPU7", "NIC7", "PIX"}, {"GPU5", "GPU2", "NV18"}, {"NIC6", "NIC7", "NODE"},
			{"NIC0", "NIC7", "SYS"}, {"mlx5_3", "GPU3", "PIX"},
		},
	},
	{
		// DGX A100 (old format): 12 mlx5 columns, PXB pairs, NUMA nodes 1/3/5/7,
		// storage NICs mlx5_4/5 and mlx5_10/11 SYS to every GPU.
		file:    "gengwg-cheatsheets_dgxa100_8xA100_12xmlx5_oldformat.txt",
		devices: smiConcat(smiSeq("GPU", 8), smiSeq("mlx5_", 12)),
		nics:    smiSeq("mlx5_", 12),
		nearest: smiIndexMap("mlx5_0", "mlx5_0", "mlx5_2", "mlx5_2", "mlx5_6", "mlx5_6", "mlx5_8", "mlx5_8"),
		cpu: smiPerGPU(8, func(i int) string {
			return [4]string{"48-63,176-191", "16-31,144-159", "112-127,240-255", "80-95,208-223"}[i/2]
		}),
		numa: smiPerGPU(8, func(i int) string { return [4]string{"3", "1", "7", "5"}[i/2] }),
		cell: func(a, b string) string {
			// PCIe switch of each device: GPU pairs share one with two NICs.
			sw := func(d string) int {
				if smiIsGPU(d) {
					return [8]int{0, 0, 1, 1, 3, 3, 4, 4}[smiDevIndex(d)]
				}
				return smiDevIndex(d) / 2
			}
			switch {
			case a == b:
				return "X"
			case smiIsGPU(a) && smiIsGPU(b):
				return "NV12"
			case sw(a) != sw(b):
				return "SYS"
			case sw(a) == 2 || sw(a) == 5: // mlx5_4/5 and mlx5_10/11
				return "PIX"
			}
			return "PXB"
		},
		cells: []smiCell{
			{"GPU0", "mlx5_0", "PXB"}, {"GPU1", "mlx5_1", "PXB"}, {"GPU4", "mlx5_6", "PXB"},
			{"GPU7", "mlx5_9", "PXB"}, {"GPU0", "mlx5_4", "SYS"}, {"mlx5_4", "mlx5_5", "PIX"},
			{"mlx5_10", "mlx5_11", "PIX"}, {"mlx5_0", "mlx5_1", "PXB"}, {"GPU3", "GPU6", "NV12"},
		},
	},
	{
		// DGX-1 `topo -mp`: PCIe-only relations, PHB across the socket's switches.
		file:    "gengwg-cheatsheets_dgx1_topo-mp_8xV100_4xmlx5_phb.txt",
		devices: smiConcat(smiSeq("GPU", 8), smiSeq("mlx5_", 4)),
		nics:    smiSeq("mlx5_", 4),
		nearest: smiIndexMap("mlx5_0", "mlx5_0", "mlx5_1", "mlx5_1", "mlx5_2", "mlx5_2", "mlx5_3", "mlx5_3"),
		cpu: smiPerGPU(8, func(i int) string {
			return [2]string{"0-19,40-59", "20-39,60-79"}[i/4]
		}),
		numa: smiPerGPU(8, func(i int) string { return fmt.Sprint(i / 4) }),
		cell: func(a, b string) string {
			sw := func(d string) int { // PCIe switch: GPU pair k with mlx5_k
				if smiIsGPU(d) {
					return smiDevIndex(d) / 2
				}
				return smiDevIndex(d)
			}
			switch {
			case a == b:
				return "X"
			case sw(a)/2 != sw(b)/2:
				return "SYS"
			case sw(a) == sw(b):
				return "PIX"
			}
			return "PHB"
		},
		cells: []smiCell{
			{"GPU0", "GPU1", "PIX"}, {"GPU0", "GPU2", "PHB"}, {"GPU0", "GPU4", "SYS"},
			{"GPU2", "mlx5_0", "PHB"}, {"GPU2", "mlx5_1", "PIX"}, {"GPU7", "mlx5_3", "PIX"},
			{"GPU7", "mlx5_2", "PHB"}, {"mlx5_0", "mlx5_1", "PHB"}, {"mlx5_1", "mlx5_2", "SYS"},
		},
	},
	{
		// DGX-1 `topo -m`: NV1/NV2 hybrid cube mesh, NIC columns in the
		// order mlx5_0, mlx5_2, mlx5_1, mlx5_3, CPU Affinity only, no final
		// newline.
		file:    "msccl-tools_dgx1_8xV100_4xmlx5_unsorted_nolastnewline.txt",
		devices: smiConcat(smiSeq("GPU", 8), []string{"mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3"}),
		nics:    []string{"mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3"},
		nearest: smiIndexMap("mlx5_0", "mlx5_0", "mlx5_1", "mlx5_1", "mlx5_2", "mlx5_2", "mlx5_3", "mlx5_3"),
		cpu: smiPerGPU(8, func(i int) string {
			return [2]string{"0-19,40-59", "20-39,60-79"}[i/4]
		}),
		cells: []smiCell{
			{"GPU0", "GPU1", "NV1"}, {"GPU0", "GPU3", "NV2"}, {"GPU0", "GPU4", "NV2"},
			{"GPU0", "GPU5", "SYS"}, {"GPU2", "GPU6", "NV1"}, {"GPU5", "GPU7", "NV1"},
			{"GPU0", "mlx5_0", "PIX"}, {"GPU0", "mlx5_1", "PHB"}, {"GPU0", "mlx5_2", "SYS"},
			{"GPU3", "mlx5_1", "PIX"}, {"GPU5", "mlx5_2", "PIX"}, {"GPU6", "mlx5_3", "PIX"},
			{"GPU6", "mlx5_2", "PHB"}, {"mlx5_0", "mlx5_1", "PHB"}, {"mlx5_2", "mlx5_3", "PHB"},
			{"mlx5_0", "mlx5_2", "SYS"},
		},
	},
	{
		// B300 + ConnectX-8 bonded RoCE (mlx5_bond_N), GPUk-NICk PXB.
		file:    "deepep-issue-590_8xB300_8xmlx5_bond_pxb_spaces.txt",
		devices: smiConcat(smiSeq("GPU", 8), smiSeq("NIC", 8)),
		nics:    smiSeq("mlx5_bond_", 8),
		legend:  smiLegend(smiSeq("mlx5_bond_", 8)...),
		nearest: smiIndexMap(smiSeq("mlx5_bond_", 8)...),
		cpu: smiPerGPU(8, func(i int) string {
			return [2]string{"0-63,128-191", "64-127,192-255"}[i/4]
		}),
		numa:    smiPerGPU(8, func(i int) string { return fmt.Sprint(i / 4) }),
		gpuNUMA: smiPerGPU(8, func(int) string { return "N/A" }),
		cell:    smiHGX("NV18", "PXB", smiHalf),
		cells: []smiCell{
			{"GPU0", "NIC0", "PXB"}, {"GPU3", "mlx5_bond_3", "PXB"}, {"GPU4", "mlx5_bond_3", "SYS"},
			{"GPU4", "mlx5_bond_5", "NODE"}, {"NIC7", "NIC4", "NODE"},
		},
	},
	{
		// H800 with 9 NICs: legend mlx5_0, mlx5_3..mlx5_9 and a bonded
		// mlx5_bond_0 (NIC8) on NUMA node 0 next to no GPU.
		file:    "sglang-issue-28424_8xH800_9nic_mlx5_0_3-9_bond_spaces.txt",
		devices: smiConcat(smiSeq("GPU", 8), smiSeq("NIC", 9)),
		nics:    []string{"mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9", "mlx5_bond_0"},
		legend:  smiLegend("mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9", "mlx5_bond_0"),
		nearest: smiIndexMap("mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"),
		cpu: smiPerGPU(8, func(i int) string {
			return [2]string{"0-55,112-167", "56-111,168-223"}[i/4]
		}),
		numa:    smiPerGPU(8, func(i int) string { return fmt.Sprint(i / 4) }),
		gpuNUMA: smiPerGPU(8, func(int) string { return "N/A" }),
		cell: smiHGX("NV8", "PIX", func(d string) int {
			if d == "NIC8" {
				return 0
			}
			return smiHalf(d)
		}),
		cells: []smiCell{
			{"GPU1", "NIC1", "PIX"}, {"GPU1", "mlx5_3", "PIX"}, {"GPU0", "mlx5_bond_0", "NODE"},
			{"GPU7", "NIC8", "SYS"}, {"NIC8", "NIC3", "NODE"}, {"NIC8", "NIC4", "SYS"},
			{"GPU0", "GPU7", "NV8"},
		},
	},
	{
		// H20 VM pasted without its NIC Legend: the NICs keep their
		// column names and have no RDMA name, so no SGLang map; GPUk is PIX
		// to NIC(7-k).
		file:       "nccl-tests-issue-321_8xH20_vm_8nic_nolegend_spaces.txt",
		devices:    smiConcat(smiSeq("GPU", 8), smiSeq("NIC", 8)),
		nics:       smiSeq("NIC", 8),
		unnamed:    smiSeq("NIC", 8),
		nearest:    map[string]string{},
		nearestNIC: smiIndexMap("NIC7", "NIC6", "NIC5", "NIC4", "NIC3", "NIC2", "NIC1", "NIC0"),
		cpu:        smiPerGPU(8, func(i int) string { return [2]string{"0-63", "64-127"}[i/4] }),
		numa:       smiPerGPU(8, func(i int) string { return fmt.Sprint(i / 4) }),
		gpuNUMA:    smiPerGPU(8, func(int) string { return "N/A" }),
		cell: func(a, b string) string {
			// NICs 4-7 sit on NUMA node 0 with GPUs 0-3.
			node := func(d string) int {
				if smiIsGPU(d) {
					return smiDevIndex(d) / 4
				}
				return 1 - smiDevIndex(d)/4
			}
			switch {
			case a == b:
				return "X"
			case smiIsGPU(a) && smiIsGPU(b):
				return "NV18"
			case smiIsGPU(a) != smiIsGPU(b) && smiDevIndex(a)+smiDevIndex(b) == 7:
				return "PIX"
			case node(a) == node(b):
				return "NODE"
			}
			return "SYS"
		},
		cells: []smiCell{{"GPU0", "NIC7", "PIX"}, {"GPU4", "NIC3", "PIX"}, {"GPU0", "NIC4", "NODE"}, {"NIC0", "NIC4", "SYS"}},
		notes: []string{"nccl-tests-issue-321_8xH20_vm_8nic_nolegend_spaces.txt:1: no NIC Legend block: NIC0, NIC1, NIC2, NIC3, NIC4, NIC5, NIC6, NIC7 keep their column names, their RDMA devices are unknown (no GPU → RDMA device map)"},
	},
	{
		// Header printed with its column names glued together
		// ("GPU0GPU1NIC0…NIC3CPU AffinityNUMA AffinityGPU NUMA ID"), rows
		// intact; RoCE names rocep<bus>s0f<fn>.
		file:    "gdr114-notes_2xV100_4nic_rocep_glued_header.txt",
		devices: smiConcat(smiSeq("GPU", 2), smiSeq("NIC", 4)),
		nics:    []string{"rocep4s0f0", "rocep4s0f1", "rocep137s0f0", "rocep137s0f1"},
		legend:  smiLegend("rocep4s0f0", "rocep4s0f1", "rocep137s0f0", "rocep137s0f1"),
		nearest: smiIndexMap("rocep4s0f0", "rocep137s0f0"),
		cpu:     map[string]string{"GPU0": "0-13,28-41", "GPU1": "14-27,42-55"},
		numa:    map[string]string{"GPU0": "0", "GPU1": "1"},
		gpuNUMA: map[string]string{"GPU0": "N/A", "GPU1": "N/A"},
		cell: func(a, b string) string {
			side := func(d string) int { // GPU0 with NIC0/1, GPU1 with NIC2/3
				if smiIsGPU(d) {
					return smiDevIndex(d)
				}
				return smiDevIndex(d) / 2
			}
			switch {
			case a == b:
				return "X"
			case side(a) != side(b):
				return "SYS"
			case smiIsGPU(a) || smiIsGPU(b):
				return "PHB"
			}
			return "PIX"
		},
		notes: []string{`gdr114-notes_2xV100_4nic_rocep_glued_header.txt:1: header field "GPU0GPU1NIC0NIC1NIC2NIC3" read as GPU0 GPU1 NIC0 NIC1 NIC2 NIC3 (column names glued together)`},
	},
	{
		// DGX-1 from a 2017 course page: the first header field glues
		// GPU0…GPU7 and mlx5_0, cells SOC (pre-NODE drivers), CPU Affinity
		// 1-1, NIC columns mlx5_0, mlx5_2, mlx5_1, mlx5_3.
		file:    "rse-sheffield_dgx1_8xV100_4xmlx5_soc_glued_header.txt",
		devices: smiConcat(smiSeq("GPU", 8), []string{"mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3"}),
		nics:    []string{"mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3"},
		nearest: smiIndexMap("mlx5_0", "mlx5_0", "mlx5_1", "mlx5_1", "mlx5_2", "mlx5_2", "mlx5_3", "mlx5_3"),
		cpu:     smiPerGPU(8, func(int) string { return "1-1" }),
		cell: func(a, b string) string {
			sw := func(d string) int { // PCIe switch: GPU pair k with mlx5_k
				if smiIsGPU(d) {
					return smiDevIndex(d) / 2
				}
				return smiDevIndex(d)
			}
			mesh := map[string]bool{} // the hybrid cube mesh, one NVLink per pair
			for _, p := range []string{"01", "02", "03", "04", "12", "13", "15", "23", "26", "37", "45", "46", "47", "56", "57", "67"} {
				mesh["GPU"+p[:1]+" GPU"+p[1:]], mesh["GPU"+p[1:]+" GPU"+p[:1]] = true, true
			}
			switch {
			case a == b:
				return "X"
			case mesh[a+" "+b]:
				return "NV1"
			case smiIsGPU(a) && smiIsGPU(b):
				return "SOC"
			case sw(a)/2 != sw(b)/2:
				return "SOC"
			case sw(a) == sw(b):
				return "PIX"
			}
			return "PHB"
		},
		cells: []smiCell{{"GPU0", "mlx5_0", "PIX"}, {"GPU7", "mlx5_3", "PIX"}, {"GPU6", "mlx5_2", "PHB"}, {"GPU0", "GPU5", "SOC"}},
		notes: []string{`rse-sheffield_dgx1_8xV100_4xmlx5_soc_glued_header.txt:1: header field "GPU0GPU1GPU2GPU3GPU4GPU5GPU6GPU7mlx5_0" read as GPU0 GPU1 GPU2 GPU3 GPU4 GPU5 GPU6 GPU7 mlx5_0 (column names glued together)`},
	},
	{
		// An HTML table read as text: every cell glued, row names too. The
		// relations read one way; "0-310N/A" reads as 0-31 0 N/A or 0-3 10
		// N/A, so the affinity cells are left out and named in the notes.
		file:        "ai-atlas-blog_3gpu_cells_glued_html_table.txt",
		devices:     smiSeq("GPU", 3),
		nearest:     map[string]string{},
		cpu:         map[string]string{},
		numa:        map[string]string{},
		gpuNUMA:     map[string]string{},
		gluedLabels: true,
		cell: func(a, b string) string {
			if a == b {
				return "X"
			}
			return "NODE"
		},
		notes: []string{
			`ai-atlas-blog_3gpu_cells_glued_html_table.txt:1: header field "GPU0GPU1GPU2" read as GPU0 GPU1 GPU2 (column names glued together)`,
			`ai-atlas-blog_3gpu_cells_glued_html_table.txt:2: row GPU0, column "CPU Affinity": glued cells "XNODENODE0-310N/A" split more than one way (X NODE NODE 0-3 10 N/A, or X NODE NODE 0-31 0 N/A): the row's affinity cells are left out, its device cells read X NODE NODE`,
			`ai-atlas-blog_3gpu_cells_glued_html_table.txt:3: row GPU1, column "CPU Affinity": glued cells "NODEXNODE0-310N/A" split more than one way (NODE X NODE 0-3 10 N/A, or NODE X NODE 0-31 0 N/A): the row's affinity cells are left out, its device cells read NODE X NODE`,
			`ai-atlas-blog_3gpu_cells_glued_html_table.txt:4: row GPU2, column "CPU Affinity": glued cells "NODENODEX0-310N/A" split more than one way (NODE NODE X 0-3 10 N/A, or NODE NODE X 0-31 0 N/A): the row's affinity cells are left out, its device cells read NODE NODE X`,
		},
	},
	{
		// sglang#30401 with every run of whitespace, line breaks included,
		// collapsed to one space (derived: see testdata/topo_m/README.md).
		file:    "sglang-issue-30401_8xH100_8xmlx5_collapsed_oneline_derived.txt",
		devices: smiConcat(smiSeq("GPU", 8), smiSeq("NIC", 8)),
		nics:    smiSeq("mlx5_", 8),
		legend:  smiLegend(smiSeq("mlx5_", 8)...),
		nearest: smiIndexMap(smiSeq("mlx5_", 8)...),
		cpu: smiPerGPU(8, func(i int) string {
			return [2]string{"0-47,96-143", "48-95,144-191"}[i/4]
		}),
		numa:    smiPerGPU(8, func(i int) string { return fmt.Sprint(i / 4) }),
		gpuNUMA: smiPerGPU(8, func(int) string { return "N/A" }),
		cell:    smiHGX("NV18", "PIX", smiHalf),
		notes:   []string{"sglang-issue-30401_8xH100_8xmlx5_collapsed_oneline_derived.txt:1: rows follow the header on the same line (line breaks lost); rows are told apart by their names"},
	},
}

func smiReadFixture(t testing.TB, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(smiTestdata, file))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseNvidiaSMISamples(t *testing.T) {
	for _, s := range smiSamples {
		t.Run(s.file, func(t *testing.T) {
			m, err := ParseNvidiaSMI(bytes.NewReader(smiReadFixture(t, s.file)), s.file)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(m.Devices, s.devices) {
				t.Errorf("Devices = %v, want %v", m.Devices, s.devices)
			}
			var gpus []string
			for _, d := range s.devices {
				if strings.HasPrefix(d, "GPU") {
					gpus = append(gpus, d)
				}
			}
			if got := m.GPUs(); !reflect.DeepEqual(got, gpus) {
				t.Errorf("GPUs() = %v, want %v", got, gpus)
			}
			if got := m.NICs(); !reflect.DeepEqual(got, s.nics) {
				t.Errorf("NICs() = %v, want %v", got, s.nics)
			}
			if !reflect.DeepEqual(m.NICLegend, s.legend) {
				t.Errorf("NICLegend = %v, want %v", m.NICLegend, s.legend)
			}
			if got := m.NearestRDMA(); !reflect.DeepEqual(got, s.nearest) {
				t.Errorf("NearestRDMA() = %v, want %v", got, s.nearest)
			}
			wantNIC := s.nearestNIC
			if wantNIC == nil {
				wantNIC = s.nearest
			}
			if got := m.NearestNIC(); !reflect.DeepEqual(got, wantNIC) {
				t.Errorf("NearestNIC() = %v, want %v", got, wantNIC)
			}
			if got := m.UnnamedNICs(); !reflect.DeepEqual(got, s.unnamed) {
				t.Errorf("UnnamedNICs() = %v, want %v", got, s.unnamed)
			}
			if !reflect.DeepEqual(m.Notes, s.notes) {
				t.Errorf("Notes:\n%s\nwant\n%s", strings.Join(m.Notes, "\n"), strings.Join(s.notes, "\n"))
			}
			for _, c := range []struct {
				name      string
				got, want map[string]string
			}{
				{"CPUAffinity", m.CPUAffinity, s.cpu},
				{"NUMAAffinity", m.NUMAAffinity, s.numa},
				{"GPUNUMAID", m.GPUNUMAID, s.gpuNUMA},
			} {
				if !reflect.DeepEqual(c.got, c.want) {
					t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
				}
			}
			if len(m.Rel) != len(s.devices)*len(s.devices) {
				t.Errorf("%d cells, want %d", len(m.Rel), len(s.devices)*len(s.devices))
			}
			if s.cell != nil {
				for _, a := range s.devices {
					for _, b := range s.devices {
						if got, want := m.Rel[[2]string{a, b}], s.cell(a, b); got != want {
							t.Errorf("%s/%s = %q, want %q", a, b, got, want)
						}
					}
				}
			}
			for _, c := range s.cells {
				for _, pair := range [][2]string{{c.a, c.b}, {c.b, c.a}} {
					if got, ok := m.Cell(pair[0], pair[1]); !ok || got != c.raw {
						t.Errorf("Cell(%s, %s) = %q, %v; want %q", pair[0], pair[1], got, ok, c.raw)
					}
					rel, ok := m.Relation(pair[0], pair[1])
					n, nvOK := m.NVLinks(pair[0], pair[1])
					if strings.HasPrefix(c.raw, "NV") {
						if ok || !nvOK || fmt.Sprintf("NV%d", n) != c.raw {
							t.Errorf("%s/%s: Relation = %q, %v and NVLinks = %d, %v; want no relation and %s", pair[0], pair[1], rel, ok, n, nvOK, c.raw)
						}
					} else if want := strings.Replace(c.raw, "SOC", "SYS", 1); !ok || string(rel) != want || nvOK {
						t.Errorf("%s/%s: Relation = %q, %v (NVLinks ok %v); want %s", pair[0], pair[1], rel, ok, nvOK, c.raw)
					}
				}
			}
		})
	}
}

// Every sample parses to the same matrix however it was copied: tabs
// expanded, CRLF, a prompt before it, an escape-coloured header, trailing
// blanks, shell noise after it, runs of blanks collapsed to one space,
// blank lines between the rows (a double-spaced paste), and every line
// break from the header on lost (the notes then say so).
func TestParseNvidiaSMIVariants(t *testing.T) {
	variants := map[string]func(string) string{
		"expand-tabs": smiExpandTabs,
		"crlf":        func(s string) string { return strings.ReplaceAll(s, "\n", "\r\n") },
		"prompt": func(s string) string {
			return "root@host:/tmp# nvidia-smi topo -m\nNVIDIA Topology:\n\n" + s
		},
		"ansi-header": func(s string) string {
			i := strings.Index(s, "GPU0")
			j := i + strings.Index(s[i:], "\n")
			return s[:i] + "\x1b[4m" + s[i:j] + "\x1b[0m" + s[j:]
		},
		"trailing-blanks": func(s string) string { return strings.ReplaceAll(s, "\n", "  \t\n") },
		"noise-after": func(s string) string {
			return s + "\n\nulimit soft: 1048576\nNIC Legend mentioned in prose: yes\n$ \n"
		},
		"collapse-blanks": func(s string) string {
			lines := strings.Split(s, "\n")
			for i, l := range lines {
				lines[i] = strings.Join(strings.Fields(l), " ")
			}
			return strings.Join(lines, "\n")
		},
		"double-spaced": func(s string) string { return strings.ReplaceAll(s, "\n", "\n\n") },
		"one-line":      smiOneLine,
	}
	for _, s := range smiSamples {
		text := string(smiReadFixture(t, s.file))
		base, err := ParseNvidiaSMI(strings.NewReader(text), s.file)
		if err != nil {
			t.Fatal(err)
		}
		base.Notes = nil
		for name, f := range variants {
			if name == "one-line" && s.gluedLabels {
				continue // a row name glued to its cells is found only at the start of a line
			}
			m, err := ParseNvidiaSMI(strings.NewReader(f(text)), s.file)
			if err != nil {
				t.Errorf("%s %s: %v", s.file, name, err)
				continue
			}
			if name == "one-line" && !slices.ContainsFunc(m.Notes, func(n string) bool { return strings.Contains(n, "line breaks lost") }) {
				t.Errorf("%s %s: no note on the lost line breaks: %q", s.file, name, m.Notes)
			}
			m.Notes = nil
			if !reflect.DeepEqual(m, base) {
				t.Errorf("%s %s: parsed differently:\n%+v\nwant\n%+v", s.file, name, m, base)
			}
		}
	}
}

// smiOneLine collapses every run of whitespace from the header line on,
// line breaks included, to one space: a paste whose line breaks were lost.
func smiOneLine(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], "GPU0") {
			return strings.Join(append(lines[:i:i], strings.Join(strings.Fields(strings.Join(lines[i:], "\n")), " ")), "\n")
		}
	}
	return s
}

// smiExpandTabs expands tabs to 8-column stops, as a terminal copy does.
func smiExpandTabs(s string) string {
	var b strings.Builder
	col := 0
	for _, r := range s {
		switch r {
		case '\t':
			n := 8 - col%8
			b.WriteString(strings.Repeat(" ", n))
			col += n
		case '\n':
			b.WriteRune(r)
			col = 0
		default:
			b.WriteRune(r)
			col++
		}
	}
	return b.String()
}

func TestParseNvidiaSMIRowsInAnyOrder(t *testing.T) {
	const file = "princeton_della-i14g20_2xA100_2xmlx5_oldformat.txt"
	lines := strings.Split(string(smiReadFixture(t, file)), "\n")
	lines[1], lines[4] = lines[4], lines[1] // GPU0 row <-> mlx5_1 row
	m, err := ParseNvidiaSMI(strings.NewReader(strings.Join(lines, "\n")), file)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := m.Relation("GPU1", "mlx5_1"); !ok || r != RelNODE {
		t.Errorf("GPU1/mlx5_1 = %v, %v", r, ok)
	}
}

func TestParseNvidiaSMISOCAndMinimal(t *testing.T) {
	// Pre-NODE drivers print SOC for the socket link; one GPU, no NIC.
	const in = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSOC\t0-11\nGPU1\tSOC\t X \t70-99,102-107\n"
	m, err := ParseNvidiaSMI(strings.NewReader(in), "soc.txt")
	if err != nil {
		t.Fatal(err)
	}
	if got := m.CPUAffinity["GPU1"]; got != "70-99,102-107" {
		t.Errorf("CPUAffinity[GPU1] = %q", got)
	}
	if m.NUMAAffinity != nil || m.GPUNUMAID != nil || m.NICLegend != nil {
		t.Errorf("absent columns are not nil: %v %v %v", m.NUMAAffinity, m.GPUNUMAID, m.NICLegend)
	}
	if r, ok := m.Relation("GPU1", "GPU0"); !ok || r != RelSYS {
		t.Errorf("SOC relation = %v, %v; want SYS", r, ok)
	}
	if c, _ := m.Cell("GPU0", "GPU1"); c != "SOC" {
		t.Errorf("raw cell = %q", c)
	}
	if got := m.NearestRDMA(); len(got) != 0 {
		t.Errorf("NearestRDMA without NICs = %v", got)
	}
	if _, ok := m.Relation("GPU0", "GPU9"); ok {
		t.Error("Relation of an unknown device is ok")
	}
	if _, ok := m.NVLinks("GPU0", "GPU1"); ok {
		t.Error("NVLinks of a SOC cell is ok")
	}
}

// Ties go to the lowest RDMA name in natural order, whatever the column order.
func TestNearestRDMATies(t *testing.T) {
	const in = "" +
		"\tGPU0\tGPU1\tNIC0\tNIC1\tNIC2\n" +
		"GPU0\t X \tNV4\tPXB\tPXB\tPXB\n" +
		"GPU1\tNV4\t X \tSYS\tNODE\tNODE\n" +
		"NIC0\tPXB\tSYS\t X \tSYS\tSYS\n" +
		"NIC1\tPXB\tNODE\tSYS\t X \tPIX\n" +
		"NIC2\tPXB\tNODE\tSYS\tPIX\t X \n" +
		"\nNIC Legend:\n\n  NIC0: mlx5_bond_0\n  NIC1: mlx5_10\n  NIC2: mlx5_2\n"
	m, err := ParseNvidiaSMI(strings.NewReader(in), "ties.txt")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"0": "mlx5_2", "1": "mlx5_2"}
	if got := m.NearestRDMA(); !reflect.DeepEqual(got, want) {
		t.Errorf("NearestRDMA() = %v, want %v", got, want)
	}
}

func TestSMINaturalLess(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"mlx5_2", "mlx5_10", true},
		{"mlx5_10", "mlx5_2", false},
		{"mlx5_0", "mlx5_bond_0", true},
		{"mlx5_9", "mlx5_bond_0", true},
		{"mlx5_bond_1", "mlx5_bond_10", true},
		{"mlx5_1", "mlx5_1", false},
		{"mlx5_01", "mlx5_1", false},
		{"ib0", "mlx5_0", true},
	} {
		if got := naturalLess(c.a, c.b); got != c.want {
			t.Errorf("naturalLess(%q, %q) = %v", c.a, c.b, got)
		}
	}
}

func TestParseNvidiaSMIErrors(t *testing.T) {
	della := string(smiReadFixture(t, "princeton_della-i14g20_2xA100_2xmlx5_oldformat.txt"))
	h100 := string(smiReadFixture(t, "sglang-issue-30401_8xH100_8xmlx5_2numa_spaces.txt"))
	replaceLine := func(s string, n int, f func(string) string) string {
		lines := strings.Split(s, "\n")
		lines[n-1] = f(lines[n-1])
		return strings.Join(lines, "\n")
	}
	for _, c := range []struct {
		name, in, want string
	}{
		{"empty", "", "bad.txt: no nvidia-smi topo -m header"},
		{"no header", "GPU 0: NVIDIA H100\nLegend:\n", "bad.txt:2: no nvidia-smi topo -m header"},
		{"shifted row", replaceLine(della, 3, func(s string) string { return strings.Replace(s, "SYS\t", "", 1) }),
			"bad.txt:3: row GPU1 has 5 cells, want 6 (4 devices, 2 affinity columns): its X is under column GPU0, want GPU1 (columns shifted: a cell is missing or extra before it)"},
		{"short row", replaceLine(della, 2, func(s string) string { return strings.Replace(s, "\t0-63", "", 1) }),
			"bad.txt:2: row GPU0 has 5 cells, want 6 (4 devices, 2 affinity columns)"},
		{"glued cells that no split fits", replaceLine(della, 2, func(s string) string { return strings.Replace(s, "SYS\tNODE\tSYS\t0-63", "SYSNODE\t0-63", 1) }),
			`bad.txt:2: row GPU0, column GPU1: glued cells "SYSNODE": no split gives the row its cells (row GPU0 has 4 cells, want 6 (4 devices, 2 affinity columns))`},
		{"glued cells split more than one way", "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV412-23\nGPU1\tNV4\t X \t12-23\n",
			`bad.txt:2: row GPU0, column GPU1: glued cells "NV412-23" split more than one way (NV4 12-23, or NV41 2-23)`},
		{"unknown cell glued to a row name", replaceLine(della, 3, func(s string) string { return strings.Replace(s, "GPU1\t", "GPU1FOO\t", 1) }),
			`bad.txt:3: row "GPU1FOO" is not a column of the header at line 1`},
		{"glued header that splits more than one way", "\tGPU0\txyxyz\nGPU0\tX\nxy\nxyz\nxyx\nyz\n",
			`bad.txt:1: header field "xyxyz" splits into device names more than one way (xy xyz, or xyx yz)`},
		{"ragged NIC row", replaceLine(della, 4, func(s string) string { return s + "SYS" }),
			"bad.txt:4: row mlx5_0 has 5 cells, want 4 or 6"},
		{"unknown cell", replaceLine(della, 2, func(s string) string { return strings.Replace(s, "SYS", "FOO", 1) }),
			`bad.txt:2: row GPU0, column GPU1: unknown cell "FOO"`},
		{"duplicate header device", replaceLine(della, 1, func(s string) string { return strings.Replace(s, "GPU1", "GPU0", 1) }),
			"bad.txt:1: duplicate device GPU0 in header"},
		{"duplicate row", replaceLine(della, 3, func(s string) string { return strings.Replace(s, "GPU1", "GPU0", 1) }),
			"bad.txt:3: duplicate row GPU0 (first at line 2)"},
		{"unknown row", replaceLine(della, 4, func(s string) string { return strings.Replace(s, "mlx5_0", "mlx5_7", 1) }),
			`bad.txt:4: row "mlx5_7" is not a column`},
		{"asymmetric", replaceLine(della, 4, func(s string) string { return strings.Replace(s, "NODE", "PIX", 1) }),
			"bad.txt:4: matrix not symmetric: GPU0/mlx5_0 is NODE but mlx5_0/GPU0 is PIX (lines 2 and 4)"},
		{"diagonal not X", replaceLine(della, 3, func(s string) string { return strings.Replace(s, " X ", "SYS", 1) }),
			`bad.txt:3: row GPU1: diagonal cell is "SYS", want X`},
		{"X off diagonal", replaceLine(della, 2, func(s string) string { return strings.Replace(s, "SYS", "X", 1) }),
			"bad.txt:2: row GPU0, column GPU1: X off the diagonal"},
		{"bad affinity", replaceLine(della, 2, func(s string) string { return strings.Replace(s, "0-63", "0-63x", 1) }),
			`bad.txt:2: row GPU0, column "CPU Affinity": "0-63x" is not a list`},
		{"truncated", strings.Join(strings.Split(della, "\n")[:4], "\n"),
			"bad.txt:4: matrix ends after 3 of 4 rows"},
		{"row missing", replaceLine(della, 4, func(string) string { return "" }),
			`bad.txt:7: matrix ends after 3 of 4 rows (header at line 1) at "Legend:": no row for mlx5_0`},
		{"row missing, one line", smiOneLine(replaceLine(della, 4, func(string) string { return "" })),
			`bad.txt:1: matrix ends after 3 of 4 rows (header at line 1) at "Legend:": no row for mlx5_0`},
		{"a row's cells after the last column", replaceLine(della, 4, func(s string) string { return s + "SYS\tSYS\tFOO" }),
			`bad.txt:4: row mlx5_0, after the last column: unknown cell "FOO"`},
		{"a NIC row with a bad affinity cell", replaceLine(della, 4, func(s string) string { return s + "SYS\tFOO" }),
			`bad.txt:4: row mlx5_0, column "NUMA Affinity": "FOO" is not a list of numbers or N/A`},
		{"partial NIC legend", strings.Replace(h100, "  NIC5: mlx5_5\n", "", 1),
			"bad.txt:1: column NIC5 has no entry"},
		{"legend names unknown NIC", strings.Replace(h100, "  NIC7: mlx5_7\n", "  NIC7: mlx5_7\n  NIC8: mlx5_8\n", 1),
			"bad.txt:39: NIC Legend names NIC8, which is not a column"},
		{"legend duplicate value", strings.Replace(h100, "NIC7: mlx5_7", "NIC7: mlx5_6", 1),
			"bad.txt:38: NIC Legend maps both NIC6 and NIC7 to mlx5_6"},
		{"legend maps to a column", strings.Replace(h100, "NIC7: mlx5_7", "NIC7: NIC6", 1),
			"bad.txt:38: NIC Legend maps NIC7 to NIC6, which is not an RDMA device name"},
		{"second legend", h100 + "\nNIC Legend:\n\n  NIC0: mlx5_0\n",
			"bad.txt:40: second NIC Legend block"},
		{"line too long", "\tGPU0\n" + strings.Repeat("x", smiMaxLine+1), "bad.txt:2: line longer than"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := ParseNvidiaSMI(strings.NewReader(c.in), "bad.txt")
			if err == nil {
				t.Fatalf("no error; parsed %v", m.Devices)
			}
			if !strings.HasPrefix(err.Error(), c.want) {
				t.Errorf("error = %q, want prefix %q", err, c.want)
			}
		})
	}
}

// Real pastes that cannot be read whole are refused with the row, column
// and field that end the reading.
func TestParseNvidiaSMIRefusedSamples(t *testing.T) {
	for _, c := range []struct{ file, want string }{
		// The issue text as the index holds it stops inside the NIC0 row.
		{"vllm-issue-13855_8xH100_12nic_glued_cells_truncated.txt",
			"vllm-issue-13855_8xH100_12nic_glued_cells_truncated.txt:10: row NIC0 has 14 cells, want 20 or 23 (20 devices, 3 affinity columns)"},
		// One line (breaks lost), glued cells, cut off inside GPU7's CPU Affinity.
		{"vllm-issue-13855_wiki-copy_collapsed_oneline_truncated.txt",
			`vllm-issue-13855_wiki-copy_collapsed_oneline_truncated.txt:1: row GPU7, column "CPU Affinity": "56-111,1..." is not a list of numbers or N/A`},
	} {
		t.Run(c.file, func(t *testing.T) {
			m, err := ParseNvidiaSMI(bytes.NewReader(smiReadFixture(t, c.file)), c.file)
			if err == nil {
				t.Fatalf("no error; parsed %v", m.Devices)
			}
			if err.Error() != c.want {
				t.Errorf("error = %q\nwant    %q", err, c.want)
			}
		})
	}
}

// nvidia-smi itself printed vllm#13855's NIC8 column without a tab before
// NIC9: "NIC8NIC9" in the header, "NODENODE" and "NODEPXB" in the rows of
// GPU4-GPU7. Each of those rows reads one way, with 20 device cells.
func TestSMIGluedRowsVLLM13855(t *testing.T) {
	const file = "vllm-issue-13855_8xH100_12nic_glued_cells_truncated.txt"
	p := &smiParser{name: file}
	if err := p.read(bytes.NewReader(smiReadFixture(t, file))); err != nil {
		t.Fatal(err)
	}
	var hdr []smiTok
	for _, f := range strings.Fields(p.lines[0]) {
		hdr = append(hdr, smiTok{s: f, line: 1})
	}
	devs, extras, err := p.parseHeader(hdr, p.rowNames(0))
	if err != nil {
		t.Fatal(err)
	}
	if want := smiConcat(smiSeq("GPU", 8), smiSeq("NIC", 12)); !reflect.DeepEqual(devs, want) {
		t.Fatalf("devices %v, want %v", devs, want)
	}
	if want := []string{"CPU Affinity", "NUMA Affinity", "GPU NUMA ID"}; !reflect.DeepEqual(extras, want) {
		t.Fatalf("affinity columns %v, want %v", extras, want)
	}
	nv := func(gpu int) []string { // NV18 to every other GPU
		out := make([]string, 8)
		for i := range out {
			out[i] = "NV18"
		}
		out[gpu] = "X"
		return out
	}
	split := func(s string) []string { return strings.Fields(s) }
	for _, c := range []struct {
		line int
		nics string // the 12 NIC cells, read off the text with the glued field split
		note string
	}{
		{5, "NODE NODE NODE NODE NODE PXB SYS SYS SYS SYS SYS SYS", ""},
		{6, "SYS SYS SYS SYS SYS SYS PXB NODE NODE NODE NODE NODE", `"NODENODE" as NODE NODE`},
		{7, "SYS SYS SYS SYS SYS SYS NODE NODE NODE PXB NODE NODE", `"NODEPXB" as NODE PXB`},
		{8, "SYS SYS SYS SYS SYS SYS NODE NODE NODE NODE PXB NODE", `"NODENODE" as NODE NODE`},
		{9, "SYS SYS SYS SYS SYS SYS NODE NODE NODE NODE NODE PXB", `"NODENODE" as NODE NODE`},
	} {
		f := strings.Fields(p.lines[c.line-1])
		row := smiRow{label: f[0], line: c.line}
		for _, s := range f[1:] {
			row.toks = append(row.toks, smiTok{s: s, line: c.line})
		}
		p.notes = nil
		rel, aff, err := p.rowCells(row, devs, extras, false)
		if err != nil {
			t.Fatalf("line %d: %v", c.line, err)
		}
		gpu := smiDevIndex(row.label)
		if want := append(nv(gpu), split(c.nics)...); !reflect.DeepEqual(rel, want) {
			t.Errorf("row %s: %v\nwant %v", row.label, rel, want)
		}
		wantAff := []string{[2]string{"0-55,112-167", "56-111,168-223"}[gpu/4], fmt.Sprint(gpu / 4), "N/A"}
		if !reflect.DeepEqual(aff, wantAff) {
			t.Errorf("row %s affinity %v, want %v", row.label, aff, wantAff)
		}
		var wantNotes []string
		if c.note != "" {
			wantNotes = []string{fmt.Sprintf("%s:%d: row %s: glued cells read %s", file, c.line, row.label, c.note)}
		}
		if !reflect.DeepEqual(p.notes, wantNotes) {
			t.Errorf("row %s notes %q, want %q", row.label, p.notes, wantNotes)
		}
	}
}

// Glued cells in a real file read back to the file's own cells; the note
// names the field and how it was read.
func TestParseNvidiaSMIGluedCells(t *testing.T) {
	const file = "princeton_della-i14g20_2xA100_2xmlx5_oldformat.txt"
	text := string(smiReadFixture(t, file))
	base, err := ParseNvidiaSMI(strings.NewReader(text), file)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ from, to, note string }{
		{"SYS\t0-63\t0", "SYS0-630", ""}, // "0-630" could be one list, or 0-63 and 0, or 0-6 and 30: left out
		{"\tSYS\t0-63", "\tSYS0-63", `princeton_della-i14g20_2xA100_2xmlx5_oldformat.txt:2: row GPU0: glued cells read "SYS0-63" as SYS 0-63`},
		{"GPU1\tSYS\t X ", "GPU1SYSX", `princeton_della-i14g20_2xA100_2xmlx5_oldformat.txt:3: row GPU1: glued cells read "SYSX" as SYS X`},
		{"mlx5_1\tSYS\tNODE\tSYS", "mlx5_1\tSYSNODESYS", `princeton_della-i14g20_2xA100_2xmlx5_oldformat.txt:5: row mlx5_1: glued cells read "SYSNODESYS" as SYS NODE SYS`},
	} {
		in := strings.Replace(text, c.from, c.to, 1)
		if in == text {
			t.Fatalf("%q not in %s", c.from, file)
		}
		m, err := ParseNvidiaSMI(strings.NewReader(in), file)
		if err != nil {
			t.Errorf("%q: %v", c.to, err)
			continue
		}
		if c.note == "" {
			if _, ok := m.CPUAffinity["GPU0"]; ok || len(m.Notes) != 1 || !strings.Contains(m.Notes[0], "split more than one way") {
				t.Errorf("%q: CPU affinity %v, notes %q; want GPU0's left out and named", c.to, m.CPUAffinity, m.Notes)
			}
			continue
		}
		if !reflect.DeepEqual(m.Notes, []string{c.note}) {
			t.Errorf("%q: notes %q, want %q", c.to, m.Notes, c.note)
		}
		m.Notes = nil
		if !reflect.DeepEqual(m, base) {
			t.Errorf("%q: parsed differently:\n%+v\nwant\n%+v", c.to, m, base)
		}
	}
}

// The H100 sample without its NIC Legend block keeps every relation; its
// NICs have no RDMA name, so the SGLang map is empty and the notes say why.
func TestParseNvidiaSMIWithoutNICLegend(t *testing.T) {
	const file = "sglang-issue-30401_8xH100_8xmlx5_2numa_spaces.txt"
	text := string(smiReadFixture(t, file))
	full, err := ParseNvidiaSMI(strings.NewReader(text), file)
	if err != nil {
		t.Fatal(err)
	}
	m, err := ParseNvidiaSMI(strings.NewReader(text[:strings.Index(text, "NIC Legend:")]), file)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(m.Rel, full.Rel) || !reflect.DeepEqual(m.CPUAffinity, full.CPUAffinity) {
		t.Error("relations or affinities differ from the full file")
	}
	if m.NICLegend != nil || len(m.NearestRDMA()) != 0 || !reflect.DeepEqual(m.UnnamedNICs(), smiSeq("NIC", 8)) {
		t.Errorf("legend %v, NearestRDMA %v, UnnamedNICs %v", m.NICLegend, m.NearestRDMA(), m.UnnamedNICs())
	}
	if want := smiIndexMap(smiSeq("NIC", 8)...); !reflect.DeepEqual(m.NearestNIC(), want) {
		t.Errorf("NearestNIC %v, want %v", m.NearestNIC(), want)
	}
	if len(m.Notes) != 1 || !strings.Contains(m.Notes[0], "no NIC Legend block") {
		t.Errorf("notes %q", m.Notes)
	}
}

func FuzzParseNvidiaSMI(f *testing.F) {
	files, err := filepath.Glob(filepath.Join(smiTestdata, "*.txt"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no seeds in %s: %v", smiTestdata, err)
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add([]byte(smiExpandTabs(string(b))))
	}
	f.Add([]byte("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tSOC\t0-11\nGPU1\tSOC\t X \t12-23\n"))
	// Partial excerpts: every line of a sample cut at character 72 (its
	// GPU columns only), and a small matrix whose NIC column is cut off.
	for _, file := range files {
		b, _ := os.ReadFile(file)
		f.Add([]byte(smiCut(string(b), func(_ int, l string) string { return l[:min(len(l), 72)] })))
	}
	f.Add([]byte("\tGPU0\tGPU1\nGPU0\t X \tSYS\nGPU1\tSYS\t X \nmlx5_0\tNODE\tSYS\t X \n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		const name = "fuzz.txt"
		m, err := ParseNvidiaSMI(bytes.NewReader(in), name)
		if err != nil {
			if !strings.HasPrefix(err.Error(), name+":") {
				t.Fatalf("error does not start with the file name: %v", err)
			}
			return
		}
		// Rows beyond the header (a partial excerpt) have no cells with
		// each other; every other pair has one, both ways the same.
		n, k := len(m.Devices), len(m.Beyond)
		if n == 0 || len(m.Rel) != n*n-k*(k-1) {
			t.Fatalf("%d devices (%d beyond the header), %d cells", n, k, len(m.Rel))
		}
		if k > 0 && !slices.ContainsFunc(m.Notes, func(s string) bool { return strings.Contains(s, "are not among them") }) {
			t.Fatalf("rows %v beyond the header without a note: %v", m.Beyond, m.Notes)
		}
		for _, a := range m.Devices {
			for _, b := range m.Devices {
				ab, ok1 := m.Rel[[2]string{a, b}]
				ba, ok2 := m.Rel[[2]string{b, a}]
				if a != b && slices.Contains(m.Beyond, a) && slices.Contains(m.Beyond, b) {
					if ok1 || ok2 {
						t.Fatalf("%s/%s: both beyond the header, yet a cell %q", a, b, ab)
					}
					continue
				}
				if !ok1 || !ok2 || ab != ba {
					t.Fatalf("%s/%s = %q, %s/%s = %q", a, b, ab, b, a, ba)
				}
				if (ab == "X") != (a == b) {
					t.Fatalf("%s/%s = %q", a, b, ab)
				}
			}
		}
		// Peer paths are symmetric, and NVLink exactly where the cell is NV#.
		var bdfs []string
		for i := range m.GPUs() {
			bdfs = append(bdfs, fmt.Sprintf("0000:%02x:00.0", i))
		}
		path := m.PeerPaths(bdfs)
		for i, a := range bdfs {
			for j, b := range bdfs {
				p, ok := path(a, b)
				q, okq := path(b, a)
				_, nv := m.NVLinks(m.GPUs()[i], m.GPUs()[j])
				if p != q || ok != okq || (p == PeerNVLink) != (nv && i != j) || (i == j && ok) {
					t.Fatalf("GPU%d→GPU%d: %q %v, back %q %v, NV# %v", i, j, p, ok, q, okq, nv)
				}
			}
		}
		for _, note := range m.Notes {
			if !strings.HasPrefix(note, name+":") {
				t.Fatalf("note does not start with the file name: %s", note)
			}
		}
		for _, aff := range []map[string]string{m.CPUAffinity, m.NUMAAffinity, m.GPUNUMAID} {
			for d, v := range aff {
				if _, ok := m.Rel[[2]string{d, d}]; !ok || !smiValidAffinity(v) {
					t.Fatalf("affinity %q of %q", v, d)
				}
			}
		}
		if len(m.GPUs())+len(m.NICs()) != n {
			t.Fatalf("GPUs %v + NICs %v != devices %v", m.GPUs(), m.NICs(), m.Devices)
		}
		for gpu, nic := range m.NearestRDMA() {
			found := false
			for _, x := range m.NICs() {
				found = found || x == nic
			}
			if !found || !smiIsGPU("GPU"+gpu) {
				t.Fatalf("NearestRDMA %s -> %s not a GPU/NIC pair", gpu, nic)
			}
		}
	})
}

// smiCut cuts a sample as a partial excerpt does, line by line: keep is
// given each line (its number from 1) and returns what stays of it.
func smiCut(text string, keep func(n int, line string) string) string {
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		lines[i] = keep(i+1, l)
	}
	return strings.Join(lines, "\n")
}

// A pasted topo -m whose header names fewer columns than it has rows (the
// NIC columns cut off, the NIC rows kept) is read by the columns there
// are, every GPU–NIC relation the same as the whole file's, and said in
// Notes; a row beyond the header that cannot be read so is refused naming
// the row, the column and the token. Each case cuts a real sample
// (testdata/topo_m), as its comment says.
func TestParseNvidiaSMICutExcerpt(t *testing.T) {
	const sglang = "sglang-issue-30401_8xH100_8xmlx5_2numa_spaces.txt"
	const della = "princeton_della-i14g20_2xA100_2xmlx5_oldformat.txt"
	sg := string(smiReadFixture(t, sglang))
	de := string(smiReadFixture(t, della))
	// sglang's matrix is 8-character cells: characters 1-72 are the row
	// name and the GPU0..GPU7 columns, 73-136 the NIC0..NIC7 columns.
	upTo72 := func(_ int, l string) string { return l[:min(len(l), 72)] }
	dropNICCols := func(n int, l string) string { // header and GPU rows lose NIC0..NIC7, affinity kept
		if n <= 9 && len(l) > 136 {
			return l[:72] + l[136:]
		}
		return l
	}
	legendless := func(s string) string { return s[:strings.Index(s, "Legend:")] }
	for _, c := range []struct {
		name, file, text string
		nics             []string // NICs() read
		cellsPast        bool     // a note on cells past the header's columns
		rdma             map[string]string
		err              string
	}{
		// `cut -c1-72`: the header and every row keep GPU0..GPU7 only
		// (affinity columns gone too); the legends' short lines survive.
		{"cut -c1-72", sglang, smiCut(sg, upTo72), smiSeq("mlx5_", 8), false,
			smiIndexMap(smiSeq("mlx5_", 8)...), ""},
		{"cut -c1-72, matrix only", sglang, legendless(smiCut(sg, upTo72)), smiSeq("NIC", 8), false, map[string]string{}, ""},
		// The NIC columns deleted from the header and the GPU rows, the NIC
		// rows left whole (16 cells: 8 past the header's columns).
		{"NIC columns deleted, NIC rows whole", sglang, smiCut(sg, dropNICCols), smiSeq("mlx5_", 8), true,
			smiIndexMap(smiSeq("mlx5_", 8)...), ""},
		// della (tabs, old format): `cut -f1-3,6-7` of the header and GPU
		// rows drops the mlx5_0/mlx5_1 columns; the mlx5 rows stay whole.
		{"della, mlx5 columns cut by cut -f", della, smiCut(de, func(n int, l string) string {
			if f := strings.Split(l, "\t"); n <= 3 && len(f) == 7 {
				return strings.Join([]string{f[0], f[1], f[2], f[5], f[6]}, "\t")
			}
			return l
		}), []string{"mlx5_0", "mlx5_1"}, true, map[string]string{"0": "mlx5_0", "1": "mlx5_1"}, ""},
		// Refused: a NIC row cut shorter than the header's columns.
		{"a NIC row shorter than the header", sglang, smiCut(sg, func(n int, l string) string {
			if n == 12 {
				return l[:40]
			}
			return upTo72(n, l)
		}), nil, false, nil, sglang + ":12: row NIC2, not a column of the header at line 1: 4 cells, fewer than the header's 8 device columns"},
		// Refused: a cell of a NIC row that is no relation.
		{"a NIC row with a damaged cell", sglang, strings.Replace(smiCut(sg, upTo72), "NIC3    NODE    NODE    NODE    PIX", "NIC3    NODE    NODE    NOPE    PIX", 1),
			nil, false, nil, sglang + `:13: row NIC3, not a column of the header at line 1: "NOPE" in column GPU2 is no relation`},
		// Refused: X in a column that is not the row's own.
		{"X under a GPU column", sglang, strings.Replace(smiCut(sg, upTo72), "NIC3    NODE    NODE    NODE    PIX", "NIC3    NODE    NODE    NODE     X ", 1),
			nil, false, nil, sglang + ":13: row NIC3, not a column of the header at line 1: X in column GPU3"},
	} {
		t.Run(c.name, func(t *testing.T) {
			full, err := ParseNvidiaSMI(strings.NewReader(map[string]string{sglang: sg, della: de}[c.file]), c.file)
			if err != nil {
				t.Fatal(err)
			}
			m, err := ParseNvidiaSMI(strings.NewReader(c.text), c.file)
			if c.err != "" {
				if err == nil || err.Error() != c.err {
					t.Fatalf("error %v, want %s", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(m.NICs(), c.nics) || len(m.GPUs()) != len(full.GPUs()) || len(m.Beyond) != len(c.nics) {
				t.Fatalf("GPUs %v NICs %v beyond %v", m.GPUs(), m.NICs(), m.Beyond)
			}
			for _, g := range full.GPUs() {
				for _, d := range full.Devices {
					want, _ := full.Cell(g, d)
					if got, ok := m.Cell(g, d); !ok || got != want {
						t.Errorf("%s/%s: %q %v, the whole file %q", g, d, got, ok, want)
					}
					if got, ok := m.Cell(d, g); !ok || got != want {
						t.Errorf("%s/%s: %q %v, the whole file %q", d, g, got, ok, want)
					}
				}
			}
			if _, ok := m.Cell(m.Beyond[0], m.Beyond[1]); ok {
				t.Errorf("%s/%s read, but the excerpt has no column for it", m.Beyond[0], m.Beyond[1])
			}
			notes := strings.Join(m.Notes, "\n")
			if !strings.Contains(notes, "are not among them (a partial excerpt, columns cut off?): read by the") ||
				strings.Contains(notes, "cells past the header's columns left out") != c.cellsPast {
				t.Errorf("notes %s", notes)
			}
			if !reflect.DeepEqual(m.NearestRDMA(), c.rdma) {
				t.Errorf("NearestRDMA %v, want %v", m.NearestRDMA(), c.rdma)
			}
		})
	}
}

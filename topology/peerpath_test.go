package topology

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// PeerPaths on real `nvidia-smi topo -m` outputs: NV# cells are NVLink;
// PCIe cells are PCIe only where the output shows NVLinks (a GPU pair of
// DGX-1's hybrid cube mesh without one is SYS: PCIe); a `topo -mp` output
// shows no NVLinks, so its PCIe cells say nothing of the peer path.
func TestPeerPaths(t *testing.T) {
	bdfs := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("0000:%02x:00.0", 0x10+i))
		}
		return out
	}
	for _, c := range []struct {
		file     string
		gpus     []string
		src, dst string
		want     string // "" unknown
	}{
		{"sglang-issue-30401_8xH100_8xmlx5_2numa_spaces.txt", bdfs(8), "0000:10:00.0", "0000:17:00.0", PeerNVLink},
		{"msccl-tools_dgx1_8xV100_4xmlx5_unsorted_nolastnewline.txt", bdfs(8), "0000:10:00.0", "0000:13:00.0", PeerNVLink}, // NV2
		{"msccl-tools_dgx1_8xV100_4xmlx5_unsorted_nolastnewline.txt", bdfs(8), "0000:10:00.0", "0000:15:00.0", PeerPCIe},   // SYS
		{"princeton_della-i14g20_2xA100_2xmlx5_oldformat.txt", bdfs(2), "0000:11:00.0", "0000:10:00.0", PeerPCIe},          // SYS, legend lists NV#
		{"gengwg-cheatsheets_dgx1_topo-mp_8xV100_4xmlx5_phb.txt", bdfs(8), "0000:10:00.0", "0000:11:00.0", ""},             // -mp: PIX says nothing of NVLink
		{"sglang-issue-30401_8xH100_8xmlx5_2numa_spaces.txt", bdfs(4), "0000:10:00.0", "0000:11:00.0", ""},                 // 4 GPUs here, 8 in the file
		{"sglang-issue-30401_8xH100_8xmlx5_2numa_spaces.txt", bdfs(8), "0000:10:00.0", "0000:3b:00.0", ""},                 // not a GPU of the host
		{"sglang-issue-30401_8xH100_8xmlx5_2numa_spaces.txt", bdfs(8), "0000:10:00.0", "0000:10:00.0", ""},                 // the same GPU
	} {
		f, err := os.Open(filepath.Join(smiTestdata, c.file))
		if err != nil {
			t.Fatal(err)
		}
		m, err := ParseNvidiaSMI(f, c.file)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		got, ok := m.PeerPaths(c.gpus)(c.src, c.dst)
		if got != c.want || ok != (c.want != "") {
			t.Errorf("%s %s→%s: %q, %v; want %q", c.file, c.src, c.dst, got, ok, c.want)
		}
	}
}

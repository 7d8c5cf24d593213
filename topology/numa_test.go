package topology

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/internal/ktext"
)

// numaSample is a sysfs tree's NUMA part as a sample gives it: each
// node's cpulist and distance row ("" none), and each CPU's package.
type numaSample struct {
	cpus, dist []string
	pkg        map[int]int
}

// readNumactlH reads the nodes and distances of a `numactl -H` output (a
// test helper: the agent reads sysfs, never this text).
func readNumactlH(t *testing.T, path string) numaSample {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var s numaSample
	sc := bufio.NewScanner(f)
	inDist := false
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		switch {
		case len(fields) >= 3 && fields[0] == "node" && fields[2] == "cpus:":
			var ids []string
			ids = append(ids, fields[3:]...)
			s.cpus = append(s.cpus, strings.Join(ids, ","))
		case len(fields) >= 2 && fields[0] == "node" && fields[1] == "distances:":
			inDist = true
		case inDist && len(fields) > 1 && strings.HasSuffix(fields[0], ":"):
			s.dist = append(s.dist, strings.Join(fields[1:], " "))
		}
	}
	return s
}

// readLscpuNodes reads "NUMA nodeN CPU(s): list" lines of an lscpu output.
func readLscpuNodes(t *testing.T, path string) numaSample {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s numaSample
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "NUMA node"); ok && strings.Contains(rest, "CPU(s):") {
			s.cpus = append(s.cpus, strings.TrimSpace(rest[strings.Index(rest, ":")+1:]))
			s.dist = append(s.dist, "")
		}
	}
	return s
}

// writeNUMATree writes the sample as sysfs does, ids compacted into a
// kernel list (the kernel writes "0-31", numactl prints every id).
func writeNUMATree(t *testing.T, s numaSample) string {
	t.Helper()
	root := t.TempDir()
	write := func(p, v string) {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range s.cpus {
		ids, err := ktext.ParseList(c)
		if c != "" && err != nil {
			t.Fatalf("node %d cpus %q: %v", i, c, err)
		}
		d := filepath.Join(root, "devices", "system", "node", "node"+strconv.Itoa(i))
		write(filepath.Join(d, "cpulist"), ktext.FormatList(ids))
		if i < len(s.dist) && s.dist[i] != "" {
			write(filepath.Join(d, "distance"), s.dist[i])
		}
		for _, cpu := range ids {
			if p, ok := s.pkg[cpu]; ok {
				write(filepath.Join(root, "devices", "system", "cpu", "cpu"+strconv.Itoa(cpu), "topology", "physical_package_id"), strconv.Itoa(p))
			}
		}
	}
	return root
}

// packages maps CPUs [lo, hi] to package p.
func packages(m map[int]int, p, lo, hi int) map[int]int {
	if m == nil {
		m = map[int]int{}
	}
	for c := lo; c <= hi; c++ {
		m[c] = p
	}
	return m
}

// Each node's package and where every pair of nodes sits, on trees built
// from real samples (testdata/numa/README.md says which package map and why).
func TestNodeSideSamples(t *testing.T) {
	asus := readNumactlH(t, "testdata/numa/asus_esc8000a_e12_2xEPYC9374F.txt")
	asus.pkg = packages(packages(nil, 0, 0, 31), 1, 32, 63)
	nps4 := readLscpuNodes(t, "testdata/numa/oyanghd_DGXA100-like_2xEPYC7742_NPS4_8numa_lscpu.txt")
	nps4.pkg = packages(packages(packages(packages(nil, 0, 0, 63), 1, 64, 127), 0, 128, 191), 1, 192, 255)
	one := readNumactlH(t, "testdata/numa/puget_wrx90_TR-PRO_1node.txt")
	one.pkg = packages(nil, 0, 0, 23)
	// The asus tree with a CPU-less node 2 added, as a CXL memory expander
	// on socket 1 would show (distances invented for the test: 10 to
	// itself, 20 to its socket's node 1, 40 to node 0).
	cxl := readNumactlH(t, "testdata/numa/asus_esc8000a_e12_2xEPYC9374F.txt")
	cxl.pkg = asus.pkg
	cxl.cpus = append(cxl.cpus, "")
	cxl.dist = []string{"10 32 40", "32 10 20", "40 20 10"}
	// The asus tree without physical_package_id files (a sysfs that hides
	// the CPU topology): every package unknown.
	hidden := readNumactlH(t, "testdata/numa/asus_esc8000a_e12_2xEPYC9374F.txt")

	for _, c := range []struct {
		name     string
		s        numaSample
		packages []int
		sides    map[[2]int]NodeSide
		why      map[[2]int]string
	}{
		{"2-socket EPYC 9374F, NPS1", asus, []int{0, 1},
			map[[2]int]NodeSide{{0, 0}: SameNode, {0, 1}: OtherSocket, {1, 0}: OtherSocket},
			map[[2]int]string{{0, 1}: "node 1 is on package 1, node 0 on package 0, distance 32"}},
		{"2-socket EPYC 7742, NPS4", nps4, []int{0, 0, 0, 0, 1, 1, 1, 1},
			map[[2]int]NodeSide{{0, 1}: SameSocket, {0, 3}: SameSocket, {5, 7}: SameSocket, {0, 4}: OtherSocket, {3, 4}: OtherSocket, {7, 0}: OtherSocket},
			map[[2]int]string{{0, 3}: "nodes 0 and 3 are both on package 0"}},
		{"1 node", one, []int{0}, map[[2]int]NodeSide{{0, 0}: SameNode, {0, 1}: SocketUnknown},
			map[[2]int]string{{0, 1}: "node 1 is not in this host's devices/system/node"}},
		{"memory-only node by distance", cxl, []int{0, 1, 1},
			map[[2]int]NodeSide{{1, 2}: SameSocket, {0, 2}: OtherSocket},
			map[[2]int]string{{1, 2}: "nodes 1 and 2 are both on package 1, distance 20"}},
		{"packages hidden", hidden, []int{-1, -1},
			map[[2]int]NodeSide{{0, 1}: SocketUnknown, {0, 0}: SameNode},
			map[[2]int]string{{0, 1}: "the package of node 0 is unknown (no "}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, err := Read(writeNUMATree(t, c.s))
			if err != nil {
				t.Fatal(err)
			}
			if len(h.Nodes) != len(c.packages) {
				t.Fatalf("nodes %+v", h.Nodes)
			}
			for i, n := range h.Nodes {
				if n.Package != c.packages[i] {
					t.Errorf("node %d package %d (%s), want %d", n.ID, n.Package, n.PackageFrom, c.packages[i])
				}
			}
			for k, want := range c.sides {
				got, why := h.NodeSide(k[0], k[1])
				if got != want {
					t.Errorf("NodeSide(%d, %d) = %d (%s), want %d", k[0], k[1], got, why, want)
				}
				if w, ok := c.why[k]; ok && !strings.Contains(why, w) {
					t.Errorf("NodeSide(%d, %d) says %q, want it to say %q", k[0], k[1], why, w)
				}
			}
		})
	}
	var nilHost *Host
	if side, why := nilHost.NodeSide(0, 1); side != SocketUnknown || why == "" {
		t.Errorf("nil host: %d %q", side, why)
	}
}

// A malformed physical_package_id is an error naming the file; CPUs of one
// node on two packages leave the node's package unknown, said why.
func TestReadPackagesBad(t *testing.T) {
	s := readNumactlH(t, "testdata/numa/asus_esc8000a_e12_2xEPYC9374F.txt")
	s.pkg = packages(packages(nil, 0, 0, 31), 1, 32, 63)
	root := writeNUMATree(t, s)
	p := filepath.Join(root, "devices", "system", "cpu", "cpu33", "topology", "physical_package_id")
	if err := os.WriteFile(p, []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h, err := Read(root)
	if err != nil {
		t.Fatal(err)
	}
	if n := h.Nodes[1]; n.Package != -1 || !strings.Contains(n.PackageFrom, "packages 1") || !strings.Contains(n.PackageFrom, "cpu33") {
		t.Errorf("node 1 on two packages: %d %q", n.Package, n.PackageFrom)
	}
	if err := os.WriteFile(p, []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(root); err == nil || !strings.Contains(err.Error(), p+": line 1") {
		t.Errorf("malformed package id: %v", err)
	}
}

package collectors

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// testdata/hosts/dgxa100-nps4 is a fixture tree for a dual EPYC 7742 in NPS4
// (8 nodes, 256 CPUs; lists from samples/numactl_hardware/oyanghd_*): pid
// 4242 is a container process with docker's default capabilities (no
// CAP_SYS_NICE) in a cpuset on node 3, pid 4243 an unconfined root process.
// The status files are the public mongod capture with those fields edited.
// testdata/hosts/nonuma has no devices/system/node, as with CONFIG_NUMA=n.

func TestReadHostFactsFixture(t *testing.T) {
	root := filepath.Join("testdata", "hosts", "dgxa100-nps4")
	tests := []struct {
		name, path string
		found      bool
		evidence   string
	}{
		{"found", "/usr/local/bin:/usr/bin:/bin", true, "numactl found at /usr/bin/numactl"},
		{"absent", "/usr/local/bin:/bin", false, "numactl not found in PATH=/usr/local/bin:/bin"},
		{"relative entries ignored", ".:usr/bin:", false, "numactl not found in PATH=.:usr/bin:"},
		{"empty PATH", "", false, "numactl not found in PATH="},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := ReadHostFacts(HostConfig{SysRoot: filepath.Join(root, "sys"), RootFS: filepath.Join(root, "rootfs"), PATH: tt.path})
			if err != nil {
				t.Fatal(err)
			}
			if h.Numactl.Value != tt.found || h.Numactl.Evidence != tt.evidence {
				t.Errorf("numactl %+v", h.Numactl)
			}
			if !reflect.DeepEqual(h.NodesOnline, []int{0, 1, 2, 3, 4, 5, 6, 7}) || len(h.CPUsOnline) != 256 || !h.MultiNode.Value {
				t.Errorf("nodes %v cpus %d multinode %+v", h.NodesOnline, len(h.CPUsOnline), h.MultiNode)
			}
			if want := "NUMA nodes online 0-7 (" + filepath.Join(root, "sys/devices/system/node/online") + ")"; h.NodesEvidence != want {
				t.Errorf("evidence %q, want %q", h.NodesEvidence, want)
			}
		})
	}
	// A file that is there but not executable is not a command.
	if p, err := LookPathIn("numastat", "/usr/bin", filepath.Join(root, "rootfs")); err == nil {
		t.Errorf("non-executable numastat found at %s", p)
	}
	if _, err := LookPathIn("../numactl", "/usr/bin", filepath.Join(root, "rootfs")); err == nil {
		t.Error("a path with a slash was looked up")
	}
}

func TestReadHostFactsNoNUMA(t *testing.T) {
	sys := filepath.Join("testdata", "hosts", "nonuma", "sys")
	h, err := ReadHostFacts(HostConfig{SysRoot: sys})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(h.NodesOnline, []int{0}) || h.MultiNode.Value || !strings.Contains(h.NodesEvidence, "kernel without NUMA") {
		t.Errorf("%+v", h)
	}
	// An unreadable tree is an error naming the file.
	if _, err := ReadHostFacts(HostConfig{SysRoot: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "devices/system/cpu/online") {
		t.Errorf("empty sysfs: %v", err)
	}
	bad := t.TempDir()
	os.MkdirAll(filepath.Join(bad, "devices/system/cpu"), 0o755)
	os.WriteFile(filepath.Join(bad, "devices/system/cpu/online"), []byte("0-\n"), 0o644)
	if _, err := ReadHostFacts(HostConfig{SysRoot: bad}); err == nil || !strings.Contains(err.Error(), "cpu/online:1: list") {
		t.Errorf("malformed online: %v", err)
	}
}

// ReadBindFacts on the NPS4 fixture: the status and cpuset files are the
// fixture's, numa_maps comes from the development machine's captures (the
// fixture has none), all copied into a temporary proc tree.
func TestReadBindFactsFixture(t *testing.T) {
	root := filepath.Join("testdata", "hosts", "dgxa100-nps4")
	proc := t.TempDir()
	copyFile := func(src, dst string) {
		t.Helper()
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		pid      int
		numaMaps string
		nice     bool
		cpuset   string
		mems     []int
		policies []string
	}{
		{4242, "lanewatch-dev_python_default.numa_maps", false, "/kubepods/burstable/pod7/ctr1", []int{3}, []string{"default"}},
		{4243, "lanewatch-dev_numactl_membind_0.numa_maps", true, "/", []int{0, 1, 2, 3, 4, 5, 6, 7}, []string{"bind:0"}},
	}
	for _, tt := range tests {
		dir := filepath.Join(proc, strconv.Itoa(tt.pid))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"status", "cpuset"} {
			copyFile(filepath.Join(root, "proc", strconv.Itoa(tt.pid), f), filepath.Join(dir, f))
		}
		copyFile(filepath.Join("testdata", "numa_maps", tt.numaMaps), filepath.Join(dir, "numa_maps"))
	}
	sys, empty := filepath.Join(root, "sys"), t.TempDir()
	for _, tt := range tests {
		bf, err := ReadBindFacts(proc, sys, tt.pid, empty) // no numactl there
		if err != nil {
			t.Fatal(err)
		}
		want := BindFacts{MemsAllowed: tt.mems, OnlineNodes: []int{0, 1, 2, 3, 4, 5, 6, 7}, Policies: tt.policies,
			CapSysNice: tt.nice, Cpuset: tt.cpuset}
		if !reflect.DeepEqual(bf, want) {
			t.Errorf("pid %d:\n got %+v\nwant %+v", tt.pid, bf, want)
		}
	}

	// A kernel without cpusets has no cpuset file: no error, Cpuset "".
	if err := os.Remove(filepath.Join(proc, "4243", "cpuset")); err != nil {
		t.Fatal(err)
	}
	if bf, err := ReadBindFacts(proc, sys, 4243, ""); err != nil || bf.Cpuset != "" || !bf.CapSysNice {
		t.Errorf("no cpuset file: %+v, %v", bf, err)
	}
	// A cpuset that cannot be read is an error.
	if err := os.Mkdir(filepath.Join(proc, "4243", "cpuset"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadBindFacts(proc, sys, 4243, ""); err == nil || !strings.Contains(err.Error(), "read cpuset") {
		t.Errorf("unreadable cpuset: %v", err)
	}
	// A missing process or numa_maps is an error.
	if _, err := ReadBindFacts(proc, sys, 1, ""); err == nil {
		t.Error("missing pid: no error")
	}
	if err := os.Remove(filepath.Join(proc, "4242", "numa_maps")); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadBindFacts(proc, sys, 4242, ""); err == nil || !strings.Contains(err.Error(), "numa_maps") {
		t.Errorf("missing numa_maps: %v", err)
	}
}

// On this machine, for the test process itself: the host facts come with
// evidence, and CAP_SYS_NICE must match the raw mask.
func TestReadBindFactsLive(t *testing.T) {
	h, err := ReadHostFacts(HostConfig{SysRoot: "/sys", PATH: os.Getenv("PATH")})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []Fact{h.Numactl, h.MultiNode} {
		if f.Evidence == "" {
			t.Errorf("fact without evidence: %+v", f)
		}
	}
	bf, err := ReadBindFacts("/proc", "/sys", os.Getpid(), "/usr/bin:/bin")
	if err != nil {
		t.Fatal(err)
	}
	if len(bf.OnlineNodes) == 0 || len(bf.MemsAllowed) == 0 || !reflect.DeepEqual(bf.Policies, []string{"default"}) {
		t.Errorf("%+v", bf)
	}
	st, err := ReadStatus("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if bf.CapSysNice != st.HasCap(CapSysNice) {
		t.Errorf("CapSysNice %v vs CapEff %#x", bf.CapSysNice, st.CapEff)
	}
	if _, err := FindNumactl(""); err == nil {
		t.Error("numactl found in an empty PATH")
	}
	t.Logf("host: %s; %s; pid: %+v", h.Numactl.Evidence, h.NodesEvidence, bf)
}

func TestAnonPolicies(t *testing.T) {
	nm := readNumaMapsFile(t, "lanewatch-dev_set_mempolicy_bind_static.numa_maps")
	if got := anonPolicies(nm); !reflect.DeepEqual(got, []string{"bind=static:0"}) {
		t.Errorf("got %v", got)
	}
	if got := anonPolicies([]NumaMapping{{Policy: "bind:1", File: "/lib"}}); !reflect.DeepEqual(got, []string{"bind:1"}) {
		t.Errorf("file-only: %v", got)
	}
}

// The development VM's meminfo capture on the NPS4 fixture (8 nodes), and
// this machine live.
func TestHostMetrics(t *testing.T) {
	proc := t.TempDir()
	b, err := os.ReadFile(filepath.Join("testdata", "meminfo", "lanewatch-dev.meminfo"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "meminfo"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectorFunc(NewHostMetrics(proc, filepath.Join("testdata", "hosts", "dgxa100-nps4", "sys")).Update))
	want := `
# HELP lanewatch_host_hugepage_size_bytes The default huge page size.
# TYPE lanewatch_host_hugepage_size_bytes gauge
lanewatch_host_hugepage_size_bytes 2.097152e+06
# HELP lanewatch_host_hugepages Huge pages of the default size, total and free.
# TYPE lanewatch_host_hugepages gauge
lanewatch_host_hugepages{state="free"} 0
lanewatch_host_hugepages{state="total"} 0
# HELP lanewatch_host_memory_bytes Host memory from /proc/meminfo: total, available (MemAvailable) and mlocked (pinned pages count here).
# TYPE lanewatch_host_memory_bytes gauge
lanewatch_host_memory_bytes{state="available"} 2.4824262656e+10
lanewatch_host_memory_bytes{state="mlocked"} 1.3307904e+07
lanewatch_host_memory_bytes{state="total"} 2.5276502016e+10
# HELP lanewatch_host_numa_nodes NUMA nodes online (1 on a kernel without NUMA).
# TYPE lanewatch_host_numa_nodes gauge
lanewatch_host_numa_nodes 8
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	live := NewHostMetrics("/proc", "/sys")
	ch := make(chan prometheus.Metric, 64)
	if err := live.Update(ch); err != nil || len(ch) < 4 {
		t.Errorf("live: %d metrics, %v", len(ch), err)
	}
	if err := NewHostMetrics(filepath.Join(proc, "absent"), "/sys").Update(make(chan prometheus.Metric, 64)); err == nil {
		t.Error("no meminfo: want an error")
	}
}

package collectors

import (
	"os"
	"path/filepath"
	"reflect"
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

func TestReadProcessFactsFixture(t *testing.T) {
	root := filepath.Join("testdata", "hosts", "dgxa100-nps4")
	h, err := ReadHostFacts(HostConfig{SysRoot: filepath.Join(root, "sys")})
	if err != nil {
		t.Fatal(err)
	}
	proc := filepath.Join(root, "proc")
	tests := []struct {
		pid                    int
		nice, cpus, mems       bool
		niceEv, cpusEv, memsEv string
	}{
		{4242, false, true, true,
			"pid 4242 CapEff 00000000a80425fb lacks CAP_SYS_NICE (bit 23)",
			"pid 4242 Cpus_allowed_list 48-63,176-191 of online CPUs 0-255 (cpuset /kubepods/burstable/pod7/ctr1)",
			"pid 4242 Mems_allowed_list 3 of online nodes 0-7 (cpuset /kubepods/burstable/pod7/ctr1)"},
		{4243, true, false, false,
			"pid 4243 CapEff 000001ffffffffff has CAP_SYS_NICE (bit 23)",
			"pid 4243 Cpus_allowed_list 0-255 covers online CPUs 0-255 (cpuset /)",
			"pid 4243 Mems_allowed_list 0-7 covers online nodes 0-7 (cpuset /)"},
	}
	for _, tt := range tests {
		pf, err := ReadProcessFacts(proc, tt.pid, h)
		if err != nil {
			t.Fatal(err)
		}
		got := []any{pf.CapSysNice, pf.CPUsConfined, pf.MemsConfined}
		want := []any{Fact{tt.nice, tt.niceEv}, Fact{tt.cpus, tt.cpusEv}, Fact{tt.mems, tt.memsEv}}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("pid %d:\n got %+v\nwant %+v", tt.pid, got, want)
		}
	}
	if _, err := ReadProcessFacts(proc, 1, h); err == nil {
		t.Error("missing pid: no error")
	}
}

// On this machine, for the test process itself: whatever the answers, they
// must come with evidence, and CAP_SYS_NICE must match the raw mask.
func TestReadFactsLive(t *testing.T) {
	h, err := ReadHostFacts(HostConfig{SysRoot: "/sys", PATH: os.Getenv("PATH")})
	if err != nil {
		t.Fatal(err)
	}
	pf, err := ReadProcessFacts("/proc", os.Getpid(), h)
	if err != nil {
		t.Fatal(err)
	}
	st, err := ReadStatus("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if pf.CapSysNice.Value != st.HasCap(CapSysNice) {
		t.Errorf("CapSysNice %+v vs CapEff %#x", pf.CapSysNice, st.CapEff)
	}
	for _, f := range []Fact{h.Numactl, h.MultiNode, pf.CapSysNice, pf.CPUsConfined, pf.MemsConfined} {
		if f.Evidence == "" {
			t.Errorf("fact without evidence: %+v", f)
		}
	}
	t.Logf("host: %s; %s; pid: %s; %s; %s", h.Numactl.Evidence, h.NodesEvidence, pf.CapSysNice.Evidence, pf.CPUsConfined.Evidence, pf.MemsConfined.Evidence)
}

func TestReadBindFactsLive(t *testing.T) {
	bf, err := ReadBindFacts("/proc", "/sys", os.Getpid(), "/usr/bin:/bin")
	if err != nil {
		t.Fatal(err)
	}
	if len(bf.OnlineNodes) == 0 || len(bf.MemsAllowed) == 0 || !reflect.DeepEqual(bf.Policies, []string{"default"}) {
		t.Errorf("%+v", bf)
	}
	if _, err := FindNumactl(""); err == nil {
		t.Error("numactl found in an empty PATH")
	}
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

package collectors

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lanewatch/lanewatch/internal/ktext"
)

// Fact is one yes/no observation and the text that shows it, ready to quote
// as the evidence of a finding.
type Fact struct {
	Value    bool
	Evidence string
}

// HostConfig says where to look. Tests point the roots at fixture trees.
type HostConfig struct {
	SysRoot string // sysfs mount, usually /sys
	// RootFS prefixes the PATH directories, for an agent that sees the host
	// filesystem under e.g. /host; "" means the agent's own root.
	RootFS string
	// PATH is searched for numactl: the agent's own, or better the target
	// process's environment, whose launcher would have run numactl.
	PATH string
}

// HostFacts are the host-wide facts the NUMA rules cite.
type HostFacts struct {
	// Numactl: numactl is on PATH (a launcher that wraps the server in
	// "numactl --membind" silently skips binding when it is absent).
	Numactl     Fact
	NumactlPath string
	// NodesOnline from <sys>/devices/system/node/online; [0] on a kernel
	// without NUMA (no such directory), said so in NodesEvidence.
	NodesOnline   []int
	NodesEvidence string
	// CPUsOnline from <sys>/devices/system/cpu/online.
	CPUsOnline []int
	// MultiNode: more than one node is online, so placement matters at all.
	MultiNode Fact
}

// ReadHostFacts gathers HostFacts. A missing numactl is a fact, not an error;
// an unreadable or malformed sysfs file is an error naming it.
func ReadHostFacts(cfg HostConfig) (HostFacts, error) {
	var h HostFacts
	if p, err := LookPathIn("numactl", cfg.PATH, cfg.RootFS); err == nil {
		h.NumactlPath = p
		h.Numactl = Fact{true, fmt.Sprintf("numactl found at %s", p)}
	} else {
		h.Numactl = Fact{false, fmt.Sprintf("numactl not found in PATH=%s", cfg.PATH)}
	}

	cpuPath := filepath.Join(cfg.SysRoot, "devices/system/cpu/online")
	cpus, err := readListFile(cpuPath)
	if err != nil {
		return h, err
	}
	h.CPUsOnline = cpus

	nodeDir := filepath.Join(cfg.SysRoot, "devices/system/node")
	nodePath := filepath.Join(nodeDir, "online")
	nodes, err := readListFile(nodePath)
	switch {
	case err == nil:
		h.NodesOnline = nodes
		h.NodesEvidence = fmt.Sprintf("NUMA nodes online %s (%s)", ktext.FormatList(nodes), nodePath)
	case errors.Is(err, fs.ErrNotExist) && !exists(nodeDir):
		h.NodesOnline = []int{0}
		h.NodesEvidence = fmt.Sprintf("no %s: kernel without NUMA, one node", nodeDir)
	default:
		return h, err
	}
	h.MultiNode = Fact{len(h.NodesOnline) > 1, h.NodesEvidence}
	return h, nil
}

// LookPathIn finds an executable named file in the directories of pathEnv
// (colon separated), each looked up under rootFS. Unlike exec.LookPath it
// takes PATH as an argument and a root, so the answer can be about another
// process's environment or a host seen from a container. Relative and empty
// PATH entries are skipped: they depend on a working directory we do not
// know. It returns the path as seen inside rootFS.
func LookPathIn(file, pathEnv, rootFS string) (string, error) {
	if file == "" || strings.Contains(file, "/") {
		return "", fmt.Errorf("look up %q: want a bare command name", file)
	}
	for dir := range strings.SplitSeq(pathEnv, ":") {
		if !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, file)
		fi, err := os.Stat(filepath.Join(rootFS, p))
		if err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found in PATH=%s", file, pathEnv)
}

func readListFile(path string) ([]int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	ids, err := ktext.ParseList(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s:1: %w", path, err)
	}
	return ids, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// FindNumactl looks numactl up in pathEnv on the agent's own filesystem.
func FindNumactl(pathEnv string) (string, error) { return LookPathIn("numactl", pathEnv, "") }

// BindFacts gathers, for one process, what the numa-bind-skipped rule needs
// (correlate.BindFacts).
type BindFacts struct {
	MemsAllowed []int
	OnlineNodes []int
	// Policies are the distinct numa_maps policies of the process's
	// anonymous mappings (heap, stack, pools), in order of first appearance;
	// of all mappings if it has none.
	Policies    []string
	NumactlPath string // "" when numactl is not on pathEnv
	CapSysNice  bool
	// Cpuset is the cpuset cgroup path from /proc/PID/cpuset ("/" when not
	// confined by one; "" when the kernel has no cpusets).
	Cpuset string
}

// ReadBindFacts reads the host's online nodes, PATH, and the process's
// status, cpuset and numa_maps.
func ReadBindFacts(procRoot, sysRoot string, pid int, pathEnv string) (BindFacts, error) {
	h, err := ReadHostFacts(HostConfig{SysRoot: sysRoot, PATH: pathEnv})
	if err != nil {
		return BindFacts{}, err
	}
	st, err := ReadStatus(procRoot, pid)
	if err != nil {
		return BindFacts{}, err
	}
	cpuset, err := readCpuset(procRoot, pid)
	if err != nil {
		return BindFacts{}, err
	}
	nm, err := ReadNumaMaps(procRoot, pid)
	if err != nil {
		return BindFacts{}, err
	}
	return BindFacts{
		MemsAllowed: st.MemsAllowed, OnlineNodes: h.NodesOnline, Policies: anonPolicies(nm),
		NumactlPath: h.NumactlPath, CapSysNice: st.HasCap(CapSysNice), Cpuset: cpuset,
	}, nil
}

// readCpuset reads <procRoot>/<pid>/cpuset; a kernel without cpusets has no
// such file, which gives "".
func readCpuset(procRoot string, pid int) (string, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cpuset"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read cpuset: %w", err)
	}
	return strings.TrimRight(string(b), "\n"), nil
}

func anonPolicies(nm []NumaMapping) []string {
	var anon, all []string
	seenAnon, seenAll := map[string]bool{}, map[string]bool{}
	for _, m := range nm {
		if !seenAll[m.Policy] {
			seenAll[m.Policy] = true
			all = append(all, m.Policy)
		}
		if m.File == "" && !seenAnon[m.Policy] {
			seenAnon[m.Policy] = true
			anon = append(anon, m.Policy)
		}
	}
	if len(anon) == 0 {
		return all
	}
	return anon
}

// HostMetrics exports the host facts the placement rules rest on at scrape
// time: memory (what pinned pools take from), huge pages, NUMA nodes.
type HostMetrics struct {
	procRoot, sysRoot        string
	mem, huge, hugeSz, nodes *prometheus.Desc
}

// NewHostMetrics describes the metrics once.
func NewHostMetrics(procRoot, sysRoot string) *HostMetrics {
	return &HostMetrics{
		procRoot: procRoot, sysRoot: sysRoot,
		mem: prometheus.NewDesc("lanewatch_host_memory_bytes",
			"Host memory from /proc/meminfo: total, available (MemAvailable) and mlocked (pinned pages count here).", []string{"state"}, nil),
		huge:   prometheus.NewDesc("lanewatch_host_hugepages", "Huge pages of the default size, total and free.", []string{"state"}, nil),
		hugeSz: prometheus.NewDesc("lanewatch_host_hugepage_size_bytes", "The default huge page size.", nil, nil),
		nodes:  prometheus.NewDesc("lanewatch_host_numa_nodes", "NUMA nodes online (1 on a kernel without NUMA).", nil, nil),
	}
}

// Describe sends the descriptors Update uses.
func (m *HostMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.mem, m.huge, m.hugeSz, m.nodes} {
		ch <- d
	}
}

// Update reads meminfo and the online nodes; a value the kernel does not
// give is left out, not sent as 0.
func (m *HostMetrics) Update(ch chan<- prometheus.Metric) error {
	mi, err := ReadMeminfo(m.procRoot)
	if err != nil {
		return err
	}
	for _, v := range []struct{ key, state string }{{"MemTotal", "total"}, {"MemAvailable", "available"}, {"Mlocked", "mlocked"}} {
		if b, ok := mi.Fields[v.key]; ok {
			ch <- prometheus.MustNewConstMetric(m.mem, prometheus.GaugeValue, float64(b), v.state)
		}
	}
	for _, v := range []struct{ key, state string }{{"HugePages_Total", "total"}, {"HugePages_Free", "free"}} {
		if n, ok := mi.Fields[v.key]; ok {
			ch <- prometheus.MustNewConstMetric(m.huge, prometheus.GaugeValue, float64(n), v.state)
		}
	}
	if b, ok := mi.Fields["Hugepagesize"]; ok {
		ch <- prometheus.MustNewConstMetric(m.hugeSz, prometheus.GaugeValue, float64(b))
	}
	h, err := ReadHostFacts(HostConfig{SysRoot: m.sysRoot})
	if err != nil {
		return err
	}
	ch <- prometheus.MustNewConstMetric(m.nodes, prometheus.GaugeValue, float64(len(h.NodesOnline)))
	return nil
}

//go:build cgo

package collectors

// The NVML collector against NVIDIA's real libnvidia-ml (drivers 535 and 550,
// unpacked by scripts/nvidia/fetch.sh) on a host without an NVIDIA driver,
// and the NVML symbols the collector binds, held against NVIDIA's exports
// and the reference stand-in's.
//
// Each OpenNVML here runs in a child process (this test binary, re-executed
// with LW_NVML_CHILD): go-nvml's C calls bind process-wide to the first NVML
// loaded, so one process can test one library only, and a call to a
// function the library lacks would kill the process ("symbol lookup
// error"), which the parent then reports instead of dying with it.

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lanewatch/lanewatch/internal/testenv"
	"github.com/lanewatch/lanewatch/selftest/refenv"
)

var updateNVMLSymbols = flag.Bool("update-nvml-symbols", false, "rewrite testdata/nvml/symbols.txt from what the NVML collector binds")

const (
	nvmlChildEnv    = "LW_NVML_CHILD" // the library the child process opens
	nvmlChildPrefix = "nvml-child: "  // the child's result line on stdout
	nvmlSymbolsFile = "testdata/nvml/symbols.txt"
)

// nvmlChildResult is what a child process saw.
type nvmlChildResult struct {
	Errors []string `json:"errors"` // OpenNVML's errors (opened twice when it fails)
	NoGPU  []bool   `json:"no_gpu"` // errors.Is(err, ErrNoGPUCounters), per error
	GPUs   int      `json:"gpus"`
	Bytes  bool     `json:"bytes"`  // a sample had the PCIe byte counters
	Rate   bool     `json:"rate"`   // a sample fell back to the PCIe rate
	Failed string   `json:"failed"` // Sample or Close failed
	Bound  []string `json:"-"`      // nvml* symbols the child's code bound in the library
}

// TestNVMLChildProcess is no test of its own: it is the child process of the
// tests below, doing what the agent does with NVML. A library that fails to
// open is opened a second time (the same one-line error, nothing breaks);
// one that opens is sampled, closed, and opened and sampled again without
// the PCIe byte fields, so both of the collector's counter paths run.
func TestNVMLChildProcess(t *testing.T) {
	lib := os.Getenv(nvmlChildEnv)
	if lib == "" {
		return
	}
	var res nvmlChildResult
	sample := func() bool {
		c, err := OpenNVML(lib)
		if err != nil {
			res.Errors = append(res.Errors, err.Error())
			res.NoGPU = append(res.NoGPU, errors.Is(err, ErrNoGPUCounters))
			return false
		}
		s, err := c.Sample()
		if err != nil {
			res.Failed = "sample: " + err.Error()
		}
		for _, g := range s.GPUs {
			res.Bytes = res.Bytes || g.HasPCIeBytes
			res.Rate = res.Rate || g.HasPCIeRate
		}
		res.GPUs = len(s.GPUs)
		if err := c.Close(); err != nil {
			res.Failed = "close: " + err.Error()
		}
		return true
	}
	if sample() {
		os.Setenv(refenv.NVMLNoPCIeFields()) // read by the stand-in's nvmlInit
	}
	sample()
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("%s%s\n", nvmlChildPrefix, b)
}

// ldBinding is one line of LD_DEBUG=bindings: file binds a symbol in lib.
var ldBinding = regexp.MustCompile("^\\s*\\d+:\\s+binding file (.+) \\[\\d+\\] to (.+) \\[\\d+\\]: (?:normal|protected) symbol `([^']+)'(?: \\[([^]]+)\\])?$")

// runNVMLChild runs TestNVMLChildProcess on lib under LD_DEBUG=bindings and
// returns what it saw, with the nvml* symbols that the child's own code (the
// executable: go-nvml's cgo calls, through the PLT) bound in lib. The
// library's bindings to itself, and dlsym (go-nvml's probes for versioned
// names, pinNVML's check), show as lib binding to lib and are not counted:
// a probe is not a call. A symbol with an ELF version would be NAME@VERSION.
func runNVMLChild(t *testing.T, lib string) nvmlChildResult {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dbg := filepath.Join(t.TempDir(), "ld-debug")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^TestNVMLChildProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), nvmlChildEnv+"="+lib, "LD_DEBUG=bindings", "LD_DEBUG_OUTPUT="+dbg, "LD_BIND_NOW=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("the child process that opened %s failed: %v\nstderr:\n%s\nstdout:\n%s", lib, err, stderr.String(), stdout.String())
	}
	var res nvmlChildResult
	found := false
	for line := range strings.SplitSeq(stdout.String(), "\n") {
		if j, ok := strings.CutPrefix(line, nvmlChildPrefix); ok {
			if err := json.Unmarshal([]byte(j), &res); err != nil {
				t.Fatalf("child result %q: %v", j, err)
			}
			found = true
		}
	}
	if !found {
		t.Fatalf("the child process that opened %s said nothing; stdout:\n%s\nstderr:\n%s", lib, stdout.String(), stderr.String())
	}
	logs, _ := filepath.Glob(dbg + ".*") // glibc appends the process id
	if len(logs) == 0 {
		t.Fatalf("LD_DEBUG wrote nothing to %s.*", dbg)
	}
	bound := map[string]bool{}
	for _, f := range logs {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			m := ldBinding.FindStringSubmatch(line)
			if m == nil || m[1] != exe || m[2] != lib || !strings.HasPrefix(m[3], "nvml") {
				continue
			}
			name := m[3]
			if m[4] != "" {
				name += "@" + m[4]
			}
			bound[name] = true
		}
	}
	for n := range bound {
		res.Bound = append(res.Bound, n)
	}
	slices.Sort(res.Bound)
	return res
}

// realNVML is NVIDIA's libnvidia-ml.so.1 of each driver fetch.sh unpacked.
func realNVML(t *testing.T) map[string]string {
	return map[string]string{
		"535": filepath.Join(testenv.NVIDIA(t, "BOOKWORM_NVML"), "libnvidia-ml.so.1"),
		"550": filepath.Join(testenv.NVIDIA(t, "TRIXIE_NVML"), "libnvidia-ml.so.1"),
	}
}

// On a host without an NVIDIA driver, NVIDIA's own NVML fails nvmlInit with
// 9 NVML_ERROR_DRIVER_NOT_LOADED: OpenNVML says so in one line that names
// the library, says "Driver Not Loaded" once and wraps ErrNoGPUCounters;
// the process calls nothing but nvmlInit and nvmlErrorString, survives, and
// a second OpenNVML says the same.
func TestOpenNVMLRealLibraryNoDriver(t *testing.T) {
	if _, err := os.Stat("/proc/driver/nvidia"); err == nil {
		t.Skip("this host has the NVIDIA driver: nvmlInit would not fail")
	}
	libs := realNVML(t)
	for _, ver := range []string{"535", "550"} {
		lib := libs[ver]
		t.Run(ver, func(t *testing.T) {
			check := testenv.GuardNvidiactl(t)
			res := runNVMLChild(t, lib)
			check()
			if len(res.Errors) != 2 {
				t.Fatalf("OpenNVML(%s): errors %q, want it to fail twice", lib, res.Errors)
			}
			msg := res.Errors[0]
			t.Logf("OpenNVML error: %s", msg)
			if res.Errors[1] != msg {
				t.Errorf("second OpenNVML said %q, the first %q", res.Errors[1], msg)
			}
			if !res.NoGPU[0] || !res.NoGPU[1] {
				t.Errorf("%q does not wrap ErrNoGPUCounters", msg)
			}
			for _, want := range []string{"Driver Not Loaded", lib, ErrNoGPUCounters.Error()} {
				if n := strings.Count(msg, want); n != 1 {
					t.Errorf("%q says %q %d times, want once", msg, want, n)
				}
			}
			if strings.ContainsAny(msg, "\n\r") {
				t.Errorf("%q is more than one line", msg)
			}
			for _, s := range res.Bound {
				if !slices.Contains([]string{"nvmlInit_v2", "nvmlInit", "nvmlErrorString"}, s) {
					t.Errorf("after a failed nvmlInit the collector called %s", s)
				}
			}
		})
	}
}

// nvmlExports is the dynamic FUNC symbols a library defines, as the dynamic
// linker resolves them. NVML has no ELF symbol versioning (no
// .gnu.version_d; every export is VER_NDX_GLOBAL, its versions are the _vN
// in the names): a library that defines versions fails here, so that the
// names in symbols.txt, which would then carry @VERSION, are looked at again.
func nvmlExports(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, s := range f.Sections {
		if s.Type == elf.SHT_GNU_VERDEF {
			t.Errorf("%s defines symbol versions (%s): NVML had none; the symbol check must compare versions now", path, s.Name)
		}
	}
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	out := map[string]bool{}
	for _, s := range syms {
		bind := elf.ST_BIND(s.Info)
		if s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC && (bind == elf.STB_GLOBAL || bind == elf.STB_WEAK) {
			out[s.Name] = true
		}
	}
	return out
}

// The NVML symbols the collector binds are derived, not listed by hand: the
// child process opens the reference stand-in and samples its GPU (both
// counter paths), and opens NVIDIA's 535 and 550 without a driver (the
// error path), under LD_DEBUG=bindings. Their union must equal
// testdata/nvml/symbols.txt (so a change in what the agent calls is
// reviewed), every name must be a defined FUNC export of NVIDIA's 535 and
// 550 and of the stand-in, and nvmlSymbols (what OpenNVML checks before it
// calls anything) must cover exactly these names, picking the same variant
// on NVIDIA's libraries as on the stand-in, so the stand-in cannot drift
// from NVIDIA's ABI unnoticed.
func TestNVMLSymbols(t *testing.T) {
	ref := testenv.RefDir(t)
	stand := filepath.Join(ref, "nvml", "libnvidia-ml.so.1")
	if _, err := os.Stat(stand); err != nil {
		t.Fatalf("NVML stand-in not built (make -C refpath): %v", err)
	}
	libs := realNVML(t)
	holdKernelCopy(t, ref, fmt.Sprintf("gotest-nvmlsym-%d", os.Getpid()), filepath.Join(t.TempDir(), "truth.jsonl"))

	derived := map[string]bool{}
	res := runNVMLChild(t, stand)
	if len(res.Errors) != 0 || res.Failed != "" || res.GPUs == 0 || !res.Bytes || !res.Rate {
		t.Fatalf("stand-in child: %+v; want GPUs sampled with PCIe bytes, then with the rate fallback", res)
	}
	if len(res.Bound) == 0 {
		t.Fatal("LD_DEBUG=bindings shows no NVML symbol bound by the child: has glibc's format changed?")
	}
	t.Logf("stand-in: %s", strings.Join(res.Bound, " "))
	for _, s := range res.Bound {
		derived[s] = true
	}
	// NVIDIA's libraries, on a host without the driver (or with another
	// driver version): nvmlInit fails, the error path.
	for _, ver := range []string{"535", "550"} {
		t.Run(ver, func(t *testing.T) {
			check := testenv.GuardNvidiactl(t)
			res := runNVMLChild(t, libs[ver])
			check()
			t.Logf("%s: %s", ver, strings.Join(res.Bound, " "))
			for _, s := range res.Bound {
				derived[s] = true
			}
		})
	}
	got := slices.Sorted(maps.Keys(derived))

	// symbols.txt, with its header, is reviewed when what the collector calls changes.
	header := `# The NVML C symbols lanewatch's NVML collector (collectors/gpu_nvml.go,
# through go-nvml v0.13.4-1) binds, sorted, one per line. Derived, never
# edited by hand: TestNVMLSymbols (collectors/gpu_nvml_real_test.go) runs
# OpenNVML in a child process under LD_DEBUG=bindings and keeps the nvml*
# symbols the child's own code bound in libnvidia-ml.so.1 (go-nvml's cgo
# calls through the PLT; dlsym probes of versioned names are not calls),
# against the reference stand-in (refpath/build/nvml: a GPU sampled with
# and without the PCIe byte fields) and against NVIDIA's 535 and 550 with
# no driver (nvmlInit fails: the error path). Every name must be a defined
# FUNC export of NVIDIA's 535 and 550 and of the stand-in. NVML has no ELF
# symbol versions (a versioned symbol would read NAME@VERSION); its versions
# are the _vN in the names. To regenerate, then review the diff:
#   go test ./collectors -run '^TestNVMLSymbols$' -update-nvml-symbols
`
	want := header + strings.Join(got, "\n") + "\n"
	if *updateNVMLSymbols {
		if err := os.MkdirAll(filepath.Dir(nvmlSymbolsFile), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(nvmlSymbolsFile, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(nvmlSymbolsFile)
	if err != nil {
		t.Fatalf("%v (write it with -update-nvml-symbols)", err)
	}
	var stored []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			stored = append(stored, line)
		}
	}
	var diff []string
	for _, s := range stored {
		if !derived[s] {
			diff = append(diff, "- "+s+"   (in the file, no longer bound)")
		}
	}
	for _, s := range got {
		if !slices.Contains(stored, s) {
			diff = append(diff, "+ "+s+"   (bound now, not in the file)")
		}
	}
	if len(diff) > 0 {
		t.Errorf("the NVML symbols the collector binds changed; check them against NVIDIA's libraries and the stand-in, then rerun with -update-nvml-symbols:\n%s", strings.Join(diff, "\n"))
	} else if string(b) != want {
		t.Errorf("%s: same symbols, but not in the generated form (header, sorted); rerun with -update-nvml-symbols", nvmlSymbolsFile)
	}

	exports := map[string]map[string]bool{
		"NVIDIA 535 " + libs["535"]: nvmlExports(t, libs["535"]),
		"NVIDIA 550 " + libs["550"]: nvmlExports(t, libs["550"]),
		"stand-in " + stand:         nvmlExports(t, stand),
	}
	for _, s := range got {
		for lib, ex := range exports {
			if !ex[s] {
				t.Errorf("%s does not export %s (a defined FUNC in .dynsym)", lib, s)
			}
		}
	}

	// OpenNVML's check (nvmlSymbols) covers exactly the bound names, and
	// on each library it would let go-nvml call the same variant.
	pick := func(ex map[string]bool, names []string) string {
		for _, n := range names {
			if ex[n] {
				return n
			}
		}
		return "(none)"
	}
	covered := map[string]bool{}
	for _, names := range nvmlSymbols {
		var called []string
		for _, n := range names {
			if derived[n] {
				called = append(called, n)
				covered[n] = true
			}
		}
		if len(called) != 1 {
			t.Errorf("nvmlSymbols entry %v: the collector bound %v of it, want exactly one", names, called)
			continue
		}
		for lib, ex := range exports {
			if p := pick(ex, names); p != called[0] {
				t.Errorf("%s: of %v OpenNVML's check finds %s first (go-nvml calls the newest there), but the collector called %s", lib, names, p, called[0])
			}
		}
	}
	for _, s := range got {
		if !covered[s] {
			t.Errorf("the collector binds %s, which OpenNVML does not check for (nvmlSymbols)", s)
		}
	}
}

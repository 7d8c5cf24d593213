//go:build cgo

package collectors

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/dl"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// DefaultNVMLLibrary is the name the NVML collector loads when given no path.
const DefaultNVMLLibrary = "libnvidia-ml.so.1"

// nvmlPinned holds, per library path, a handle that is never closed. go-nvml
// calls NVML through symbols that the process binds once, lazily and
// process-wide (RTLD_GLOBAL): if the library were unloaded by the last
// Shutdown and loaded again at another address, those bindings would point
// into nothing. A handle that stays open keeps the library where it is.
var nvmlPinned = struct {
	sync.Mutex
	libs map[string]*dl.DynamicLibrary
}{libs: map[string]*dl.DynamicLibrary{}}

// nvmlSymbols is every C symbol this collector makes go-nvml call, one
// entry per NVML function with the names go-nvml may call for it, newest
// first: after loading the library go-nvml dlsym-probes the versioned names
// (nvmlInit_v2, nvmlDeviceGetPciInfo_v2 then _v3, …) and calls the newest
// the library has, else the plain name. go-nvml binds its C calls lazily, so
// calling a function the library lacks kills the process ("symbol lookup
// error"): pinNVML checks that the library has one name of each entry before
// it becomes visible to those calls. NVML has no ELF symbol versions; its
// versions are the _vN names. TestNVMLSymbols derives the names the
// collector really binds (testdata/nvml/symbols.txt) and keeps this list
// equal to them.
var nvmlSymbols = [][]string{
	{"nvmlInit_v2", "nvmlInit"},
	{"nvmlErrorString"},
	{"nvmlShutdown"},
	{"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"},
	{"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"},
	{"nvmlDeviceGetUUID"},
	{"nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2", "nvmlDeviceGetPciInfo"},
	{"nvmlDeviceGetName"},
	{"nvmlDeviceGetFieldValues"},
	{"nvmlDeviceGetPcieThroughput"},
	{"nvmlDeviceGetPcieReplayCounter"},
	{"nvmlDeviceGetCurrPcieLinkGeneration"},
	{"nvmlDeviceGetMaxPcieLinkGeneration"},
	{"nvmlDeviceGetCurrPcieLinkWidth"},
	{"nvmlDeviceGetMaxPcieLinkWidth"},
}

// pinNVML loads the library at path for good, once it has shown that it has
// every function in nvmlSymbols. It is first loaded RTLD_LOCAL, so a library
// that fails the check is unloaded again without ever serving the process's
// lazy bindings.
func pinNVML(path string) error {
	nvmlPinned.Lock()
	defer nvmlPinned.Unlock()
	if _, ok := nvmlPinned.libs[path]; ok {
		return nil
	}
	probe := dl.New(path, dl.RTLD_LAZY|dl.RTLD_LOCAL)
	if err := probe.Open(); err != nil {
		// dlerror starts with the name it was given; the caller says it.
		return errNVMLUnavailable(fmt.Sprintf("library %s cannot be loaded: %s",
			path, strings.TrimPrefix(err.Error(), path+": ")))
	}
	defer probe.Close()
	var missing []string
	for _, names := range nvmlSymbols {
		if !slices.ContainsFunc(names, func(n string) bool { return probe.Lookup(n) == nil }) {
			missing = append(missing, names[0])
		}
	}
	if len(missing) > 0 {
		what := strings.Join(missing, ", ")
		if len(missing) > 3 {
			what = fmt.Sprintf("%s and %d more of the NVML functions the collector calls", strings.Join(missing[:3], ", "), len(missing)-3)
		}
		return errNVMLUnavailable(fmt.Sprintf("library %s is not a usable NVML: it lacks %s", path, what))
	}
	lib := dl.New(path, dl.RTLD_LAZY|dl.RTLD_GLOBAL|dl.RTLD_NODELETE)
	if err := lib.Open(); err != nil {
		return errNVMLUnavailable(fmt.Sprintf("library %s cannot be loaded: %s",
			path, strings.TrimPrefix(err.Error(), path+": ")))
	}
	nvmlPinned.libs[path] = lib
	return nil
}

// errNVMLUnavailable builds OpenNVML's error when NVML cannot serve counters
// on this host: one line, wrapping ErrNoGPUCounters (as errDCGMUnavailable).
func errNVMLUnavailable(why string) error {
	return fmt.Errorf("nvml: NVML counters unavailable, %s (%w)", why, ErrNoGPUCounters)
}

// nvmlCollector reads GPU counters through NVML, loaded at run time.
type nvmlCollector struct {
	mu   sync.Mutex
	lib  nvml.Interface
	devs []nvml.Device
	// fields is false once a device said the PCIe byte fields are
	// unsupported: Sample then reads nvmlDeviceGetPcieThroughput.
	fields []bool
	// nvlink is false once a device said the NVLink throughput fields are
	// unsupported (a GPU without NVLink, a driver before them): not asked
	// again, and the GPU has no NVLink counters.
	nvlink []bool
	closed bool
}

// OpenNVML loads NVML from libPath (DefaultNVMLLibrary when empty: the
// dynamic loader's search) and initialises it. The library is loaded at run
// time, so a binary that uses this starts on hosts without it: there, and
// where the library is installed but the NVIDIA driver is not (nvmlInit
// fails with "Driver Not Loaded"), the error is one line naming the library
// and wrapping ErrNoGPUCounters. After a failed nvmlInit nothing else of
// NVML is called. One process uses one NVML library: the first path opened
// serves every later OpenNVML, whatever its path, because the C symbols are
// bound process-wide.
func OpenNVML(libPath string) (GPUCounters, error) {
	if libPath == "" {
		libPath = DefaultNVMLLibrary
	}
	if err := pinNVML(libPath); err != nil {
		return nil, err
	}
	lib := nvml.New(nvml.WithLibraryPath(libPath))
	// NVIDIA's nvmlInit (535 and 550), run as root, creates /dev/nvidiactl
	// where it is missing (mknod c 195:255) and makes it root:root mode 0666
	// where it is there, even when it then finds no kernel driver and fails
	// with "Driver Not Loaded"; the node is left as NVML made it. The agent
	// only gets here with --gpu-counters auto or nvml on a host where
	// libnvidia-ml is installed, i.e. a GPU host, whose driver tools make the
	// same node: changing device nodes is not the agent's business.
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, errNVMLUnavailable(fmt.Sprintf("library %s loaded but nvmlInit failed: %v", libPath, nvmlErr(ret)))
	}
	c := &nvmlCollector{lib: lib}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		_ = lib.Shutdown()
		return nil, fmt.Errorf("NVML %s: device count: %v", libPath, nvmlErr(ret))
	}
	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			_ = lib.Shutdown()
			return nil, fmt.Errorf("NVML %s: device %d: %v", libPath, i, nvmlErr(ret))
		}
		c.devs = append(c.devs, d)
		c.fields = append(c.fields, true)
		c.nvlink = append(c.nvlink, true)
	}
	return c, nil
}

// nvmlErr names an NVML return code. Once go-nvml has loaded the library,
// Return.Error calls its nvmlErrorString, which needs no nvmlInit (NVIDIA's
// 535 and 550 answer "Driver Not Loaded" for 9 before any init); before that,
// go-nvml names the code itself.
func nvmlErr(r nvml.Return) error {
	return errors.New(r.Error())
}

// Source implements GPUCounters.
func (c *nvmlCollector) Source() string { return "nvml" }

// Close shuts NVML down (the library itself stays loaded; see OpenNVML).
func (c *nvmlCollector) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if ret := c.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("NVML shutdown: return code %d", int(ret))
	}
	return nil
}

// Sample implements GPUCounters. Identity (UUID, bus id) is required; every
// counter is optional and its Has* flag says whether the GPU had it.
func (c *nvmlCollector) Sample() (GPUSnapshot, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return GPUSnapshot{}, errors.New("NVML collector is closed")
	}
	t0 := time.Now()
	gpus := make([]GPUReading, 0, len(c.devs))
	for i, d := range c.devs {
		g, err := c.read(i, d)
		if err != nil {
			return GPUSnapshot{}, err
		}
		gpus = append(gpus, g)
	}
	t1 := time.Now()
	return GPUSnapshot{Time: t0.Add(t1.Sub(t0) / 2), GPUs: gpus, Source: "nvml"}, nil
}

func (c *nvmlCollector) read(i int, d nvml.Device) (GPUReading, error) {
	g := GPUReading{Index: i}
	var ret nvml.Return
	if g.UUID, ret = d.GetUUID(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("NVML device %d: UUID: %v", i, nvmlErr(ret))
	}
	pci, ret := d.GetPciInfo()
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("NVML device %d: PCI info: %v", i, nvmlErr(ret))
	}
	g.BusID = PCIAddress(cString(pci.BusId[:]))
	if name, ret := d.GetName(); ret == nvml.SUCCESS {
		g.Name = name
	}

	if c.fields[i] {
		fv := []nvml.FieldValue{{FieldId: nvml.FI_DEV_PCIE_COUNT_TX_BYTES}, {FieldId: nvml.FI_DEV_PCIE_COUNT_RX_BYTES}}
		ret := d.GetFieldValues(fv)
		tx, txOK := fieldUint(fv[0])
		rx, rxOK := fieldUint(fv[1])
		switch {
		case ret == nvml.SUCCESS && txOK && rxOK:
			g.PCIeTxBytes, g.PCIeRxBytes, g.HasPCIeBytes = tx, rx, true
		case ret == nvml.SUCCESS || ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT:
			c.fields[i] = false // pre-Hopper GPUs and older drivers: no byte counters
		}
	}
	if !g.HasPCIeBytes {
		tx, r1 := d.GetPcieThroughput(nvml.PCIE_UTIL_TX_BYTES)
		rx, r2 := d.GetPcieThroughput(nvml.PCIE_UTIL_RX_BYTES)
		if r1 == nvml.SUCCESS && r2 == nvml.SUCCESS {
			g.PCIeTxBps, g.PCIeRxBps, g.HasPCIeRate = float64(tx)*1024, float64(rx)*1024, true
		}
	}
	if c.nvlink[i] {
		fv := nvlinkFields()
		ret := d.GetFieldValues(fv)
		tx, rx, ok := nvlinkBytes(fv)
		switch {
		case ret == nvml.SUCCESS && ok:
			g.NVLinkTxBytes, g.NVLinkRxBytes, g.HasNVLink = tx, rx, true
		case ret == nvml.SUCCESS || ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT:
			c.nvlink[i] = false
		}
	}
	if v, ret := d.GetPcieReplayCounter(); ret == nvml.SUCCESS {
		g.Replay, g.HasReplay = uint64(v), true
	}
	if v, ret := d.GetCurrPcieLinkGeneration(); ret == nvml.SUCCESS {
		g.LinkGen = v
	}
	if v, ret := d.GetMaxPcieLinkGeneration(); ret == nvml.SUCCESS {
		g.MaxLinkGen = v
	}
	if v, ret := d.GetCurrPcieLinkWidth(); ret == nvml.SUCCESS {
		g.LinkWidth = v
	}
	if v, ret := d.GetMaxPcieLinkWidth(); ret == nvml.SUCCESS {
		g.MaxLinkWidth = v
	}
	return g, nil
}

// nvlinkAllLinks is the scopeId that asks NVML for a throughput field
// summed over all of the GPU's NVLinks (nvml.h: UINT_MAX).
const nvlinkAllLinks = ^uint32(0)

// nvlinkFields asks for NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX and _RX (138,
// 139) over all links: the current way to read NVLink bytes, where
// nvmlDeviceGetNvLinkUtilizationCounter is deprecated.
func nvlinkFields() []nvml.FieldValue {
	return []nvml.FieldValue{
		{FieldId: nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ScopeId: nvlinkAllLinks},
		{FieldId: nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ScopeId: nvlinkAllLinks},
	}
}

// nvlinkBytes turns nvlinkFields' answers (monotonic data payload totals in
// KiB) into bytes; ok only when both directions were read.
func nvlinkBytes(fv []nvml.FieldValue) (tx, rx uint64, ok bool) {
	if len(fv) != 2 {
		return 0, 0, false
	}
	txKiB, txOK := fieldUint(fv[0])
	rxKiB, rxOK := fieldUint(fv[1])
	if !txOK || !rxOK {
		return 0, 0, false
	}
	return txKiB * 1024, rxKiB * 1024, true
}

// fieldUint reads an unsigned field value (NVML reports the PCIe byte
// counters as unsigned long long; accept the other unsigned widths too).
func fieldUint(f nvml.FieldValue) (uint64, bool) {
	if nvml.Return(f.NvmlReturn) != nvml.SUCCESS {
		return 0, false
	}
	v := f.Value
	u64 := uint64(v[0]) | uint64(v[1])<<8 | uint64(v[2])<<16 | uint64(v[3])<<24 |
		uint64(v[4])<<32 | uint64(v[5])<<40 | uint64(v[6])<<48 | uint64(v[7])<<56
	switch nvml.ValueType(f.ValueType) {
	case nvml.VALUE_TYPE_UNSIGNED_LONG_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG:
		return u64, true
	case nvml.VALUE_TYPE_UNSIGNED_INT:
		return u64 & 0xffffffff, true
	}
	return 0, false
}

// cString is the text of a NUL-terminated C char array.
func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

package correlate

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/lanewatch/lanewatch/event"
)

// Which GPU (docs/design.md, "Placement"): a thread's calls use the device
// of the context current on it, set by the context calls the probes see
// (cudaSetDevice reaches the driver as cuDevicePrimaryCtxRetain and
// cuCtxSetCurrent; the runtime's "device 0 when the thread set none" too,
// on the thread's first call). A device allocation belongs to the device
// current when it was made; a copy crossed the link of the device that
// owns its device pointer, else of the thread's current device. The engine
// never assumes a device the calls did not show: no context call seen on a
// thread (late attach, lost events) leaves its device unknown.
//
// Devices are CUDA ordinals as the process numbers them (after
// CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER). An ordinal becomes a PCI
// address by the process's own cuDeviceGetPCIBusId answer when it asked
// (NCCL does, for every device), else by Config.Devices.

// DeviceMap names the PCI address (sysfs form, "0000:3b:00.0") of CUDA
// device ordinal of process pid, "" when it cannot be known. The engine
// asks at most once per process and ordinal, on its own goroutine, and
// keeps the answer until the process exits.
type DeviceMap func(pid uint32, ordinal int) string

// Caps of the per-process device state; past them the oldest knowledge is
// dropped (counted in Stats.DeviceCapHits) and what it told becomes unknown.
const (
	maxContexts   = 4096 // context handles → device
	maxCtxThreads = 1 << 16
	maxStackDepth = 64
	maxOrdinals   = 256
	noDevice      = int32(-1)
)

// devices is one process's device state.
type devices struct {
	ctxDev  map[uint64]int32    // context handle → device (retain, create)
	stacks  map[uint32][]uint64 // thread → its context stack, top last
	owner   map[uint64]int32    // device range start (registry) → device it was allocated on
	pci     map[int32]string    // ordinal → PCI address: the process's own answer, or DeviceMap's ("" unknown)
	capHits uint64
}

// current is the device of the context current on thread tid, or noDevice.
func (d *devices) current(tid uint32) int32 {
	s := d.stacks[tid]
	if len(s) == 0 {
		return noDevice
	}
	if dev, ok := d.ctxDev[s[len(s)-1]]; ok {
		return dev
	}
	return noDevice
}

func (d *devices) stack(tid uint32) []uint64 {
	if d.stacks == nil {
		d.stacks = map[uint32][]uint64{}
	}
	if _, ok := d.stacks[tid]; !ok && len(d.stacks) >= maxCtxThreads {
		d.capHits++
		clear(d.stacks) // threads come and go: forget them all rather than grow
	}
	return d.stacks[tid]
}

func (d *devices) setStack(tid uint32, s []uint64) {
	if len(s) > maxStackDepth {
		d.capHits++
		s = append(s[:0], s[len(s)-maxStackDepth:]...)
	}
	d.stacks[tid] = s
}

func (d *devices) context(ctx uint64, dev int32) {
	if ctx == 0 || dev < 0 {
		return
	}
	if d.ctxDev == nil {
		d.ctxDev = map[uint64]int32{}
	}
	if _, ok := d.ctxDev[ctx]; !ok && len(d.ctxDev) >= maxContexts {
		d.capHits++
		clear(d.ctxDev)
	}
	d.ctxDev[ctx] = dev
}

// apply gives a successful context or device call its effect (CUDA driver
// API, "Context Management": the calling thread's context stack).
func (d *devices) apply(c *event.Call) {
	switch c.Op {
	case event.OpCtxRetain: // does not make it current
		d.context(c.Ptr, c.Device)
	case event.OpCtxCreate: // pushed on the calling thread
		d.context(c.Ptr, c.Device)
		d.setStack(c.TID, append(d.stack(c.TID), c.Ptr))
	case event.OpCtxSetCurrent:
		s := d.stack(c.TID)
		switch {
		case c.Ptr == 0: // NULL pops (a no-op on an empty stack)
			if len(s) > 0 {
				s = s[:len(s)-1]
			}
		case len(s) == 0:
			s = append(s, c.Ptr)
		default: // replaces the top
			s[len(s)-1] = c.Ptr
		}
		d.setStack(c.TID, s)
	case event.OpCtxPush:
		d.setStack(c.TID, append(d.stack(c.TID), c.Ptr))
	case event.OpCtxPop:
		if s := d.stack(c.TID); len(s) > 0 {
			d.setStack(c.TID, s[:len(s)-1])
		}
	case event.OpCtxDestroy:
		// Popped from the calling thread if current there; a handle
		// another thread still has current names no device any more.
		if s := d.stack(c.TID); len(s) > 0 && s[len(s)-1] == c.Ptr {
			d.setStack(c.TID, s[:len(s)-1])
		}
		delete(d.ctxDev, c.Ptr)
	case event.OpDeviceBusID:
		if c.Device < 0 || c.Device >= maxOrdinals {
			return
		}
		if bdf := ParseBusID(c.BusID[:]); bdf != "" {
			if d.pci == nil {
				d.pci = map[int32]string{}
			}
			d.pci[c.Device] = bdf
		}
	}
}

// own records that the device range starting at start was allocated on dev.
// Ranges the registry no longer holds are pruned when their starts
// outnumber the live ones.
func (d *devices) own(m *procMem, start uint64, dev int32) {
	if d.owner == nil {
		d.owner = map[uint64]int32{}
	}
	if dev < 0 {
		delete(d.owner, start)
		return
	}
	d.owner[start] = dev
	if len(d.owner) > 2*len(m.device)+64 {
		for s := range d.owner {
			if m.device.indexOfStart(s) < 0 {
				delete(d.owner, s)
			}
		}
	}
}

// ownerOf is the device the device memory at addr was allocated on, or
// noDevice (not device memory, or allocated before the agent looked).
func (d *devices) ownerOf(m *procMem, addr uint64) int32 {
	if m == nil || d.owner == nil {
		return noDevice
	}
	i := m.device.find(addr)
	if i < 0 {
		return noDevice
	}
	if dev, ok := d.owner[m.device[i].Start]; ok {
		return dev
	}
	return noDevice
}

// copyDevice is the device whose link a copy crossed: the owner of its
// device-side pointer, else the device current on its thread. A copy
// between two devices is given its destination (the link its bytes enter
// by); one between two host buffers crosses no GPU link that is known.
func (d *devices) copyDevice(m *procMem, c *event.Call, t *Transfer) int32 {
	cur := func() int32 { return d.current(c.TID) }
	switch t.Direction {
	case DirH2H:
		return noDevice
	case DirH2D:
		return first(d.ownerOf(m, t.Dst.Addr), cur)
	case DirD2H:
		return first(d.ownerOf(m, t.Src.Addr), cur)
	}
	// D2D, or a side the registry cannot place: the destination's owner,
	// the source's, the peer copy's destination context, the thread's.
	if dev := d.ownerOf(m, t.Dst.Addr); dev >= 0 {
		return dev
	}
	if dev := d.ownerOf(m, t.Src.Addr); dev >= 0 {
		return dev
	}
	if c.Op == event.OpCopyPeer {
		if c.Layer == event.LayerRuntime {
			return c.Device // cudaMemcpyPeer names the destination's ordinal
		}
		if dev, ok := d.ctxDev[c.Ptr]; ok && c.Ptr != 0 {
			return dev // cuMemcpyPeer names the destination's context
		}
	}
	return cur()
}

func first(dev int32, then func() int32) int32 {
	if dev >= 0 {
		return dev
	}
	return then()
}

// pciOf names device dev of process p: the process's own bus-id answer,
// else the engine's DeviceMap (asked once), else "".
func (e *Engine) pciOf(p *proc, dev int32) string {
	if dev < 0 || dev >= maxOrdinals {
		return ""
	}
	d := &p.dev
	if bdf, ok := d.pci[dev]; ok {
		return bdf
	}
	bdf := ""
	if e.cfg.Devices != nil {
		bdf = e.cfg.Devices(p.pid, int(dev))
	}
	if d.pci == nil {
		d.pci = map[int32]string{}
	}
	d.pci[dev] = bdf
	return bdf
}

// ThreadDevice is the CUDA device ordinal current on thread tid of process
// pid, as the context calls the engine saw set it; false when unknown. The
// registry's allocators call it (through devices.current) to give a device
// allocation its device.
func (e *Engine) ThreadDevice(pid, tid uint32) (int, bool) {
	p := e.procs[pid]
	if p == nil {
		return 0, false
	}
	dev := p.dev.current(tid)
	return int(dev), dev >= 0
}

// DevicePCI is the PCI address the engine uses for ordinal dev of process
// pid, "" when unknown (tests, diagnostics).
func (e *Engine) DevicePCI(pid uint32, dev int) string {
	p := e.procs[pid]
	if p == nil || dev < 0 {
		return ""
	}
	return e.pciOf(p, int32(dev))
}

// memGPU is the PCI address of the GPU owning device memory at addr in
// process pid, "" when unknown.
func (e *Engine) memGPU(pid uint32, addr uint64) string {
	p := e.procs[pid]
	if p == nil {
		return ""
	}
	return e.pciOf(p, p.dev.ownerOf(p.mem, addr))
}

// ParseBusID turns the string cuDeviceGetPCIBusId wrote ("0000:3B:00.0",
// or an 8-digit domain as NVML writes it; NUL-terminated, hex digits in
// either case) into the sysfs form ("0000:3b:00.0"); "" when it is not
// one.
func ParseBusID(b []byte) string {
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		b = b[:i]
	}
	s := string(b)
	dom, rest, ok := strings.Cut(s, ":")
	if !ok {
		return ""
	}
	bus, rest, ok := strings.Cut(rest, ":")
	if !ok {
		return ""
	}
	dev, fn, ok := strings.Cut(rest, ".")
	if !ok {
		return ""
	}
	hex := func(s string, width int, limit uint64) (uint64, bool) {
		if s == "" || len(s) > width {
			return 0, false
		}
		v, err := strconv.ParseUint(s, 16, 64)
		return v, err == nil && v <= limit
	}
	// Linux domains go past 16 bits (Intel VMD's start at 0x10000): kept
	// whole, printed as sysfs prints them (%04x).
	d, ok1 := hex(dom, 8, 0xffffffff)
	bu, ok2 := hex(bus, 2, 0xff)
	dv, ok3 := hex(dev, 2, 0x1f)
	f, ok4 := hex(fn, 1, 7)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return ""
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", d, bu, dv, f)
}

// StreamGPUs is the GPU (PCI address) of the last copy the engine placed
// on each stream of process pid whose GPU was known, by the stream handle
// the calls passed; the default streams (handles 0, 1 and 2, every
// thread's) under 0, when they all went to one GPU. nil when the process
// is unknown. The agent places the BPF-side copy counters on lanes with
// it (docs/design.md, "Lane byte totals").
func (e *Engine) StreamGPUs(pid uint32) map[uint64]string {
	p := e.procs[pid]
	if p == nil {
		return nil
	}
	out := make(map[uint64]string, len(p.streams))
	def, mixed := "", false
	for key, st := range p.streams {
		switch {
		case st.gpu == "":
		case key == 0 || key&perThreadStream != 0:
			mixed = mixed || def != "" && def != st.gpu
			def = st.gpu
		default:
			out[key] = st.gpu
		}
	}
	if def != "" && !mixed {
		out[0] = def
	}
	return out
}

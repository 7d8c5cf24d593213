package correlate

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/ianlancetaylor/demangle"

	"github.com/lanewatch/lanewatch/event"
)

// Kernel movers (docs/design.md, "Kernel movers"): HiCache's default I/O
// backend moves KV pages with SM copy kernels, not copy calls. A launch is
// probed at the driver with the handle it launches; the handle got its name
// from the call that made it (cuModuleGetFunction, cuLibraryGetKernel: the
// name in, the handle out; cuKernelGetFunction: a kernel's function), or,
// for the runtime layer, from the host stub's symbol (Config.StubName). A
// launch of a kernel whose name matches the KV-transfer list becomes a
// transfer moved by SMs: its stream, layer, GPU and request as for a copy;
// its direction and bytes unknown — neither the name nor the launch states
// them — never guessed.

// Movers: who moves a transfer's bytes (seed 000, 核心抽象 rule 3).
const (
	MoverCopyEngine = "copy_engine" // a memcpy-family call: a copy engine
	MoverSM         = "sm"          // a kernel: the GPU's SMs load and store
	MoverNIC        = "nic"         // an RDMA work request, a network transport's transfer: the NIC
	MoverCPU        = "cpu"         // a same-host transport (shared memory, cma): the CPU copies
)

// DefaultKVKernels are sgl-kernel's KV-transfer kernels
// (sgl-kernel/csrc/kvcacheio/transfer.cu): every per-layer, all-layer, MLA
// and layout variant (transfer_kv_per_layer, _pf_lf, _mla, transfer_kv_all_layer,
// _lf_pf, _lf_ph …) launches an instance of transfer_kernel_impl<SrcOffsetFn,
// DstOffsetFn, IsMLA[, PackType]> or, for the page-head layout,
// transfer_page_head_kernel_impl<…>; the *_direct variants copy with
// cudaMemcpyAsync. Matched against a kernel's function name (KernelName).
var DefaultKVKernels = []string{`^transfer_kernel_impl$`, `^transfer_page_head_kernel_impl$`}

// KernelSet is a list of regular expressions over kernel function names.
type KernelSet struct {
	res []*regexp.Regexp
}

// NewKernelSet compiles patterns (RE2 syntax); an empty list matches
// nothing.
func NewKernelSet(patterns []string) (*KernelSet, error) {
	s := &KernelSet{}
	for _, p := range patterns {
		re, err := regexp.Compile(p)
		if err != nil {
			return nil, fmt.Errorf("kernel pattern %q: %w", p, err)
		}
		s.res = append(s.res, re)
	}
	return s, nil
}

// Match reports whether a kernel's function name matches one pattern.
func (s *KernelSet) Match(function string) bool {
	if s == nil {
		return false
	}
	for _, re := range s.res {
		if re.MatchString(function) {
			return true
		}
	}
	return false
}

// KernelName is the function name of a kernel symbol: the C++ (Itanium)
// name demangled without template arguments and parameters
// ("transfer_kernel_impl", "flexkv::transfer_kv_layers_kernel"), the
// qualified name read from the front of a mangled name the demangler
// cannot finish (a name cut at its length limit), or the symbol itself when
// it is not mangled (extern "C" kernels, Triton's).
func KernelName(symbol string) string {
	if !strings.HasPrefix(symbol, "_Z") {
		return symbol
	}
	if s, err := demangle.ToString(symbol, demangle.NoParams, demangle.NoTemplateParams, demangle.NoClones); err == nil && s != "" {
		return s
	}
	if s := mangledPrefix(symbol); s != "" {
		return s
	}
	return symbol
}

// mangledPrefix reads the qualified name at the front of an Itanium
// encoding: _Z then a <source-name> (digits, then that many bytes) or a
// nested name N [qualifiers] <source-name>... up to the first thing that is
// not one (template arguments, E, parameters). "" when there is none.
func mangledPrefix(s string) string {
	s = strings.TrimPrefix(s, "_Z")
	nested := strings.HasPrefix(s, "N")
	if nested {
		s = strings.TrimLeft(s[1:], "rVKRO") // a member function's cv-qualifiers and reference qualifiers
		if strings.HasPrefix(s, "St") {
			s = "3std" + s[2:] // ::std:: is abbreviated
		}
	}
	var parts []string
	for s != "" && s[0] >= '0' && s[0] <= '9' {
		n, i := 0, 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' && n < 1<<20 {
			n = n*10 + int(s[i]-'0')
			i++
		}
		if n == 0 || i+n > len(s) {
			break // a length running past the cut, or "0"
		}
		parts = append(parts, s[i:i+n])
		s = s[i+n:]
		if !nested {
			break
		}
	}
	return strings.Join(parts, "::")
}

// Caps of the kernel state; past them what is dropped makes launches
// unnamed (counted in KernelStats.Unnamed), never misnamed.
const (
	maxKernelHandles = 1 << 16 // named handles per process
	maxNameThreads   = 1024    // threads with a name being read, per process
	maxKernelInfos   = 1 << 14 // distinct symbols classified (engine-wide)
	maxNameBytes     = 8 * event.NamePieceBytes
)

// KernelStats count launches by what the engine knew of their kernel.
type KernelStats struct {
	Launches uint64 // successful launches seen
	KV       uint64 // ... of a KV-transfer kernel: reported as transfers moved by SMs
	Other    uint64 // ... of a named kernel that is not one
	Unnamed  uint64 // ... of a handle whose naming call was not seen (made before the agent looked, or lost)
	Failed   uint64 // launches that returned an error (reported as failed calls when their kernel is a KV-transfer one)
	CapHits  uint64 // kernel state dropped at its caps
}

// kernelInfo is what the engine decided about one symbol.
type kernelInfo struct {
	function string
	kv       bool
}

// procKernels is one process's kernel handles and the names being read.
type procKernels struct {
	names  map[uint64]string // launched handle (CUfunction, CUkernel) → symbol; "" unknown
	pieces map[uint32][]byte // thread → the name its naming call is being given
	stubs  map[uint64]string // runtime layer: host stub → symbol (asked once)
	caps   *uint64           // the engine's CapHits
}

func (k *procKernels) init(caps *uint64) {
	if k.names == nil {
		k.names, k.pieces, k.stubs, k.caps = map[uint64]string{}, map[uint32][]byte{}, map[uint64]string{}, caps
	}
}

// piece adds one piece of a name to its thread's (KindName: pieces come in
// order, each one's text ending at its NUL).
func (k *procKernels) piece(c *event.Call) {
	if c.BatchIndex == 0 {
		if _, ok := k.pieces[c.TID]; !ok && len(k.pieces) >= maxNameThreads {
			*k.caps++
			clear(k.pieces)
		}
		k.pieces[c.TID] = k.pieces[c.TID][:0]
	}
	b, ok := k.pieces[c.TID]
	if !ok {
		return // a piece whose first was lost: the name is unknown
	}
	n := int(min(c.Ret, uint64(len(c.NamePiece))))
	text := c.NamePiece[:n]
	if i := indexByte(text, 0); i >= 0 {
		text = text[:i]
	}
	if len(b)+len(text) <= maxNameBytes {
		k.pieces[c.TID] = append(b, text...)
	}
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// name gives handle h the symbol s ("" unknown).
func (k *procKernels) name(h uint64, s string) {
	if h == 0 {
		return
	}
	if _, ok := k.names[h]; !ok && len(k.names) >= maxKernelHandles {
		*k.caps++
		clear(k.names)
	}
	k.names[h] = s
}

// apply takes a naming call's effect: the name its pieces carried goes to
// the new handle (a failed call's pieces are dropped), a kernel's name to
// its function.
func (k *procKernels) apply(c *event.Call) {
	switch c.Op {
	case event.OpKernelName:
		b, ok := k.pieces[c.TID]
		delete(k.pieces, c.TID)
		if c.Failed() {
			return
		}
		s := ""
		if ok {
			s = string(b)
		}
		k.name(c.Handle, s)
	case event.OpKernelFunction:
		if !c.Failed() {
			k.name(c.Handle, k.names[c.Ptr])
		}
	}
}

// kernel classifies a symbol once: its function name, and whether it is a
// KV-transfer kernel.
func (e *Engine) kernel(symbol string) kernelInfo {
	if info, ok := e.kernelInfos[symbol]; ok {
		return info
	}
	if len(e.kernelInfos) >= maxKernelInfos {
		e.kstats.CapHits++
		clear(e.kernelInfos)
	}
	fn := KernelName(symbol)
	info := kernelInfo{function: fn, kv: e.cfg.KVKernels.Match(fn)}
	e.kernelInfos[symbol] = info
	return info
}

// launchSymbol is the symbol of the kernel a launch runs, "" unknown: the
// driver's handle as its naming call named it, the runtime layer's host
// stub by its symbol in the process (asked once per stub).
func (e *Engine) launchSymbol(p *proc, c *event.Call) string {
	k := &p.kernels
	if c.Layer != event.LayerRuntime {
		return k.names[c.Handle]
	}
	if s, ok := k.stubs[c.Handle]; ok {
		return s
	}
	s := ""
	if e.cfg.StubName != nil && c.Handle != 0 {
		s = e.cfg.StubName(p.pid, c.Handle)
	}
	if len(k.stubs) >= maxKernelHandles {
		e.kstats.CapHits++
		clear(k.stubs)
	}
	k.stubs[c.Handle] = s
	return s
}

// launch reports a launch of a KV-transfer kernel as a transfer moved by
// SMs, pending on its stream like a copy (layer, completion); every other
// launch is only counted. ok is false when no transfer was made.
func (e *Engine) launch(p *proc, c *event.Call, key uint64) (r ref, ok bool) {
	symbol := e.launchSymbol(p, c)
	if !c.Failed() {
		e.note(p, c, Activity{Stream: c.Stream, KV: symbol != "" && e.kernel(symbol).kv})
	}
	if c.Failed() {
		e.kstats.Failed++
	} else {
		e.kstats.Launches++
	}
	if symbol == "" {
		if !c.Failed() {
			e.kstats.Unnamed++
		}
		return ref{}, false
	}
	info := e.kernel(symbol)
	if !info.kv {
		if !c.Failed() {
			e.kstats.Other++
		}
		return ref{}, false
	}
	if c.Failed() {
		r = e.failed(p, c)
		kernelTransfer(&e.txs[r.idx].Transfer, info, symbol)
		return r, true
	}
	e.kstats.KV++
	if p.live >= e.cfg.MaxPending {
		e.evictOldest(p)
	}
	st := e.stream(p, key)
	idx := e.alloc()
	e.seq++
	t := &e.txs[idx]
	t.start(c, e.seq, p, st, c.Layer == event.LayerRuntime || c.Returns, false)
	kernelTransfer(&t.Transfer, info, symbol)
	// The kernel runs on its thread's current device (docs/design.md,
	// "Placement"): a CUfunction's context is the one current at its
	// launch, a CUkernel runs in the current context.
	t.GPU = e.pciOf(p, p.dev.current(c.TID))
	t.lst, t.recAt = st, st.records
	t.Layer = int(st.records - st.drainedAt)
	r = ref{idx: idx, seq: e.seq}
	e.push(&st.q, st.live, r)
	st.live++
	e.push(&p.fifo, p.live, r)
	p.live++
	return r, true
}

// kernelTransfer makes t the record of a KV-transfer kernel's launch: moved
// by SMs, its kernel named, direction and bytes unknown.
func kernelTransfer(t *Transfer, info kernelInfo, symbol string) {
	t.Op, t.Mover, t.Kernel, t.KernelSymbol = event.OpKernelCopy, MoverSM, info.function, symbol
	t.Direction, t.Bytes, t.BytesUnknown = DirUnknown, 0, true
	t.Src, t.Dst = Side{Mem: event.MemUnknown}, Side{Mem: event.MemUnknown}
	t.HostMem = ""
}

// KernelStats returns the launch counters.
func (e *Engine) KernelStats() KernelStats { return e.kstats }

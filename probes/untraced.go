package probes

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Untraced says why the agent cannot see the transfers a mapped object
// makes: its work never passes through a function the agent probes
// (docs/design.md, "Transfer libraries", what is not seen). A process that
// maps one is named, with the reason, wherever its transfers would be
// judged; its RDMA checks never pass in silence.
type Untraced struct {
	Kind string // UntracedMLX5DV, ...
	Path string // the object, as the process maps it
	// Sign is what in the object showed it: "imports mlx5dv_init_obj",
	// "named nvshmem_transport_ibgda.so.3".
	Sign string
}

// Kinds of transfers no probe sees.
const (
	// UntracedMLX5DV: mlx5 direct verbs. The object can take a queue
	// pair's work queue, doorbell record and UAR from libmlx5
	// (mlx5dv_init_obj, DevX objects) or build requests with mlx5dv_wr_*,
	// and ring the doorbell itself: no ibv_post_send, no provider op.
	UntracedMLX5DV = "mlx5dv"
	// UntracedVerbsWR: the verbs work request API (ibv_wr_start …
	// ibv_wr_complete through ibv_qp_to_qp_ex), which posts through the
	// provider's ibv_qp_ex functions, not the post_send op the agent
	// probes (ibv_wr_post(3)).
	UntracedVerbsWR = "verbs-wr"
	// UntracedGPUInitiated: GPU kernels build the NIC's work requests and
	// ring its doorbell (NVSHMEM's IBGDA and GPUNetIO transports, DOCA
	// GPUNetIO, UCX's GDA module): no CPU call exists to probe.
	UntracedGPUInitiated = "gpu-initiated"
	// UntracedNVSHMEM: NVSHMEM's GPU kernels move data by loads and stores
	// to peers' memory over NVLink, and hand remote puts to a transport:
	// no copy call.
	UntracedNVSHMEM = "nvshmem"
	// UntracedDOCA: DOCA drives the device through its own queues (DOCA
	// Verbs, built on mlx5 direct verbs), not the verbs calls the agent
	// probes.
	UntracedDOCA = "doca"
	// UntracedGDRCopy: gdrcopy maps GPU memory into the CPU's address
	// space through the GPU's BAR; the CPU's loads and stores move the
	// bytes, no cuMemcpy.
	UntracedGDRCopy = "gdrcopy"
	// UntracedFabricBeforeAttach: a process running before the agent
	// attached, whose libfabric endpoints the agent has not seen built.
	// libfabric's data path is found from the objects fi_fabric builds
	// (probes/fabric.go), so the transfers of endpoints built before are
	// not seen. Not a property of the object: the agent adds it (agent
	// discovery) and drops it once it sees the process build an endpoint.
	UntracedFabricBeforeAttach = "libfabric-before-attach"
)

// Reason is what the agent does not see, in one sentence.
func (u Untraced) Reason() string {
	switch u.Kind {
	case UntracedMLX5DV:
		return "mlx5 direct verbs: it can build its own RDMA work requests and ring the NIC's doorbell, past ibv_post_send and the provider functions the agent probes"
	case UntracedVerbsWR:
		return "verbs work request API (ibv_wr_*): it can post through the provider's ibv_qp_ex functions, not the post_send the agent probes"
	case UntracedGPUInitiated:
		return "GPU-initiated networking: GPU kernels post the RDMA work requests themselves, with no CPU call to probe"
	case UntracedNVSHMEM:
		return "NVSHMEM: GPU kernels move data by loads and stores to peer GPUs' memory and hand remote puts to a transport, with no copy call to probe"
	case UntracedDOCA:
		return "DOCA: it drives the device through its own queues, not the verbs calls the agent probes"
	case UntracedGDRCopy:
		return "gdrcopy: it can read and write GPU memory with the CPU through a BAR mapping, with no copy call to probe"
	case UntracedFabricBeforeAttach:
		return "libfabric endpoints built before the agent attached: their provider functions are found from the objects fi_fabric builds, so their transfers are not seen until the process builds new ones (a restart of the process traces it)"
	}
	return "unknown kind " + u.Kind
}

// String is "path (sign): reason".
func (u Untraced) String() string { return fmt.Sprintf("%s (%s): %s", u.Path, u.Sign, u.Reason()) }

// RDMA says whether the kind hides RDMA work requests or traffic on the
// GPU's links (rather than CPU copies alone).
func (u Untraced) RDMA() bool {
	return u.Kind == UntracedMLX5DV || u.Kind == UntracedVerbsWR || u.Kind == UntracedGPUInitiated ||
		u.Kind == UntracedNVSHMEM || u.Kind == UntracedDOCA || u.Kind == UntracedFabricBeforeAttach
}

// Certain says whether the object is there only to move data that way: a
// library or transport module named for it, loaded when chosen. An object
// known by its imports can move data that way and may also take the
// traced paths: Mooncake's transfer engine built with CUDA imports
// mlx5dv_init_obj for its IBGDA device transport and posts everything
// else with ibv_post_send.
func (u Untraced) Certain() bool {
	return u.Kind == UntracedGPUInitiated || u.Kind == UntracedNVSHMEM || u.Kind == UntracedDOCA ||
		u.Kind == UntracedFabricBeforeAttach
}

// ObjectFacts are what the classifier reads of one object: its file name,
// the libraries it needs (DT_NEEDED) and, only when those call for it, the
// functions it imports (undefined dynamic symbols, without versions).
type ObjectFacts struct {
	Name    string // base name of the file
	Needed  []string
	Imports []string
}

// tracedElsewhere are objects that reach the NIC or GPU past the probes
// above but whose transfers the agent sees at their own level, or that
// only serve the objects that use them (whom the classifier names instead).
var tracedElsewhere = []string{
	"libuct", // UCX's transports (but GDA, byName): traced at the UCT endpoint (and UCP) level
	"libfabric.so",
	"libmlx5.so", "libmlx5-rdmav", // the provider: probed through the verbs ops
	"libibverbs.so",
	"libgdrapi.so", // its users are named by their imports
}

// byName are objects named for what they do: a library whose name says it.
var byName = []struct{ prefix, kind string }{
	// UCX's GPU Direct Async module (the rc_gda transport, UCX 1.20 on):
	// GPU kernels post through UCX's device API.
	{"libuct_ib_mlx5_gda", UntracedGPUInitiated},
	{"nvshmem_transport_ibgda.so", UntracedGPUInitiated},
	{"nvshmem_transport_gpunetio.so", UntracedGPUInitiated},
	{"libdoca_gpunetio", UntracedGPUInitiated},
	{"libnvshmem", UntracedNVSHMEM},
	{"libdoca_", UntracedDOCA},
}

// byImport are the imports that hand an object a data path no probe sees,
// each looked for only in objects that need its library. The sign named
// is the first of names the object imports, else its first import (in
// name order) with one of prefixes.
var byImport = []struct {
	needs    string // DT_NEEDED prefix that must be present
	names    []string
	prefixes []string
	kind     string
}{
	{"libmlx5.so", []string{"mlx5dv_init_obj", "mlx5dv_qp_ex_from_ibv_qp_ex"}, []string{"mlx5dv_devx_", "mlx5dv_wr_"}, UntracedMLX5DV},
	{"libibverbs.so", []string{"ibv_qp_to_qp_ex"}, nil, UntracedVerbsWR},
	{"libgdrapi.so", []string{"gdr_map"}, nil, UntracedGDRCopy},
}

// needsImports says whether an object's imports decide its verdict: it is
// not known by name and needs a library byImport looks into.
func needsImports(name string, needed []string) bool {
	if knownByName(name) {
		return false
	}
	for _, imp := range byImport {
		if slices.ContainsFunc(needed, func(n string) bool { return strings.HasPrefix(n, imp.needs) }) {
			return true
		}
	}
	return false
}

func knownByName(name string) bool {
	for _, p := range tracedElsewhere {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	for _, b := range byName {
		if strings.HasPrefix(name, b.prefix) {
			return true
		}
	}
	return false
}

// ClassifyObject says whether an object makes transfers the agent cannot
// see, and what showed it (Untraced without Path); ok is false for every
// other object. Names decide first: objects named for what they do, then
// those traced at their own level; then the imports of byImport.
func ClassifyObject(o ObjectFacts) (u Untraced, ok bool) {
	for _, b := range byName {
		if strings.HasPrefix(o.Name, b.prefix) {
			return Untraced{Kind: b.kind, Sign: "named " + o.Name}, true
		}
	}
	for _, p := range tracedElsewhere {
		if strings.HasPrefix(o.Name, p) {
			return Untraced{}, false
		}
	}
	for _, imp := range byImport {
		if !slices.ContainsFunc(o.Needed, func(n string) bool { return strings.HasPrefix(n, imp.needs) }) {
			continue
		}
		for _, fn := range imp.names {
			if slices.Contains(o.Imports, fn) {
				return Untraced{Kind: imp.kind, Sign: "imports " + fn}, true
			}
		}
		sorted := slices.Sorted(slices.Values(o.Imports))
		for _, fn := range sorted {
			if slices.ContainsFunc(imp.prefixes, func(p string) bool { return strings.HasPrefix(fn, p) }) {
				return Untraced{Kind: imp.kind, Sign: "imports " + fn}, true
			}
		}
	}
	return Untraced{}, false
}

// UntracedObject reads the object at path (opened as the agent opens
// mapped files; name is the path the process maps it by) and classifies
// it. Only the dynamic section is read, and the dynamic symbols only of an
// object that needs a library byImport looks into (few do). A file that is
// not ELF is no object (ok false); an ELF file that is not a readable
// object of this machine is an error naming path.
func UntracedObject(path, name string) (u Untraced, ok bool, err error) {
	base := filepath.Base(strings.TrimSuffix(name, " (deleted)"))
	if knownByName(base) {
		u, ok = ClassifyObject(ObjectFacts{Name: base})
		u.Path = name
		return u, ok, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return Untraced{}, false, err // *fs.PathError names the path
	}
	defer f.Close()
	// Code mapped from a file that is not ELF (a JIT's memfd) has no
	// imports, and no loader brings libraries in for it.
	magic := make([]byte, len(elf.ELFMAG))
	if _, err := f.ReadAt(magic, 0); err != nil && !errors.Is(err, io.EOF) {
		return Untraced{}, false, fmt.Errorf("%s: %w", path, err)
	} else if err != nil || string(magic) != elf.ELFMAG {
		return Untraced{}, false, nil
	}
	// debug/elf has panicked on crafted files (LookupSymbols).
	defer func() {
		if r := recover(); r != nil {
			u, ok, err = Untraced{}, false, fmt.Errorf("%s: malformed ELF: %v", path, r)
		}
	}()
	ef, err := elf.NewFile(f)
	if err != nil {
		return Untraced{}, false, fmt.Errorf("%s: not a readable ELF file: %w", path, err)
	}
	if ef.Class != elf.ELFCLASS64 || ef.Machine != HostMachine() {
		return Untraced{}, false, fmt.Errorf("%s: ELF %v %v, want ELFCLASS64 %v", path, ef.Class, ef.Machine, HostMachine())
	}
	o := ObjectFacts{Name: base}
	if o.Needed, err = neededLibraries(ef); err != nil {
		return Untraced{}, false, fmt.Errorf("%s: read DT_NEEDED: %w", path, err)
	}
	if needsImports(base, o.Needed) {
		syms, err := ef.DynamicSymbols()
		if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
			return Untraced{}, false, fmt.Errorf("%s: read .dynsym: %w", path, err)
		}
		for _, s := range syms {
			if s.Section == elf.SHN_UNDEF && s.Name != "" {
				o.Imports = append(o.Imports, s.Name)
			}
		}
	}
	u, ok = ClassifyObject(o)
	u.Path = name
	return u, ok, nil
}

// maxNeededName bounds one DT_NEEDED name: a file name, at most NAME_MAX
// (255) bytes, and a path at most PATH_MAX.
const maxNeededName = 4096

// neededLibraries reads the DT_NEEDED names of the dynamic section,
// reading only those strings of the string table (ImportedLibraries reads
// it whole, megabytes in a large library, for a few names).
func neededLibraries(ef *elf.File) ([]string, error) {
	offs, err := ef.DynValue(elf.DT_NEEDED)
	if err != nil || len(offs) == 0 {
		return nil, err
	}
	ds := ef.SectionByType(elf.SHT_DYNAMIC)
	if int(ds.Link) >= len(ef.Sections) || ds.Link == 0 {
		return nil, fmt.Errorf("dynamic section links to section %d of %d", ds.Link, len(ef.Sections))
	}
	str := ef.Sections[ds.Link]
	names := make([]string, 0, len(offs))
	buf := make([]byte, 256)
	for _, off := range offs {
		name, err := cString(str, off, buf)
		if err != nil {
			return nil, fmt.Errorf("DT_NEEDED at %#x of %s: %w", off, str.Name, err)
		}
		names = append(names, name)
	}
	return names, nil
}

// cString reads the NUL-terminated string at off of a string table.
func cString(str *elf.Section, off uint64, buf []byte) (string, error) {
	if off >= str.Size {
		return "", fmt.Errorf("past the table's %d bytes", str.Size)
	}
	var name []byte
	for len(name) < maxNeededName {
		n, err := str.ReadAt(buf, int64(off)+int64(len(name)))
		if i := slices.Index(buf[:n], 0); i >= 0 {
			return string(append(name, buf[:i]...)), nil
		}
		name = append(name, buf[:n]...)
		if err != nil {
			return "", fmt.Errorf("no terminating NUL: %w", err)
		}
	}
	return "", fmt.Errorf("longer than %d bytes", maxNeededName)
}

// UntracedFiles classifies the objects processes map, each file once
// (by device and inode) however many processes map it. Not safe for
// concurrent use.
type UntracedFiles struct {
	verdicts map[FileID]untracedVerdict
}

type untracedVerdict struct {
	u  Untraced
	ok bool
}

// Process lists the objects of one process whose transfers the agent
// cannot see, each once, in the order of its mappings (maps: its
// /proc/PID/maps, ReadMaps). Each object is read through the mapping
// itself (OpenMapped). errs says which objects could not be read: their
// verdict is unknown, and said rather than taken for traced.
func (c *UntracedFiles) Process(procRoot string, pid int, maps []Mapping) (out []Untraced, errs []error) {
	if c.verdicts == nil {
		c.verdicts = map[FileID]untracedVerdict{}
	}
	seen := map[FileID]bool{}
	for _, m := range maps {
		if !m.Executable() || !m.FileBacked() {
			continue
		}
		id, err := m.FileID()
		if err != nil || seen[id] {
			continue // a device ParseMaps accepted is always a FileID
		}
		seen[id] = true
		v, known := c.verdicts[id]
		if !known {
			if v, err = untracedMapping(procRoot, pid, m); err != nil {
				errs = append(errs, err)
				continue
			}
			c.verdicts[id] = v
		}
		if v.ok {
			v.u.Path = m.Path
			out = append(out, v.u)
		}
	}
	return out, errs
}

// untracedMapping classifies the object behind one mapping, read through
// the mapping (OpenMapped); an object known by its name is not opened.
func untracedMapping(procRoot string, pid int, m Mapping) (untracedVerdict, error) {
	if base := filepath.Base(strings.TrimSuffix(m.Path, " (deleted)")); knownByName(base) {
		u, ok := ClassifyObject(ObjectFacts{Name: base})
		return untracedVerdict{u, ok}, nil
	}
	mf, err := OpenMapped(procRoot, pid, m)
	if err != nil {
		return untracedVerdict{}, fmt.Errorf("%s: %w", m.Path, err)
	}
	defer mf.Close()
	u, ok, err := UntracedObject(mf.OpenPath(), m.Path)
	if err != nil {
		return untracedVerdict{}, err
	}
	return untracedVerdict{u, ok}, nil
}

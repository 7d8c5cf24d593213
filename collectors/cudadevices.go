package collectors

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// CUDA numbers the GPUs a process sees 0, 1, …: the host's GPUs in
// CUDA_DEVICE_ORDER, filtered and reordered by CUDA_VISIBLE_DEVICES. What
// follows turns those two variables (read by ReadBehaviourEnv) and the
// host's GPUs into the PCI address of each ordinal (docs/design.md,
// "Placement"). It says unknown where CUDA's choice cannot be reproduced,
// and names every assumption it makes.

// CUDAGPU is a GPU the host's CUDA driver enumerates.
type CUDAGPU struct {
	BusID string // PCI address, sysfs form ("0000:3b:00.0")
	UUID  string // "GPU-…" as NVML and nvidia-smi print it; "" without NVML or DCGM
	Model string // what tells models apart: NVML's name, else the PCI vendor:device ids
}

// VisibleDevices is what CUDA keeps of a CUDA_VISIBLE_DEVICES value: one
// list of one form, decided by its first entry (CUDA C Programming Guide,
// "CUDA Environment Variables"; the edge cases as PyTorch's
// _parse_visible_devices reproduces the driver, torch/cuda/__init__.py and
// test/test_cuda_nvml_based_avail.py).
type VisibleDevices struct {
	Indices []int    // index form: positions in CUDA_DEVICE_ORDER
	UUIDs   []string // "GPU-…" form: UUIDs or unique prefixes of them
	MIG     []string // "MIG-…" form: MIG devices (CUDA uses the first)
	// Notes say where and why CUDA stops reading the list, or empties it.
	Notes []string
}

// ParseVisibleDevices reads a CUDA_VISIBLE_DEVICES value as the CUDA driver
// does. Entries are comma-separated. An index entry is read like strtoul:
// leading blanks, an optional sign, decimal digits, the rest ignored
// ("1gpu2" is 1, "-0" is 0); the first entry that is not one (no digits, a
// negative number) ends the list, and so does the first entry of another
// form ("4,3,two" is 4,3; "GPU-1,2" is GPU-1). An index or UUID named twice
// empties the list: CUDA then sees no device. Never an error: every value
// means some list, possibly empty.
func ParseVisibleDevices(v string) VisibleDevices {
	var out VisibleDevices
	entries := strings.Split(v, ",")
	stop := func(i int, why string) {
		out.Notes = append(out.Notes, fmt.Sprintf("CUDA_VISIBLE_DEVICES entry %d (%q) %s: CUDA ignores it and the rest", i+1, entries[i], why))
	}
	first := strings.TrimLeft(entries[0], " \t\n\v\f\r")
	switch {
	case strings.HasPrefix(first, "GPU-"), strings.HasPrefix(first, "MIG-"):
		prefix := first[:4]
		for i, e := range entries {
			e = strings.TrimSpace(e)
			if !strings.HasPrefix(e, prefix) {
				stop(i, "is not a "+prefix+" entry like the first")
				break
			}
			if prefix == "GPU-" {
				out.UUIDs = append(out.UUIDs, e)
			} else {
				out.MIG = append(out.MIG, e)
			}
		}
		if dup := firstDuplicate(out.UUIDs); dup != "" || firstDuplicate(out.MIG) != "" {
			out.Notes = append(out.Notes, "CUDA_VISIBLE_DEVICES names "+dup+firstDuplicate(out.MIG)+" twice: CUDA sees no device")
			out.UUIDs, out.MIG = nil, nil
		}
		return out
	}
	seen := map[int]bool{}
	for i, e := range entries {
		n, ok := strtoulIndex(e)
		if !ok {
			stop(i, "is not a device index")
			break
		}
		if seen[n] {
			out.Notes = append(out.Notes, fmt.Sprintf("CUDA_VISIBLE_DEVICES names index %d twice: CUDA sees no device", n))
			out.Indices = nil
			return out
		}
		seen[n] = true
		out.Indices = append(out.Indices, n)
	}
	return out
}

// strtoulIndex reads an index entry the way strtoul(3) does in base 10, and
// says whether it is a device index: digits after optional blanks and sign;
// a negative value is not (strtoul wraps it past every index), "-0" is 0.
func strtoulIndex(s string) (int, bool) {
	s = strings.TrimLeft(s, " \t\n\v\f\r")
	neg := false
	if s != "" && (s[0] == '+' || s[0] == '-') {
		neg = s[0] == '-'
		s = s[1:]
	}
	end := 0
	for end < len(s) && s[end] >= '0' && s[end] <= '9' {
		end++
	}
	if end == 0 {
		return 0, false
	}
	n, err := strconv.Atoi(s[:end])
	if err != nil { // past int: past every GPU a host has
		return 0, false
	}
	if neg && n != 0 {
		return 0, false
	}
	return n, true
}

func firstDuplicate(xs []string) string {
	for i, x := range xs {
		if slices.Contains(xs[:i], x) {
			return x
		}
	}
	return ""
}

// CUDA_DEVICE_ORDER values.
const (
	OrderFastestFirst = "FASTEST_FIRST" // CUDA's default
	OrderPCIBusID     = "PCI_BUS_ID"
)

// CUDAOrdinals is the PCI address of each CUDA device ordinal of a process
// whose behaviour variables are env, on a host whose CUDA GPUs are gpus (in
// any order); "" for an ordinal whose GPU cannot be known. Notes say what
// was assumed and why anything is unknown, for the log.
//
// Order: PCI_BUS_ID sorts by PCI address. FASTEST_FIRST, the default, ranks
// by a speed heuristic NVIDIA does not specify: over GPUs of one model it
// has nothing to rank, and the PCI order is assumed (said in a note); over
// different models the index order is unknown. UUID entries name their GPU
// whatever the order (a unique prefix is enough); without UUIDs (no NVML
// or DCGM) they are unknown. A MIG entry is its parent GPU when it names
// it (MIG-GPU-<uuid>/gi/ci, before driver R470); a MIG-<uuid> device's GPU
// is not read here: unknown.
func CUDAOrdinals(env map[string]string, gpus []CUDAGPU) (ordinals []string, notes []string) {
	sorted := slices.Clone(gpus)
	slices.SortFunc(sorted, func(a, b CUDAGPU) int { return comparePCI(a.BusID, b.BusID) })
	// The order matters only to indices (and to an unset variable): its
	// notes are made the first time it is used.
	ordered, orderKnown := true, false
	byIndex := func(i int) string {
		if !orderKnown {
			orderKnown = true
			ordered, notes = cudaOrder(env["CUDA_DEVICE_ORDER"], sorted, notes)
		}
		if !ordered {
			return ""
		}
		return sorted[i].BusID
	}
	v, set := env["CUDA_VISIBLE_DEVICES"]
	if !set {
		for i := range sorted {
			ordinals = append(ordinals, byIndex(i))
		}
		return ordinals, notes
	}
	vis := ParseVisibleDevices(v)
	notes = append(notes, vis.Notes...)
	switch {
	case len(vis.UUIDs) > 0:
		ordinals, notes = resolveUUIDs(vis.UUIDs, sorted, notes)
	case len(vis.MIG) > 0:
		// CUDA uses one MIG device: the first.
		m := vis.MIG[0]
		if parent, ok := strings.CutPrefix(m, "MIG-GPU-"); ok {
			parent, _, _ = strings.Cut(parent, "/")
			var one []string
			one, notes = resolveUUIDs([]string{"GPU-" + parent}, sorted, notes)
			ordinals = append(ordinals, one...)
		} else {
			notes = append(notes, fmt.Sprintf("CUDA_VISIBLE_DEVICES=%s: the GPU of a MIG device is not read here: unknown", m))
			ordinals = append(ordinals, "")
		}
	default:
		for _, i := range vis.Indices {
			if i >= len(sorted) {
				notes = append(notes, fmt.Sprintf("CUDA_VISIBLE_DEVICES index %d: this host has %d GPUs; CUDA ignores it and the rest", i, len(sorted)))
				break
			}
			ordinals = append(ordinals, byIndex(i))
		}
	}
	return ordinals, notes
}

// cudaOrder says whether the CUDA order of gpus (sorted by PCI address) is
// their PCI order under CUDA_DEVICE_ORDER=order, with a note for what it
// assumed.
func cudaOrder(order string, gpus []CUDAGPU, notes []string) (bool, []string) {
	if order == OrderPCIBusID {
		return true, notes
	}
	if order != "" && order != OrderFastestFirst {
		notes = append(notes, fmt.Sprintf("CUDA_DEVICE_ORDER=%s is not an order CUDA knows: taken as %s", order, OrderFastestFirst))
	}
	models := map[string]bool{}
	for _, g := range gpus {
		models[g.Model] = true
	}
	switch {
	case len(gpus) <= 1:
		return true, notes
	case len(models) == 1 && !models[""]:
		return true, append(notes, fmt.Sprintf("%s over %d GPUs of one model (%s): PCI bus order assumed", OrderFastestFirst, len(gpus), gpus[0].Model))
	}
	return false, append(notes, fmt.Sprintf("%s over GPUs of different models: CUDA's speed ranking is not known here, so index ordinals are unknown (CUDA_DEVICE_ORDER=%s, or the process's own cudaDeviceGetPCIBusId, would say)", OrderFastestFirst, OrderPCIBusID))
}

// resolveUUIDs names the GPU of each UUID entry: the one GPU whose UUID it
// begins (case-insensitively, as nvidia-smi prints lowercase); the first
// entry that names none or several ends the list, one named twice empties
// it (as for indices).
func resolveUUIDs(entries []string, gpus []CUDAGPU, notes []string) ([]string, []string) {
	for _, g := range gpus {
		if g.UUID == "" {
			return make([]string, len(entries)), append(notes,
				"CUDA_VISIBLE_DEVICES names GPUs by UUID and this host's GPU UUIDs are not known (no NVML or DCGM): unknown")
		}
	}
	var out []string
	for i, e := range entries {
		var hits []string
		for _, g := range gpus {
			if strings.HasPrefix(strings.ToLower(g.UUID), strings.ToLower(e)) {
				hits = append(hits, g.BusID)
			}
		}
		if len(hits) != 1 {
			what := "matches no GPU"
			if len(hits) > 1 {
				what = fmt.Sprintf("matches %d GPUs", len(hits))
			}
			return out, append(notes, fmt.Sprintf("CUDA_VISIBLE_DEVICES entry %d (%s) %s: CUDA ignores it and the rest", i+1, e, what))
		}
		if slices.Contains(out, hits[0]) {
			return nil, append(notes, fmt.Sprintf("CUDA_VISIBLE_DEVICES names GPU %s twice: CUDA sees no device", hits[0]))
		}
		out = append(out, hits[0])
	}
	return out, notes
}

// comparePCI orders sysfs PCI addresses numerically (domain, bus, device,
// function); an address that does not parse sorts after those that do.
func comparePCI(a, b string) int {
	pa, oka := pciKey(a)
	pb, okb := pciKey(b)
	switch {
	case oka && okb:
		return slices.Compare(pa[:], pb[:])
	case oka:
		return -1
	case okb:
		return 1
	}
	return strings.Compare(a, b)
}

func pciKey(s string) ([4]uint64, bool) {
	var k [4]uint64
	dom, rest, ok1 := strings.Cut(s, ":")
	bus, rest, ok2 := strings.Cut(rest, ":")
	dev, fn, ok3 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || !ok3 {
		return k, false
	}
	for i, f := range []string{dom, bus, dev, fn} {
		v, err := strconv.ParseUint(f, 16, 32)
		if err != nil {
			return k, false
		}
		k[i] = v
	}
	return k, true
}

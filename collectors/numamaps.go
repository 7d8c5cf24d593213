package collectors

import (
	"fmt"
	"io"
	"math/bits"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/lanewatch/lanewatch/internal/ktext"
)

// NumaMapping is one line of /proc/PID/numa_maps: one VMA, its memory policy
// and where its resident pages are.
//
// The kernel (fs/proc/task_mmu.c show_numa_map) writes, in this order: the
// start address, the policy, then "file=PATH" or "heap" or "stack", then
// "huge" for hugetlb, and — only when the VMA has resident pages — anon=,
// dirty=, mapped=, mapmax=, swapcache=, active=, writeback=, N<node>=,
// kernelpagesize_kB=. Every count is in pages of PageSizeKB.
//
// The kernel omits a counter when it is implied, and the parser fills it in
// so that a field means the same whether printed or not: mapped= (the total)
// is printed only when it differs from both anon= and dirty=, and active=
// only when some page is inactive, so when they are absent from a line with
// resident pages, Mapped and Active are the node total (Active stays 0 for
// hugetlb, whose activity the kernel never prints). Other absent counters
// are 0 (mapmax=: at most 1).
type NumaMapping struct {
	Start uint64
	// Policy as printed: "default", "bind:0-1", "prefer:1", "local",
	// "interleave=static:0-3", "weighted interleave:0-1", "prefer (many):0,2".
	// It is the VMA's own policy, or the task's when the VMA has none, so a
	// process started under "numactl --membind=1" shows bind:1 on every line.
	// ParseMemPolicy splits it.
	Policy string
	// File is the backing file with the kernel's octal escapes (\040 for a
	// space, \075 for '=', \012, \011) decoded. The kernel does not escape
	// '\\', so a name that itself holds "\040" reads back as a space.
	File                                                      string
	Heap, Stack, Huge                                         bool
	Anon, Dirty, Mapped, MapMax, SwapCache, Active, Writeback uint64
	PagesByNode                                               map[int]uint64
	// PageSizeKB is 0 on kernels before 2.6.32, which did not print it.
	PageSizeKB uint64
	// Other keeps tokens this parser does not know (a newer kernel's key=value,
	// or "stack" => "TID" from the per-thread "stack:TID" of kernels 3.x),
	// so nothing the kernel wrote is dropped. A bare word maps to "".
	Other map[string]string
}

// Pages is the number of resident pages of the mapping (the kernel's own
// total, which is the sum over nodes).
func (m NumaMapping) Pages() uint64 {
	var n uint64
	for _, p := range m.PagesByNode {
		n += p
	}
	return n
}

// maxNumaMapsLine bounds a line: a path is at most PATH_MAX bytes, four times
// that escaped, plus at most MAX_NUMNODES node counts.
const maxNumaMapsLine = 1 << 20

// ParseNumaMaps parses the text of a /proc/PID/numa_maps file. name is used in
// errors ("name:line: ..."). Empty lines are skipped; anything else that is
// not a numa_maps line is an error, while unknown tokens are kept in Other.
// Lines need not be sorted: grep extracts from several processes are valid.
func ParseNumaMaps(r io.Reader, name string) ([]NumaMapping, error) {
	var out []NumaMapping
	err := ktext.Lines(r, name, maxNumaMapsLine, func(_ int, text string) error {
		m, err := parseNumaMapsLine(text)
		if err != nil {
			return err
		}
		out = append(out, m)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ReadNumaMaps reads and parses <procRoot>/<pid>/numa_maps. Errors wrap the os
// error (fs.ErrNotExist: the process is gone, or the kernel has no NUMA).
func ReadNumaMaps(procRoot string, pid int) ([]NumaMapping, error) {
	path := filepath.Join(procRoot, strconv.Itoa(pid), "numa_maps")
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read numa_maps: %w", err)
	}
	defer f.Close()
	return ParseNumaMaps(f, path)
}

func parseNumaMapsLine(s string) (NumaMapping, error) {
	// The kernel separates with single spaces and escapes spaces in paths;
	// empty tokens (a grep copy's trailing blank) carry nothing.
	var tok []string
	for t := range strings.SplitSeq(s, " ") {
		if t != "" {
			tok = append(tok, t)
		}
	}
	if len(tok) < 2 {
		return NumaMapping{}, fmt.Errorf("want \"ADDRESS POLICY ...\", got %q", s)
	}
	var m NumaMapping
	if len(tok[0]) > 16 || !ktext.IsHex(tok[0]) {
		return m, fmt.Errorf("start address %q is not hex", tok[0])
	}
	m.Start, _ = strconv.ParseUint(tok[0], 16, 64)

	// The policy is the first token plus, for the modes whose name holds a
	// space, the tokens up to the first one that is a field.
	n := 2
	switch {
	case tok[1] == "weighted" && len(tok) > 2 && strings.HasPrefix(tok[2], "interleave"),
		tok[1] == "prefer" && len(tok) > 2 && strings.HasPrefix(tok[2], "(many)"):
		n = 3
	}
	for n < len(tok) && !isNumaMapsField(tok[n]) {
		n++
	}
	m.Policy = strings.Join(tok[1:n], " ")

	seen := map[string]bool{}
	for _, t := range tok[n:] {
		key, val, hasVal := strings.Cut(t, "=")
		if !hasVal {
			switch {
			case t == "heap":
				m.Heap = true
			case t == "stack":
				m.Stack = true
			case t == "huge":
				m.Huge = true
			case strings.HasPrefix(t, "stack:"):
				m.Stack = true
				if err := m.setOther("stack", t[len("stack:"):]); err != nil {
					return m, err
				}
			default:
				if err := m.setOther(t, ""); err != nil {
					return m, err
				}
			}
			continue
		}
		if key == "" {
			return m, fmt.Errorf("token %q has no key", t)
		}
		if node, ok := nodeKey(key); ok {
			// "N01" and "N1" are the same node
			key = "N" + strconv.Itoa(node)
		}
		if seen[key] {
			return m, fmt.Errorf("%s= given twice", key)
		}
		seen[key] = true
		if key == "file" {
			m.File = unescapeOctal(val)
			continue
		}
		if node, ok := nodeKey(key); ok {
			v, err := parseCount(key, val)
			if err != nil {
				return m, err
			}
			if m.PagesByNode == nil {
				m.PagesByNode = map[int]uint64{}
			}
			m.PagesByNode[node] = v
			continue
		}
		dst := m.counter(key)
		if dst == nil {
			if err := m.setOther(key, val); err != nil {
				return m, err
			}
			continue
		}
		v, err := parseCount(key, val)
		if err != nil {
			return m, err
		}
		*dst = v
	}
	if pages := m.Pages(); pages > 0 {
		if !seen["mapped"] {
			m.Mapped = pages
		}
		if !seen["active"] && !m.Huge {
			m.Active = pages
		}
	}
	return m, nil
}

func (m *NumaMapping) counter(key string) *uint64 {
	switch key {
	case "anon":
		return &m.Anon
	case "dirty":
		return &m.Dirty
	case "mapped":
		return &m.Mapped
	case "mapmax":
		return &m.MapMax
	case "swapcache":
		return &m.SwapCache
	case "active":
		return &m.Active
	case "writeback":
		return &m.Writeback
	case "kernelpagesize_kB":
		return &m.PageSizeKB
	}
	return nil
}

// setOther keeps an unknown token; only a repeat (which would overwrite
// what the kernel wrote) is an error.
func (m *NumaMapping) setOther(k, v string) error {
	if _, dup := m.Other[k]; dup {
		return fmt.Errorf("%s given twice", k)
	}
	if m.Other == nil {
		m.Other = map[string]string{}
	}
	m.Other[k] = v
	return nil
}

// isNumaMapsField reports whether a token after the policy's first word
// starts the fields: a location word, or key=value with an identifier key.
// Policy words never look like that once the two-word modes are joined
// ("interleave=static:0-1" only follows "weighted", handled before).
func isNumaMapsField(t string) bool {
	switch {
	case t == "heap", t == "stack", t == "huge", strings.HasPrefix(t, "stack:"):
		return true
	}
	key, _, ok := strings.Cut(t, "=")
	if !ok || key == "" {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !(c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

// nodeKey recognises "N<node>": decimal digits only, a node id as a list
// would take it.
func nodeKey(key string) (int, bool) {
	if len(key) < 2 || key[0] != 'N' || strings.TrimLeft(key[1:], "0123456789") != "" {
		return 0, false
	}
	ids, err := ktext.ParseList(key[1:])
	if err != nil {
		return 0, false
	}
	return ids[0], true
}

func parseCount(key, val string) (uint64, error) {
	v, err := strconv.ParseUint(val, 10, 64)
	if err != nil || val[0] == '+' {
		return 0, fmt.Errorf("%s=%q is not a count", key, val)
	}
	return v, nil
}

// unescapeOctal decodes the \ooo escapes of the kernel's seq_path/mangle_path.
// A backslash not followed by three octal digits is kept as is.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) && s[i+1] <= '3' {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// MemPolicy is a numa_maps policy split into its parts.
type MemPolicy struct {
	// Mode: "default", "local", "bind", "prefer" ("preferred" before 2.6.26),
	// "interleave", "weighted interleave", "prefer (many)", or a newer name
	// kept verbatim.
	Mode string
	// Flags after '=': "static", "relative", "balancing".
	Flags []string
	// Nodes from the nodelist after ':'; empty for default and local.
	Nodes []int
}

// ParseMemPolicy splits a policy as the kernel's mpol_to_str writes it:
// MODE[=FLAG[|FLAG]][:NODELIST].
func ParseMemPolicy(s string) (MemPolicy, error) {
	head, list, hasList := strings.Cut(s, ":")
	mode, flags, hasFlags := strings.Cut(head, "=")
	if mode == "" {
		return MemPolicy{}, fmt.Errorf("policy %q has no mode", s)
	}
	p := MemPolicy{Mode: mode, Nodes: []int{}}
	if hasFlags {
		for f := range strings.SplitSeq(flags, "|") {
			if f == "" {
				return MemPolicy{}, fmt.Errorf("policy %q has an empty flag", s)
			}
			p.Flags = append(p.Flags, f)
		}
	}
	if hasList {
		nodes, err := ktext.ParseList(list)
		if err != nil {
			return MemPolicy{}, fmt.Errorf("policy %q: %w", s, err)
		}
		p.Nodes = nodes
	}
	return p, nil
}

// Restricts reports whether the policy confines or steers allocations to a
// node set (bind, prefer, interleave and their variants), as opposed to
// default/local, which allocate on whichever node the thread runs.
func (p MemPolicy) Restricts() bool {
	return p.Mode != "default" && p.Mode != "local" && len(p.Nodes) > 0
}

// AddrRange is a half-open virtual address range [Start, End).
type AddrRange struct{ Start, End uint64 }

// RangePlacement says where the resident pages of an address range live,
// computed from numa_maps (per-VMA totals).
type RangePlacement struct {
	// Pages per node, in units of each mapping's kernel page size.
	Pages map[int]uint64
	// Bytes per node: Pages × page size, for mappings whose page size is known.
	Bytes map[int]uint64
	// Approximate is set when a mapping only partly overlaps the range: its
	// per-node counts were prorated by the overlap length, which assumes its
	// resident pages are spread evenly. Use RangeNodes (move_pages) for
	// exact per-page nodes.
	Approximate bool
	// Mappings is how many numa_maps entries overlap the range.
	Mappings int
	// Stale counts numa_maps entries with no maps entry of the same start:
	// the process remapped between the two reads. They are left out.
	Stale int
	// PageSizeUnknown is set when an overlapping mapping printed no
	// kernelpagesize_kB (kernels before 2.6.32): it is in Pages, not Bytes.
	PageSizeUnknown bool
	// Unmapped is the number of bytes of the range that no mapping covers.
	Unmapped uint64
}

// PagesByNode gives pages per node for [start, end), from the numa_maps
// entries that overlap it. numa_maps has only start addresses, so the ends
// come from ranges, the /proc/PID/maps of the same process (sorted by start,
// disjoint, as probes.ParseMaps returns them). Only resident pages are
// counted: a range never touched has no pages on any node.
func PagesByNode(maps []NumaMapping, ranges []AddrRange, start, end uint64) (RangePlacement, error) {
	if start >= end {
		return RangePlacement{}, fmt.Errorf("empty range %#x-%#x", start, end)
	}
	ends := make(map[uint64]uint64, len(ranges))
	covered := uint64(0)
	for _, r := range ranges {
		if r.End <= r.Start {
			return RangePlacement{}, fmt.Errorf("mapping %#x-%#x is empty or inverted", r.Start, r.End)
		}
		ends[r.Start] = r.End
		if lo, hi := max(r.Start, start), min(r.End, end); lo < hi {
			covered += hi - lo
		}
	}
	p := RangePlacement{Pages: map[int]uint64{}, Bytes: map[int]uint64{}}
	p.Unmapped = (end - start) - min(covered, end-start)
	for _, m := range maps {
		mEnd, ok := ends[m.Start]
		if !ok {
			// Without an end we cannot tell whether it overlaps; count it
			// only if its start lies in the range (it then surely does).
			if m.Start >= start && m.Start < end {
				p.Stale++
			}
			continue
		}
		lo, hi := max(m.Start, start), min(mEnd, end)
		if lo >= hi {
			continue
		}
		p.Mappings++
		length, overlap := mEnd-m.Start, hi-lo
		partial := overlap < length
		if partial && m.Pages() > 0 {
			p.Approximate = true
		}
		for node, n := range m.PagesByNode {
			if partial {
				n = prorate(n, overlap, length)
			}
			p.Pages[node] += n
			if m.PageSizeKB == 0 {
				p.PageSizeUnknown = true
				continue
			}
			p.Bytes[node] += n * m.PageSizeKB * 1024
		}
	}
	return p, nil
}

// prorate returns n*num/den rounded to nearest without overflowing.
func prorate(n, num, den uint64) uint64 {
	hi, lo := bits.Mul64(n, num)
	lo, c := bits.Add64(lo, den/2, 0)
	hi += c
	if hi >= den {
		return n // num ≤ den, so this cannot happen; keep the total rather than panic
	}
	q, _ := bits.Div64(hi, lo, den)
	return q
}

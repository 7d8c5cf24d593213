package topology

import (
	"fmt"
	"slices"
	"strings"
)

// Reading one row of a topo -m matrix whose cells may be glued together
// ("NODENODE", "XNODENODE0-310N/A"): a pasted table can lose the tabs
// between cells, and nvidia-smi itself prints some columns without one
// (vllm-project/vllm#13855). A field is split into cells only at the
// relation names (X, PIX, …, NV<n>) and the bounds of number lists; a split
// is taken when it is the only one that gives the row its cell count.

// smiPiece is one cell read from a row and the field it came from.
type smiPiece struct {
	s   string
	tok int
}

// smiMaxSolutions bounds the ways of splitting one row that are compared.
const smiMaxSolutions = 64

// rowCells returns a row's relation cells (one per device) and its
// affinity cells (one per affinity column; nil when the row leaves them
// empty, which mayOmit allows, or when they split more than one way).
func (p *smiParser) rowCells(r smiRow, devs, extras []string, mayOmit bool) (rel, aff []string, err error) {
	n, k := len(devs), len(extras)
	sp := &smiSplit{toks: r.toks, n: n, k: k, mayOmit: mayOmit, memo: map[[3]int]int{}}
	if sp.plain() {
		rel = make([]string, n)
		for j, t := range r.toks[:n] {
			rel[j] = t.s
		}
		for _, t := range r.toks[n:] {
			aff = append(aff, t.s)
		}
		return rel, aff, nil
	}
	chars := 0
	for _, t := range r.toks {
		chars += len(t.s)
	}
	var sols [][]smiPiece
	if chars <= 16*(n+k)+256 {
		sols = sp.solutions(smiMaxSolutions)
	}
	if len(sols) == 0 {
		return nil, nil, p.rowError(r, devs, extras, mayOmit)
	}
	if len(sols) == smiMaxSolutions {
		return nil, nil, p.errorf(r.line, "row %s: its fields split into cells in %d ways or more", r.label, smiMaxSolutions)
	}
	first := sols[0]
	// The device cells must read one way.
	for _, other := range sols[1:] {
		for j := 0; j < n; j++ {
			if first[j].s != other[j].s {
				t := r.toks[first[j].tok]
				return nil, nil, p.errorf(t.line, "row %s, column %s: glued cells %q split more than one way (%s, or %s)",
					r.label, devs[j], t.s, smiPiecesOf(first, first[j].tok), smiPiecesOf(other, first[j].tok))
			}
		}
	}
	rel = make([]string, n)
	for j := range rel {
		rel[j] = first[j].s
	}
	if len(sols) == 1 {
		var read []string
		for ti, t := range r.toks {
			if pieces := smiPiecesOf(first, ti); pieces != t.s {
				read = append(read, fmt.Sprintf("%q as %s", t.s, pieces))
			}
		}
		p.notef(r.line, "row %s: glued cells read %s", r.label, strings.Join(read, ", "))
		for _, c := range first[n:] {
			aff = append(aff, c.s)
		}
		return rel, aff, nil
	}
	// The affinity cells split more than one way: name the first column
	// where two readings differ and leave the row's affinity cells out.
	other := sols[1]
	j := n
	for j < len(first) && j < len(other) && first[j].s == other[j].s {
		j++
	}
	column, ti := "its affinity columns", first[len(first)-1].tok
	if j < len(first) {
		column, ti = fmt.Sprintf("column %q", extras[j-n]), first[j].tok
	}
	p.notef(r.line, "row %s, %s: glued cells %q split more than one way (%s, or %s): the row's affinity cells are left out, its device cells read %s",
		r.label, column, r.toks[ti].s, smiPiecesOf(first, ti), smiPiecesOf(other, ti), strings.Join(rel, " "))
	return rel, nil, nil
}

// smiPiecesOf lists the cells a solution read from field tok.
func smiPiecesOf(sol []smiPiece, tok int) string {
	var out []string
	for _, c := range sol {
		if c.tok == tok {
			out = append(out, c.s)
		}
	}
	return strings.Join(out, " ")
}

// rowError explains why a row has no reading, naming the first field that
// is no cell of its column, or else the cell count and, when the columns
// are shifted, where the row's X sits.
func (p *smiParser) rowError(r smiRow, devs, extras []string, mayOmit bool) error {
	n, k := len(devs), len(extras)
	want := fmt.Sprint(n + k)
	if mayOmit && k > 0 {
		want = fmt.Sprintf("%d or %d", n, n+k)
	}
	count := fmt.Sprintf("row %s has %d cells, want %s (%d devices, %d affinity columns)", r.label, len(r.toks), want, n, k)
	// at[j] is the cell where field j starts, counting each earlier field
	// of glued cells as the fewest cells it splits into.
	at := make([]int, len(r.toks))
	for j := 1; j < len(r.toks); j++ {
		at[j] = at[j-1] + max(1, smiMinCells(r.toks[j-1].s))
	}
	column := func(j int) string {
		switch {
		case at[j] < n:
			return "column " + devs[at[j]]
		case at[j] < n+k:
			return fmt.Sprintf("column %q", extras[at[j]-n])
		}
		return "after the last column"
	}
	// A field that is no cell, whole or glued.
	for j, t := range r.toks {
		if smiCellish(t.s) {
			continue
		}
		if at[j] >= n && at[j] < n+k {
			return p.errorf(t.line, "row %s, %s: %q is not a list of numbers or N/A", r.label, column(j), t.s)
		}
		return p.errorf(t.line, "row %s, %s: unknown cell %q", r.label, column(j), t.s)
	}
	// A field of glued cells that no split fits.
	for j, t := range r.toks {
		if !smiValidCell(t.s) && !smiValidAffinity(t.s) {
			return p.errorf(t.line, "row %s, %s: glued cells %q: no split gives the row its cells (%s)", r.label, column(j), t.s, count)
		}
	}
	// Every field is one cell: a relation where an affinity belongs, or
	// the other way round, or too few or too many of them.
	if len(r.toks) == n+k || (mayOmit && len(r.toks) == n) {
		for j, t := range r.toks {
			switch {
			case j < n && !smiValidCell(t.s):
				return p.errorf(t.line, "row %s, %s: unknown cell %q", r.label, column(j), t.s)
			case j >= n && !smiValidAffinity(t.s):
				return p.errorf(t.line, "row %s, %s: %q is not a list of numbers or N/A", r.label, column(j), t.s)
			}
		}
	}
	line := r.line
	if len(r.toks) > 0 {
		line = r.toks[len(r.toks)-1].line
	}
	self := slices.Index(devs, r.label)
	for j, t := range r.toks {
		if t.s == "X" && j < n && j != self {
			return p.errorf(line, "%s: its X is under column %s, want %s (columns shifted: a cell is missing or extra before it)",
				count, devs[j], r.label)
		}
	}
	return p.errorf(line, "%s", count)
}

// smiSplit finds the ways to read a row's fields as n relation cells then
// k affinity cells (or none, when mayOmit), each field giving one or more
// consecutive cells.
type smiSplit struct {
	toks    []smiTok
	n, k    int
	mayOmit bool
	memo    map[[3]int]int
}

// plain reports whether the fields are the cells as they stand.
func (s *smiSplit) plain() bool {
	if !s.complete(len(s.toks)) {
		return false
	}
	for j, t := range s.toks {
		if !s.valid(t.s, j) {
			return false
		}
	}
	return true
}

func (s *smiSplit) complete(cells int) bool {
	return cells == s.n+s.k || (s.mayOmit && cells == s.n)
}

// valid reports whether c can be cell number j of the row.
func (s *smiSplit) valid(c string, j int) bool {
	if j < s.n {
		return smiValidCell(c)
	}
	return j < s.n+s.k && smiValidAffinity(c)
}

// ends lists where a cell that starts at pos of field tok, as cell number
// j, can end.
func (s *smiSplit) ends(tok, pos, j int) []int {
	if j >= s.n+s.k {
		return nil
	}
	return smiCellEnds(s.toks[tok].s[pos:], j < s.n, pos)
}

// smiCellEnds lists the ends (offset by base) of the prefixes of f that
// are a relation cell (rel) or else an affinity cell: N/A, or a list of
// numbers and ascending ranges (0-47,96-143).
func smiCellEnds(f string, rel bool, base int) []int {
	var out []int
	if rel {
		for _, w := range []string{"X", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC"} {
			if strings.HasPrefix(f, w) {
				out = append(out, base+len(w))
			}
		}
		if strings.HasPrefix(f, "NV") {
			for e := 2; e < len(f) && smiIsDigit(f[e]); e++ {
				out = append(out, base+e+1)
			}
		}
		return out
	}
	if strings.HasPrefix(f, "N/A") {
		return append(out, base+3)
	}
	// One pass over the list: an item is a number or lo-hi; the list can
	// end after any digit that completes an item.
	var lo, num uint64
	inRange, digits := false, 0
	for e := 0; e < len(f); e++ {
		c := f[e]
		switch {
		case smiIsDigit(c):
			if digits == 9 {
				return out // no CPU number is that long
			}
			num, digits = num*10+uint64(c-'0'), digits+1
			if !inRange || lo <= num {
				out = append(out, base+e+1)
			}
		case c == '-' && !inRange && digits > 0:
			lo, num, inRange, digits = num, 0, true, 0
		case c == ',' && digits > 0 && (!inRange || lo <= num):
			num, inRange, digits = 0, false, 0
		default:
			return out
		}
	}
	return out
}

// ways counts the readings from cell j at offset pos of field tok on,
// capped at 2.
func (s *smiSplit) ways(tok, pos, j int) int {
	if tok == len(s.toks) {
		if s.complete(j) {
			return 1
		}
		return 0
	}
	if len(s.toks)-tok > s.n+s.k-j { // every field gives a cell at least
		return 0
	}
	key := [3]int{tok, pos, j}
	if w, ok := s.memo[key]; ok {
		return w
	}
	w := 0
	for _, e := range s.ends(tok, pos, j) {
		if e == len(s.toks[tok].s) {
			w += s.ways(tok+1, 0, j+1)
		} else {
			w += s.ways(tok, e, j+1)
		}
		if w >= 2 {
			w = 2
			break
		}
	}
	s.memo[key] = w
	return w
}

// solutions returns up to max readings of the whole row.
func (s *smiSplit) solutions(max int) [][]smiPiece {
	var out [][]smiPiece
	var path []smiPiece
	var walk func(tok, pos, j int)
	walk = func(tok, pos, j int) {
		if len(out) == max || s.ways(tok, pos, j) == 0 {
			return
		}
		if tok == len(s.toks) {
			out = append(out, slices.Clone(path))
			return
		}
		for _, e := range s.ends(tok, pos, j) {
			path = append(path, smiPiece{s: s.toks[tok].s[pos:e], tok: tok})
			if e == len(s.toks[tok].s) {
				walk(tok+1, 0, j+1)
			} else {
				walk(tok, e, j+1)
			}
			path = path[:len(path)-1]
		}
	}
	walk(0, 0, 0)
	return out
}

// smiCellish reports whether a field reads as one or more cells glued
// together: relation names and affinity lists.
func smiCellish(f string) bool { return smiMinCells(f) > 0 }

// smiMinCells returns the fewest cells a field splits into (1 for a cell
// of its own), or 0 when it is no cells at all.
func smiMinCells(f string) int {
	if f == "" || len(f) > 512 {
		return 0
	}
	least := make([]int, len(f)+1) // least[i]: fewest cells in f[i:], 0 if none
	for i := len(f) - 1; i >= 0; i-- {
		for _, rel := range []bool{true, false} {
			for _, e := range smiCellEnds(f[i:], rel, i) {
				if c := 1 + least[e]; (e == len(f) || least[e] > 0) && (least[i] == 0 || c < least[i]) {
					least[i] = c
				}
			}
		}
	}
	return least[0]
}

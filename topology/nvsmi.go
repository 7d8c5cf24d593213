package topology

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// SMIMatrix is a saved `nvidia-smi topo -m` (or `topo -mp`) output: the
// device matrix as printed, the affinity columns, and the NIC legend.
//
// Device names are the matrix's own column names: GPU0…, NIC0… (drivers that
// print a "NIC Legend:"), or the RDMA names themselves (mlx5_0…, older
// drivers). Every method that takes a device name also accepts a NIC's RDMA
// name from the legend.
type SMIMatrix struct {
	// Devices are the column (and row) names in column order, then the
	// rows the header does not name (Beyond).
	Devices []string
	// Beyond are the rows of a partial excerpt whose header lacks their
	// columns (the NIC columns cut off): read by the header's columns, so
	// their cells with each other are absent from Rel. Notes says so.
	Beyond []string
	// Rel is the raw cell for (row, column): "X", "PIX", "PXB", "PHB",
	// "NODE", "SYS", "SOC" (old drivers' name for SYS) or "NV<n>".
	Rel map[[2]string]string
	// CPUAffinity, NUMAAffinity and GPUNUMAID hold the raw cells of the
	// "CPU Affinity", "NUMA Affinity" and "GPU NUMA ID" columns per row that
	// fills them (GPU rows; NIC rows leave them empty): "0-47,96-143", "0",
	// "N/A". A map is nil when its column is absent; a row is missing from
	// it when its cells could not be read unambiguously (Notes says so).
	CPUAffinity  map[string]string
	NUMAAffinity map[string]string
	GPUNUMAID    map[string]string
	// NICLegend maps a NIC column to its RDMA device ("NIC0" → "mlx5_0");
	// nil without a "NIC Legend:" block (older drivers name the columns
	// after the RDMA devices directly; a paste may have lost the block, and
	// then NIC<n> columns have no RDMA name: UnnamedNICs).
	NICLegend map[string]string
	// Notes name, as "file:line: …", every repair the parser made to read
	// a pasted form (cells glued together, rows run into one line) and
	// everything it read but could not name or left out (no NIC legend,
	// affinity cells that split more than one way). Empty for a clean file.
	Notes []string
	// NVLinkShown: the output shows NVLinks where there are some (an NV#
	// cell, or the `topo -m` legend's "NV#" line), so a PCIe cell between
	// two GPUs means they have no NVLink. A `topo -mp` output (PCIe only)
	// does not show them.
	NVLinkShown bool
}

// The affinity columns, as the header names them. They follow the device
// columns; rows fill them after their device cells.
const (
	smiColCPUAffinity  = "CPU Affinity"
	smiColNUMAAffinity = "NUMA Affinity"
	smiColGPUNUMAID    = "GPU NUMA ID"
)

// smiExtraCols are the affinity columns in the order nvidia-smi prints
// them, with their names as they read once whitespace is gone (a paste
// may glue them to each other and to the last device: "NIC3CPU Affinity").
var smiExtraCols = []struct{ name, compact string }{
	{smiColCPUAffinity, "CPUAffinity"},
	{smiColNUMAAffinity, "NUMAAffinity"},
	{smiColGPUNUMAID, "GPUNUMAID"},
}

const (
	// smiMaxLine bounds one line of input; a wider matrix is not a topo -m output.
	smiMaxLine = 1 << 20
	// smiMaxDevices bounds the columns; real outputs have a few dozen.
	smiMaxDevices = 512
)

// ParseNvidiaSMI reads a saved `nvidia-smi topo -m` (or `-mp`) output as
// printed or as people paste it. name is the file name used in errors and
// notes ("name:line: …").
//
// The header is the first line whose first field is GPU0 (or starts with
// GPU0 glued to the next column name); lines before it (a prompt, "NVIDIA
// Topology:") are skipped. Cells are split by any whitespace: tabs, tabs
// expanded to spaces, runs collapsed to one space, CRLF, trailing blanks,
// terminal escape sequences, blank lines between rows, and rows run
// together on one line (line breaks lost) all read the same. Rows may come
// in any order; NIC rows may leave the affinity cells empty. The "Legend:"
// block is skipped and the "NIC Legend:" block read.
//
// A pasted form is repaired only where one reading exists, and each repair
// is named in Notes: header columns glued together ("NIC8NIC9", "NIC3CPU
// Affinity") are split at the row names and the GPU<n>/NIC<n> pattern;
// cells glued together ("NODENODE", "0-31N/A") are split at the relation
// names and number lists when exactly one split gives the row its cell
// count. A file with NIC<n> columns but no NIC Legend block is read, the
// NICs then having no RDMA name.
//
// Everything else is an error naming file, line, row, column and token: an
// unknown cell, a row with too few or too many cells (and where its X sits
// when the columns are shifted), cells that split more than one way in the
// device columns, X off the diagonal, an asymmetric matrix, a missing or
// duplicate row, a duplicate device, a NIC Legend that lists some NIC
// columns but not all. Affinity cells that split more than one way are
// left out and named in Notes; nothing is dropped silently.
func ParseNvidiaSMI(r io.Reader, name string) (*SMIMatrix, error) {
	p := &smiParser{name: name}
	if err := p.read(r); err != nil {
		return nil, err
	}
	return p.parse()
}

type smiParser struct {
	name  string
	lines []string // without line endings and escape sequences
	notes []string
}

// smiTok is one whitespace-separated field and where it stands.
type smiTok struct {
	s     string
	line  int  // 1-based
	first bool // first field of its line
}

func (p *smiParser) errorf(line int, format string, args ...any) error {
	smiShorten(args)
	if line <= 0 {
		return fmt.Errorf("%s: %s", p.name, fmt.Sprintf(format, args...))
	}
	return fmt.Errorf("%s:%d: %s", p.name, line, fmt.Sprintf(format, args...))
}

func (p *smiParser) notef(line int, format string, args ...any) {
	smiShorten(args)
	p.notes = append(p.notes, fmt.Sprintf("%s:%d: %s", p.name, line, fmt.Sprintf(format, args...)))
}

// smiShorten cuts string arguments longer than 120 bytes (a field of a
// damaged file can be a megabyte) to their first 100 and "…".
func smiShorten(args []any) {
	for i, a := range args {
		if s, ok := a.(string); ok && len(s) > 120 {
			args[i] = strings.ToValidUTF8(s[:100], "") + "…"
		}
	}
}

func (p *smiParser) read(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), smiMaxLine)
	for sc.Scan() {
		p.lines = append(p.lines, smiStripEscapes(strings.TrimRight(sc.Text(), "\r")))
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return p.errorf(len(p.lines)+1, "line longer than %d bytes", smiMaxLine)
		}
		return p.errorf(len(p.lines)+1, "%v", err)
	}
	return nil
}

// smiHeaderStart reports whether a line's first field opens the matrix:
// GPU0, or GPU0 glued to the next column name (GPU0GPU1…, GPU0CPU).
func smiHeaderStart(f string) bool {
	rest, ok := strings.CutPrefix(f, "GPU0")
	return ok && (rest == "" || smiIsLetter(rest[0]))
}

func (p *smiParser) parse() (*SMIMatrix, error) {
	h := -1 // index of the header line
	for i, l := range p.lines {
		if f := strings.Fields(l); len(f) > 0 && smiHeaderStart(f[0]) {
			h = i
			break
		}
	}
	if h < 0 {
		return nil, p.errorf(len(p.lines), "no nvidia-smi topo -m header (a line whose first field is GPU0) in %d lines", len(p.lines))
	}
	headerLine := h + 1
	var toks []smiTok
	for i := h; i < len(p.lines); i++ {
		for k, f := range strings.Fields(p.lines[i]) {
			toks = append(toks, smiTok{s: f, line: i + 1, first: k == 0})
		}
	}

	// The header runs to the end of its line, or, when the line breaks
	// were lost, to the first row: a name followed by a cell.
	end := 0
	for end < len(toks) && toks[end].line == headerLine {
		if end > 0 && end+1 < len(toks) && toks[end+1].line == headerLine && smiNameLike(toks[end].s) && smiCellish(toks[end+1].s) {
			p.notef(headerLine, "rows follow the header on the same line (line breaks lost); rows are told apart by their names")
			break
		}
		end++
	}
	names := p.rowNames(h)
	for _, t := range toks[end:] {
		if t.line == headerLine && smiNameLike(t.s) { // rows run into the header's line
			names[t.s] = true
		}
	}
	devs, extras, err := p.parseHeader(toks[:end], names)
	if err != nil {
		return nil, err
	}
	m := &SMIMatrix{Devices: devs, Rel: make(map[[2]string]string, len(devs)*len(devs))}
	extraMaps := make([]map[string]string, len(extras))
	for i, e := range extras {
		extraMaps[i] = map[string]string{}
		switch e {
		case smiColCPUAffinity:
			m.CPUAffinity = extraMaps[i]
		case smiColNUMAAffinity:
			m.NUMAAffinity = extraMaps[i]
		case smiColGPUNUMAID:
			m.GPUNUMAID = extraMaps[i]
		}
	}
	col := make(map[string]int, len(devs))
	for i, d := range devs {
		col[d] = i
	}

	rows, beyond, trailer, ended, err := p.splitRows(toks[end:], col, headerLine)
	if err != nil {
		return nil, err
	}
	rowLine := make([]int, len(devs))
	for _, r := range rows {
		i := col[r.label]
		rowLine[i] = r.line
		rel, aff, err := p.rowCells(r, devs, extras, !smiIsGPU(r.label))
		if err != nil {
			return nil, err
		}
		for j, c := range rel {
			if (c == "X") != (i == j) {
				if i == j {
					return nil, p.errorf(r.line, "row %s: diagonal cell is %q, want X", r.label, c)
				}
				return nil, p.errorf(r.line, "row %s, column %s: X off the diagonal", r.label, devs[j])
			}
			m.Rel[[2]string{r.label, devs[j]}] = c
		}
		for k, c := range aff {
			extraMaps[k][r.label] = c
		}
	}
	if ended != nil { // rows are missing: reported after the rows' own faults, in line order
		return nil, ended
	}
	// Symmetry, reported at the later of the two rows.
	for i := range devs {
		for j := i + 1; j < len(devs); j++ {
			a, b := m.Rel[[2]string{devs[i], devs[j]}], m.Rel[[2]string{devs[j], devs[i]}]
			if a != b {
				li, lj := rowLine[i], rowLine[j]
				if li > lj {
					li, lj = lj, li
				}
				return nil, p.errorf(lj, "matrix not symmetric: %s/%s is %s but %s/%s is %s (lines %d and %d)",
					devs[i], devs[j], a, devs[j], devs[i], b, li, lj)
			}
		}
	}

	if len(beyond) > 0 {
		if err := p.readBeyond(m, beyond, col, headerLine); err != nil {
			return nil, err
		}
		devs = m.Devices
	}
	if err := p.parseLegend(m, trailer, col); err != nil {
		return nil, err
	}
	var unnamed []string
	for _, d := range devs {
		if smiIsNICColumn(d) {
			if _, ok := m.NICLegend[d]; ok {
				continue
			}
			if m.NICLegend != nil {
				return nil, p.errorf(headerLine, "column %s has no entry in a NIC Legend block", d)
			}
			unnamed = append(unnamed, d)
		}
	}
	if len(unnamed) > 0 {
		p.notef(headerLine, "no NIC Legend block: %s keep their column names, their RDMA devices are unknown (no GPU → RDMA device map)",
			smiList(unnamed, len(unnamed)))
	}
	m.Notes = p.notes
	m.NVLinkShown = slices.ContainsFunc(p.lines, func(l string) bool { return strings.Contains(l, "NV#") }) ||
		slices.ContainsFunc(slices.Collect(maps.Values(m.Rel)), func(c string) bool { return strings.HasPrefix(c, "NV") })
	return m, nil
}

// rowNames lists the first field of each line after the header up to the
// legend, where it looks like a device name: the row names, used to split
// a header whose column names are glued together.
func (p *smiParser) rowNames(h int) map[string]bool {
	names := map[string]bool{}
	for _, l := range p.lines[h+1:] {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if f[0] == "Legend:" || (f[0] == "NIC" && len(f) > 1 && f[1] == "Legend:") {
			break
		}
		if smiNameLike(f[0]) {
			names[f[0]] = true
		}
	}
	return names
}

// parseHeader splits the header fields into device columns and the
// affinity columns that end it.
func (p *smiParser) parseHeader(hdr []smiTok, rowNames map[string]bool) (devs, extras []string, err error) {
	line := hdr[0].line
	// The affinity column names are matched on the header with its
	// whitespace removed, so that they are found glued too.
	var compact strings.Builder
	for _, t := range hdr {
		compact.WriteString(t.s)
	}
	c := compact.String()
	for matched := true; matched; {
		matched = false
		for _, e := range smiExtraCols {
			if len(c) > len(e.compact) && strings.HasSuffix(c, e.compact) {
				for _, x := range extras {
					if x == e.name {
						return nil, nil, p.errorf(line, "duplicate header column %q", e.name)
					}
				}
				extras = append([]string{e.name}, extras...)
				c = c[:len(c)-len(e.compact)]
				matched = true
			}
		}
	}
	// The device fields are the tokens before the cut, the last one cut
	// short where an affinity column's name was glued to it.
	var fields []string
	for _, t := range hdr {
		if len(c) == 0 {
			break
		}
		s := t.s
		if len(s) > len(c) {
			s = s[:len(c)]
		}
		fields = append(fields, s)
		c = c[len(s):]
	}
	seen := make(map[string]bool, len(fields))
	for _, f := range fields {
		names, err := p.splitHeaderField(f, line, rowNames)
		if err != nil {
			return nil, nil, err
		}
		for _, d := range names {
			if seen[d] {
				return nil, nil, p.errorf(line, "duplicate device %s in header", d)
			}
			if smiValidCell(d) || strings.ContainsAny(d, ":,") {
				return nil, nil, p.errorf(line, "header field %q is not a device name", d)
			}
			seen[d] = true
			devs = append(devs, d)
		}
	}
	if len(devs) > smiMaxDevices {
		return nil, nil, p.errorf(line, "header has %d device columns, more than the %d a topo -m output has", len(devs), smiMaxDevices)
	}
	return devs, extras, nil
}

// splitHeaderField returns the device names in one header field: the field
// itself, or the names glued in it ("GPU0GPU1NIC0"), split at the row names
// and at GPU<n>/NIC<n> when exactly one split exists.
func (p *smiParser) splitHeaderField(f string, line int, rowNames map[string]bool) ([]string, error) {
	if rowNames[f] || smiIsGPU(f) || smiIsNICColumn(f) {
		return []string{f}, nil
	}
	// ends(pos) lists where a name that starts at pos can end.
	ends := func(pos int) []int {
		var out []int
		for n := range rowNames {
			if strings.HasPrefix(f[pos:], n) {
				out = append(out, pos+len(n))
			}
		}
		for _, prefix := range []string{"GPU", "NIC"} {
			if strings.HasPrefix(f[pos:], prefix) {
				for e := pos + len(prefix); e < len(f) && smiIsDigit(f[e]); e++ {
					out = append(out, e+1)
				}
			}
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	var splits [][]string
	var path []string
	dead := make([]bool, len(f)+1) // no split of f[pos:] into names
	var walk func(pos int)
	walk = func(pos int) {
		if len(splits) == 2 || dead[pos] {
			return
		}
		found := len(splits)
		defer func() { dead[pos] = len(splits) == found }()
		if pos == len(f) {
			splits = append(splits, append([]string(nil), path...))
			return
		}
		for _, e := range ends(pos) {
			path = append(path, f[pos:e])
			walk(e)
			path = path[:len(path)-1]
		}
	}
	if len(f) <= 4096 {
		walk(0)
	}
	switch {
	case len(splits) == 0 || len(splits[0]) < 2:
		return []string{f}, nil // a name of its own
	case len(splits) > 1:
		return nil, p.errorf(line, "header field %q splits into device names more than one way (%s, or %s)",
			f, strings.Join(splits[0], " "), strings.Join(splits[1], " "))
	}
	p.notef(line, "header field %q read as %s (column names glued together)", f, strings.Join(splits[0], " "))
	return splits[0], nil
}

// smiRow is one matrix row: its name and the fields after it.
type smiRow struct {
	label string
	line  int
	toks  []smiTok
}

// splitRows cuts the fields after the header into rows, each starting at
// a device name. Rows normally start a line, but run on within a line
// when the line breaks were lost. Once every row has started, lines that
// start with a device name the header does not have, followed by a cell,
// are rows beyond the header (a partial excerpt whose columns were cut:
// readBeyond). The matrix ends at the first other line (or, within a line,
// the first field that is no cell); the fields after it are returned as
// the trailer. A matrix that ends before every row has started is returned
// with the error that says so (ended), for the caller to report after the
// faults of the rows read.
func (p *smiParser) splitRows(toks []smiTok, col map[string]int, headerLine int) (rows, beyond []smiRow, trailer []smiTok, ended, err error) {
	started := map[string]int{} // row name → line
	n := len(col)
	for i, t := range toks {
		label, rest, isRow := smiRowStart(t, col)
		all := len(rows) == n // every row the header names has started
		if all && t.first && !isRow && smiNameLike(t.s) && i+1 < len(toks) && toks[i+1].line == t.line && smiCellish(toks[i+1].s) {
			if first, dup := started[t.s]; dup {
				return nil, nil, nil, nil, p.errorf(t.line, "duplicate row %s (first at line %d)", t.s, first)
			}
			started[t.s] = t.line
			beyond = append(beyond, smiRow{label: t.s, line: t.line})
			continue
		}
		if len(beyond) > 0 && !t.first { // a row beyond the header is its line (readBeyond judges its cells)
			beyond[len(beyond)-1].toks = append(beyond[len(beyond)-1].toks, t)
			continue
		}
		switch {
		case isRow && !all:
			if first, dup := started[label]; dup {
				return nil, nil, nil, nil, p.errorf(t.line, "duplicate row %s (first at line %d)", label, first)
			}
			started[label] = t.line
			rows = append(rows, smiRow{label: label, line: t.line})
			if rest != "" {
				rows[len(rows)-1].toks = append(rows[len(rows)-1].toks, smiTok{s: rest, line: t.line})
			}
		case all && (t.first || !smiCellish(t.s)):
			return rows, beyond, toks[i:], nil, nil
		case isRow: // all rows started: a second row of that name
			return nil, nil, nil, nil, p.errorf(t.line, "duplicate row %s (first at line %d)", label, started[label])
		case (t.first || len(rows) == 0) && smiNameLike(t.s):
			return nil, nil, nil, nil, p.errorf(t.line, "row %q is not a column of the header at line %d", t.s, headerLine)
		case t.first || len(rows) == 0 || strings.ContainsAny(t.s, ":="): // "Legend:" in a line that lost its breaks
			return rows, beyond, toks[i:], p.errorf(t.line, "matrix ends after %d of %d rows (header at line %d) at %q: no row for %s",
				len(rows), n, headerLine, t.s, p.missingRows(started, col)), nil
		default:
			rows[len(rows)-1].toks = append(rows[len(rows)-1].toks, t)
		}
	}
	if len(rows) < n {
		ended = p.errorf(len(p.lines), "matrix ends after %d of %d rows (header at line %d): no row for %s",
			len(rows), n, headerLine, p.missingRows(started, col))
	}
	return rows, beyond, nil, ended, nil
}

// readBeyond reads the rows whose names the header lacks (a partial
// excerpt: the NIC columns cut off the header, their rows kept) by the
// columns there are: a row's first cells are its relations to the header's
// device columns, in order, and the matrix being symmetric they are those
// columns' relations to it too. Cells past them relate to columns the
// header does not name: left out, said in Notes. A row with fewer cells,
// a cell that is no relation, or X (only a row's own column holds it)
// is an error naming the row, the column and the token.
func (p *smiParser) readBeyond(m *SMIMatrix, beyond []smiRow, col map[string]int, headerLine int) error {
	devs := m.Devices
	n := len(devs)
	var names, cut []string
	for _, r := range beyond {
		if len(r.toks) < n {
			return p.errorf(r.line, "row %s, not a column of the header at line %d: %d cells, fewer than the header's %d device columns",
				r.label, headerLine, len(r.toks), n)
		}
		for j, t := range r.toks[:n] {
			switch {
			case t.s == "X":
				return p.errorf(t.line, "row %s, not a column of the header at line %d: X in column %s", r.label, headerLine, devs[j])
			case !smiValidCell(t.s):
				return p.errorf(t.line, "row %s, not a column of the header at line %d: %q in column %s is no relation",
					r.label, headerLine, t.s, devs[j])
			}
			m.Rel[[2]string{r.label, devs[j]}] = t.s
			m.Rel[[2]string{devs[j], r.label}] = t.s
		}
		m.Rel[[2]string{r.label, r.label}] = "X"
		if extra := len(r.toks) - n; extra > 0 {
			cut = append(cut, fmt.Sprintf("%s %d", r.label, extra))
		}
		names = append(names, r.label)
	}
	for _, d := range names {
		col[d] = len(m.Devices)
		m.Devices = append(m.Devices, d)
	}
	m.Beyond = names
	p.notef(beyond[0].line, "the header (line %d) names %d device columns, rows %s are not among them (a partial excerpt, columns cut off?): "+
		"read by the %d columns there are, their relations to each other unknown", headerLine, n, smiList(names, len(names)), n)
	if len(cut) > 0 {
		p.notef(beyond[0].line, "cells past the header's columns left out (relations to columns it does not name): %s", strings.Join(cut, ", "))
	}
	return nil
}

func (p *smiParser) missingRows(started map[string]int, col map[string]int) string {
	missing := make([]string, len(col))
	for d, i := range col {
		missing[i] = d
	}
	var out []string
	for _, d := range missing {
		if _, ok := started[d]; !ok {
			out = append(out, d)
		}
	}
	return smiList(out, 4)
}

// smiRowStart reports whether a field opens a row: it is a device name, or
// it starts its line with a device name glued to the row's first cells
// ("GPU0XNODE…"); rest is then what follows the name.
func smiRowStart(t smiTok, col map[string]int) (label, rest string, ok bool) {
	if _, ok := col[t.s]; ok {
		return t.s, "", true
	}
	if !t.first {
		return "", "", false
	}
	for d := range col {
		r, ok := strings.CutPrefix(t.s, d)
		if ok && r != "" && smiIsLetter(r[0]) && smiCellish(r) && len(d) > len(label) {
			label, rest = d, r
		}
	}
	return label, rest, label != ""
}

// parseLegend reads the "NIC Legend:" block among the fields after the
// matrix: "NIC Legend:" then "NIC<n>: <rdma device>" pairs.
func (p *smiParser) parseLegend(m *SMIMatrix, toks []smiTok, col map[string]int) error {
	values := map[string]string{} // RDMA name → NIC column
	for i := 0; i+1 < len(toks); i++ {
		if toks[i].s != "NIC" || toks[i+1].s != "Legend:" {
			continue
		}
		if m.NICLegend != nil {
			return p.errorf(toks[i].line, "second NIC Legend block")
		}
		m.NICLegend = map[string]string{}
		for i += 2; i+1 < len(toks); i += 2 {
			nic, isEntry := strings.CutSuffix(toks[i].s, ":")
			if !isEntry || !smiIsNICColumn(nic) {
				break
			}
			line, dev := toks[i].line, toks[i+1].s
			if _, ok := col[nic]; !ok {
				return p.errorf(line, "NIC Legend names %s, which is not a column of the matrix", nic)
			}
			if _, dup := m.NICLegend[nic]; dup {
				return p.errorf(line, "duplicate NIC Legend entry for %s", nic)
			}
			if other, dup := values[dev]; dup {
				return p.errorf(line, "NIC Legend maps both %s and %s to %s", other, nic, dev)
			}
			if _, clash := col[dev]; clash || strings.HasSuffix(dev, ":") {
				return p.errorf(line, "NIC Legend maps %s to %s, which is not an RDMA device name", nic, dev)
			}
			m.NICLegend[nic] = dev
			values[dev] = nic
		}
		i-- // the loop's i++ lands on the field that ended the block
	}
	return nil
}

// column resolves a device name or a NIC's RDMA name to its column name.
func (m *SMIMatrix) column(name string) (string, bool) {
	for _, d := range m.Devices {
		if d == name {
			return d, true
		}
	}
	for nic, dev := range m.NICLegend {
		if dev == name {
			return nic, true
		}
	}
	return "", false
}

// Cell returns the raw matrix cell for devices a and b (column names or
// RDMA names), e.g. "PIX" or "NV18".
func (m *SMIMatrix) Cell(a, b string) (string, bool) {
	ca, ok := m.column(a)
	if !ok {
		return "", false
	}
	cb, ok := m.column(b)
	if !ok {
		return "", false
	}
	c, ok := m.Rel[[2]string{ca, cb}]
	return c, ok
}

// Relation returns the PCIe relation of devices a and b. ok is false for an
// unknown device and for NVLink cells (NV#), which say nothing about the
// PCIe path: use NVLinks for those (or a `topo -mp` output for the PCIe
// relation). The old drivers' SOC is returned as RelSYS.
func (m *SMIMatrix) Relation(a, b string) (Relation, bool) {
	c, ok := m.Cell(a, b)
	if !ok {
		return "", false
	}
	if c == "SOC" {
		return RelSYS, true
	}
	r := Relation(c)
	if r.Rank() < 0 {
		return "", false
	}
	return r, true
}

// NVLinks returns the number of bonded NVLinks between a and b when their
// cell is NV#.
func (m *SMIMatrix) NVLinks(a, b string) (int, bool) {
	c, ok := m.Cell(a, b)
	if !ok || !strings.HasPrefix(c, "NV") {
		return 0, false
	}
	n, err := strconv.Atoi(c[2:])
	if err != nil {
		return 0, false
	}
	return n, true
}

// GPUs returns the GPU columns (GPU0, GPU1, …) in column order.
func (m *SMIMatrix) GPUs() []string {
	var out []string
	for _, d := range m.Devices {
		if smiIsGPU(d) {
			out = append(out, d)
		}
	}
	return out
}

// NICs returns the NIC columns in column order, each under its RDMA device
// name: through the NIC legend where there is one ("NIC0" → "mlx5_0"), as
// named by the column otherwise (old format; and NIC<n> when the file has
// no legend: UnnamedNICs).
func (m *SMIMatrix) NICs() []string {
	var out []string
	for _, d := range m.Devices {
		if !smiIsGPU(d) {
			out = append(out, m.nicName(d))
		}
	}
	return out
}

// UnnamedNICs returns the NIC<n> columns that have no RDMA device name (a
// file without its NIC Legend block).
func (m *SMIMatrix) UnnamedNICs() []string {
	var out []string
	for _, d := range m.Devices {
		if _, named := m.rdmaName(d); !named && !smiIsGPU(d) {
			out = append(out, d)
		}
	}
	return out
}

func (m *SMIMatrix) nicName(col string) string {
	if dev, ok := m.NICLegend[col]; ok {
		return dev
	}
	return col
}

// rdmaName returns a NIC column's RDMA device: its legend entry, or the
// column itself in the old format; ok is false for a NIC<n> column
// without a legend entry.
func (m *SMIMatrix) rdmaName(col string) (string, bool) {
	if dev, ok := m.NICLegend[col]; ok {
		return dev, true
	}
	return col, !smiIsNICColumn(col)
}

// NearestNIC maps each GPU's index ("0" for GPU0) to the NIC nearest to
// it, by column name when the NIC has no RDMA name, else by RDMA name: the
// NIC with the lowest Relation.Rank(), ties going to the lowest name in
// natural order (mlx5_2 before mlx5_10). GPUs are absent when there is no
// NIC.
func (m *SMIMatrix) NearestNIC() map[string]string {
	out := map[string]string{}
	for _, g := range m.GPUs() {
		best, bestRank := "", 0
		for _, d := range m.Devices {
			if smiIsGPU(d) {
				continue
			}
			r, ok := m.Relation(g, d)
			if !ok {
				continue
			}
			name := m.nicName(d)
			if best == "" || r.Rank() < bestRank || (r.Rank() == bestRank && naturalLess(name, best)) {
				best, bestRank = name, r.Rank()
			}
		}
		if best != "" {
			out[strings.TrimPrefix(g, "GPU")] = best
		}
	}
	return out
}

// NearestRDMA is NearestNIC restricted to GPUs whose nearest NIC has an
// RDMA device name: the JSON object SGLang takes for
// --disaggregation-ib-device. It is empty for a file whose NIC<n> columns
// have no legend (UnnamedNICs), since a column name is no device.
func (m *SMIMatrix) NearestRDMA() map[string]string {
	out := map[string]string{}
	unnamed := map[string]bool{}
	for _, d := range m.UnnamedNICs() {
		unnamed[d] = true
	}
	for g, nic := range m.NearestNIC() {
		if !unnamed[nic] {
			out[g] = nic
		}
	}
	return out
}

func smiIsGPU(name string) bool { return smiNumbered(name, "GPU") }

func smiIsNICColumn(name string) bool { return smiNumbered(name, "NIC") }

// smiNumbered reports whether name is prefix followed by decimal digits.
func smiNumbered(name, prefix string) bool {
	rest, ok := strings.CutPrefix(name, prefix)
	return ok && smiDigits(rest)
}

func smiValidCell(c string) bool {
	switch c {
	case "X", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC":
		return true
	}
	return smiNumbered(c, "NV")
}

// smiValidAffinity accepts N/A or a list such as 0-47,96-143 (ranges
// ascending, numbers of at most 9 digits).
func smiValidAffinity(c string) bool {
	return slices.Contains(smiCellEnds(c, false, 0), len(c))
}

// smiNameLike reports whether a field can be a device name: a letter, then
// letters, digits, '_', '.' or '-', and no relation name.
func smiNameLike(s string) bool {
	if s == "" || len(s) > 64 || !smiIsLetter(s[0]) || smiValidCell(s) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !smiIsLetter(c) && !smiIsDigit(c) && c != '_' && c != '.' && c != '-' {
			return false
		}
	}
	return true
}

func smiDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !smiIsDigit(s[i]) {
			return false
		}
	}
	return true
}

func smiIsLetter(c byte) bool { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') }

// smiList names up to max items, then how many more.
func smiList(items []string, max int) string {
	if len(items) <= max {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:max], ", "), len(items)-max)
}

// smiStripEscapes removes ANSI CSI sequences (ESC [ … final byte), which
// nvidia-smi writes around the header when its output is a terminal.
func smiStripEscapes(s string) string {
	if !strings.Contains(s, "\x1b") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == 0x1b && i+1 < len(s) && s[i+1] == '[' {
			j := i + 2
			for j < len(s) && (s[j] < 0x40 || s[j] > 0x7e) {
				j++
			}
			i = j // skip the final byte too
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// naturalLess orders names with their digit runs compared as numbers:
// mlx5_2 < mlx5_10 < mlx5_bond_0.
func naturalLess(a, b string) bool {
	for a != "" && b != "" {
		da, db := smiIsDigit(a[0]), smiIsDigit(b[0])
		switch {
		case da && db:
			na, ra := smiLeadingRun(a, true)
			nb, rb := smiLeadingRun(b, true)
			ta, tb := strings.TrimLeft(na, "0"), strings.TrimLeft(nb, "0")
			if len(ta) != len(tb) {
				return len(ta) < len(tb)
			}
			if ta != tb {
				return ta < tb
			}
			a, b = ra, rb
		case !da && !db:
			na, ra := smiLeadingRun(a, false)
			nb, rb := smiLeadingRun(b, false)
			if na != nb {
				return na < nb
			}
			a, b = ra, rb
		default:
			return da // digits before letters
		}
	}
	return len(a) < len(b)
}

func smiIsDigit(c byte) bool { return c >= '0' && c <= '9' }

func smiLeadingRun(s string, digits bool) (run, rest string) {
	i := 0
	for i < len(s) && smiIsDigit(s[i]) == digits {
		i++
	}
	return s[:i], s[i:]
}

// Peer copy paths between two GPUs (PeerPaths).
const (
	PeerNVLink = "nvlink"
	PeerPCIe   = "pcie"
)

// PeerPaths says how two GPUs, by PCI address, exchange peer copies: over
// NVLink (an NV# cell), or PCIe (a PCIe cell in an output that shows
// NVLinks: NVLinkShown). gpus are the host's GPU addresses in nvidia-smi's
// order (PCI bus order: GPU0 first), matched by index as Compare does; ok
// is false for an address not among them, a count that differs from the
// file's GPUs, a cell that says neither, or a PCIe cell of a `topo -mp`.
func (m *SMIMatrix) PeerPaths(gpus []string) func(src, dst string) (string, bool) {
	names := map[string]string{}
	if len(gpus) == len(m.GPUs()) {
		for i, bdf := range gpus {
			names[bdf] = "GPU" + strconv.Itoa(i)
		}
	}
	return func(src, dst string) (string, bool) {
		a, okA := names[src]
		b, okB := names[dst]
		if !okA || !okB || a == b {
			return "", false
		}
		if _, ok := m.NVLinks(a, b); ok {
			return PeerNVLink, true
		}
		if _, ok := m.Relation(a, b); ok && m.NVLinkShown {
			return PeerPCIe, true
		}
		return "", false
	}
}

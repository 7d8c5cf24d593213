package topology

import (
	"bufio"
	"errors"
	"fmt"
	"io"
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
	// Devices are the column (and row) names in column order.
	Devices []string
	// Rel is the raw cell for (row, column): "X", "PIX", "PXB", "PHB",
	// "NODE", "SYS", "SOC" (old drivers' name for SYS) or "NV<n>".
	Rel map[[2]string]string
	// CPUAffinity, NUMAAffinity and GPUNUMAID hold the raw cells of the
	// "CPU Affinity", "NUMA Affinity" and "GPU NUMA ID" columns per row that
	// fills them (GPU rows; NIC rows leave them empty): "0-47,96-143", "0",
	// "N/A". A map is nil when its column is absent.
	CPUAffinity  map[string]string
	NUMAAffinity map[string]string
	GPUNUMAID    map[string]string
	// NICLegend maps a NIC column to its RDMA device ("NIC0" → "mlx5_0");
	// nil without a "NIC Legend:" block (older drivers name the columns
	// after the RDMA devices directly).
	NICLegend map[string]string
}

// The affinity columns, as the header names them. They follow the device
// columns; rows fill them by position from the end of the device cells.
const (
	smiColCPUAffinity  = "CPU Affinity"
	smiColNUMAAffinity = "NUMA Affinity"
	smiColGPUNUMAID    = "GPU NUMA ID"
)

var smiExtraCols = [][]string{
	{"CPU", "Affinity"},
	{"NUMA", "Affinity"},
	{"GPU", "NUMA", "ID"},
}

// smiMaxLine bounds one line of input; a wider matrix is not a topo -m output.
const smiMaxLine = 1 << 20

// ParseNvidiaSMI reads a saved `nvidia-smi topo -m` output. name is the file
// name used in errors ("name:line: …").
//
// The matrix may be tab-separated, as nvidia-smi prints it, or have its tabs
// expanded to spaces; lines before the header (a prompt, "NVIDIA Topology:")
// are skipped, the header being the first line whose first field is GPU0.
// The "Legend:" block is skipped and the "NIC Legend:" block read. CRLF line
// endings, trailing blanks and terminal escape sequences are tolerated.
// The matrix must be square, have X exactly on its diagonal and be
// symmetric; a violation, a ragged row, an unknown cell, a duplicate device
// or a NIC<n> column missing from the NIC legend is an error naming the
// file and line.
func ParseNvidiaSMI(r io.Reader, name string) (*SMIMatrix, error) {
	p := smiParser{name: name, sc: bufio.NewScanner(r)}
	p.sc.Buffer(make([]byte, 0, 64*1024), smiMaxLine)
	return p.parse()
}

type smiParser struct {
	name string
	sc   *bufio.Scanner
	line int // number of the line last read
}

func (p *smiParser) errorf(line int, format string, args ...any) error {
	if line <= 0 {
		return fmt.Errorf("%s: %s", p.name, fmt.Sprintf(format, args...))
	}
	return fmt.Errorf("%s:%d: %s", p.name, line, fmt.Sprintf(format, args...))
}

// next returns the next line without its line ending and escape sequences.
func (p *smiParser) next() (string, bool, error) {
	if !p.sc.Scan() {
		if err := p.sc.Err(); err != nil {
			if errors.Is(err, bufio.ErrTooLong) {
				return "", false, p.errorf(p.line+1, "line longer than %d bytes", smiMaxLine)
			}
			return "", false, p.errorf(p.line+1, "%v", err)
		}
		return "", false, nil
	}
	p.line++
	return smiStripEscapes(strings.TrimRight(p.sc.Text(), "\r")), true, nil
}

func (p *smiParser) parse() (*SMIMatrix, error) {
	// Header: the first line whose first field is GPU0.
	var header []string
	for {
		s, ok, err := p.next()
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, p.errorf(p.line, "no nvidia-smi topo -m header (a line whose first field is GPU0) in %d lines", p.line)
		}
		if f := strings.Fields(s); len(f) > 0 && f[0] == "GPU0" {
			header = f
			break
		}
	}
	headerLine := p.line
	devs, extras, err := p.parseHeader(header, headerLine)
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

	// Rows, one per device, in any order.
	rowLine := make([]int, len(devs))
	for got := 0; got < len(devs); got++ {
		s, ok, err := p.next()
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, p.errorf(p.line, "matrix ends after %d of %d rows (header at line %d)", got, len(devs), headerLine)
		}
		f := strings.Fields(s)
		if len(f) == 0 {
			return nil, p.errorf(p.line, "blank line after %d of %d matrix rows (header at line %d)", got, len(devs), headerLine)
		}
		row := f[0]
		i, known := col[row]
		if !known {
			return nil, p.errorf(p.line, "row %q is not a column of the header at line %d", row, headerLine)
		}
		if rowLine[i] != 0 {
			return nil, p.errorf(p.line, "duplicate row %s (first at line %d)", row, rowLine[i])
		}
		rowLine[i] = p.line
		cells := f[1:]
		switch {
		case len(cells) == len(devs)+len(extras):
		case len(cells) == len(devs) && !smiIsGPU(row):
			// NIC rows leave the affinity columns empty.
		default:
			want := strconv.Itoa(len(devs) + len(extras))
			if !smiIsGPU(row) && len(extras) > 0 {
				want = fmt.Sprintf("%d or %s", len(devs), want)
			}
			return nil, p.errorf(p.line, "row %s has %d cells, want %s (%d devices, %d affinity columns)", row, len(cells), want, len(devs), len(extras))
		}
		for j, c := range cells[:len(devs)] {
			if !smiValidCell(c) {
				return nil, p.errorf(p.line, "row %s, column %s: unknown cell %q", row, devs[j], c)
			}
			if (c == "X") != (i == j) {
				if i == j {
					return nil, p.errorf(p.line, "row %s: diagonal cell is %q, want X", row, c)
				}
				return nil, p.errorf(p.line, "row %s, column %s: X off the diagonal", row, devs[j])
			}
			m.Rel[[2]string{row, devs[j]}] = c
		}
		for k, c := range cells[len(devs):] {
			if !smiValidAffinity(c) {
				return nil, p.errorf(p.line, "row %s, column %q: %q is not a list of numbers or N/A", row, extras[k], c)
			}
			extraMaps[k][row] = c
		}
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

	// Trailer: skip the Legend, read the NIC Legend.
	if err := p.parseTrailer(m, col); err != nil {
		return nil, err
	}
	for _, d := range devs {
		if smiIsNICColumn(d) {
			if _, ok := m.NICLegend[d]; !ok {
				return nil, p.errorf(headerLine, "column %s has no entry in a NIC Legend block", d)
			}
		}
	}
	return m, nil
}

// parseHeader splits the header fields into device columns and the
// affinity columns that end it.
func (p *smiParser) parseHeader(f []string, line int) (devs, extras []string, err error) {
	for {
		matched := false
		for _, words := range smiExtraCols {
			n := len(words)
			if len(f) > n && slices.Equal(f[len(f)-n:], words) {
				name := strings.Join(words, " ")
				for _, e := range extras {
					if e == name {
						return nil, nil, p.errorf(line, "duplicate header column %q", name)
					}
				}
				extras = append([]string{name}, extras...)
				f = f[:len(f)-n]
				matched = true
				break
			}
		}
		if !matched {
			break
		}
	}
	seen := make(map[string]bool, len(f))
	for _, d := range f {
		if seen[d] {
			return nil, nil, p.errorf(line, "duplicate device %s in header", d)
		}
		if smiValidCell(d) || strings.ContainsAny(d, ":,") {
			return nil, nil, p.errorf(line, "header field %q is not a device name", d)
		}
		seen[d] = true
	}
	return f, extras, nil
}

func (p *smiParser) parseTrailer(m *SMIMatrix, col map[string]int) error {
	inLegend := false
	values := map[string]string{} // RDMA name → NIC column
	for {
		s, ok, err := p.next()
		if err != nil {
			return err
		}
		if !ok {
			return nil
		}
		t := strings.TrimSpace(s)
		if t == "NIC Legend:" {
			if m.NICLegend != nil {
				return p.errorf(p.line, "second NIC Legend block")
			}
			m.NICLegend = map[string]string{}
			inLegend = true
			continue
		}
		if !inLegend {
			continue
		}
		if t == "" {
			// The block is "NIC Legend:", a blank line, then its entries.
			inLegend = len(m.NICLegend) == 0
			continue
		}
		f := strings.Fields(t)
		nic, isEntry := strings.CutSuffix(f[0], ":")
		if len(f) != 2 || !isEntry || !smiIsNICColumn(nic) {
			inLegend = false // the block has ended
			continue
		}
		dev := f[1]
		if _, ok := col[nic]; !ok {
			return p.errorf(p.line, "NIC Legend names %s, which is not a column of the matrix", nic)
		}
		if _, dup := m.NICLegend[nic]; dup {
			return p.errorf(p.line, "duplicate NIC Legend entry for %s", nic)
		}
		if other, dup := values[dev]; dup {
			return p.errorf(p.line, "NIC Legend maps both %s and %s to %s", other, nic, dev)
		}
		if _, clash := col[dev]; clash {
			return p.errorf(p.line, "NIC Legend maps %s to %s, which is also a column", nic, dev)
		}
		m.NICLegend[nic] = dev
		values[dev] = nic
	}
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
// named by the column otherwise (old format).
func (m *SMIMatrix) NICs() []string {
	var out []string
	for _, d := range m.Devices {
		if !smiIsGPU(d) {
			out = append(out, m.rdmaName(d))
		}
	}
	return out
}

func (m *SMIMatrix) rdmaName(col string) string {
	if dev, ok := m.NICLegend[col]; ok {
		return dev
	}
	return col
}

// NearestRDMA maps each GPU's index ("0" for GPU0) to the RDMA device
// nearest to it: the NIC with the lowest Relation.Rank(), ties going to the
// lowest name in natural order (mlx5_2 before mlx5_10). This is the JSON
// object SGLang takes for --disaggregation-ib-device. GPUs are absent when
// there is no NIC.
func (m *SMIMatrix) NearestRDMA() map[string]string {
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
			name := m.rdmaName(d)
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

func smiIsGPU(name string) bool { return smiNumbered(name, "GPU") }

func smiIsNICColumn(name string) bool { return smiNumbered(name, "NIC") }

// smiNumbered reports whether name is prefix followed by decimal digits.
func smiNumbered(name, prefix string) bool {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok || rest == "" {
		return false
	}
	for _, c := range rest {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func smiValidCell(c string) bool {
	switch c {
	case "X", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC":
		return true
	}
	return smiNumbered(c, "NV")
}

// smiValidAffinity accepts N/A or a list such as 0-47,96-143.
func smiValidAffinity(c string) bool {
	if c == "N/A" {
		return true
	}
	for _, part := range strings.Split(c, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		if !smiDigits(lo) || (isRange && !smiDigits(hi)) {
			return false
		}
	}
	return true
}

func smiDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
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

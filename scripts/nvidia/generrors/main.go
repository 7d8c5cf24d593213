// Command generrors writes event/cudaerrors.go: the names of the CUDA runtime
// results (enum cudaError in driver_types.h, typedef cudaError_t) and of the
// CUDA driver results (enum cudaError_enum in cuda.h, typedef CUresult), read
// from NVIDIA's own headers. It is a build tool, never part of the agent:
// scripts/nvidia/gen-errors.sh fetches the headers and runs it (see there for
// the packages and versions); by hand:
//
//	go run ./scripts/nvidia/generrors -o event/cudaerrors.go \
//	    -src 'LABEL=DIR' [-src 'LABEL=DIR' ...]
//
// Each DIR holds cuda.h and driver_types.h; LABEL (the text before the last
// "=") says where they came from and is copied into the generated file's
// header. The sources are given newest first: the tables are their union,
// and a code several sources know takes the name of the first one that has
// it.
//
// Parsing: the enum body is cut into enumerators at top-level commas after
// removing comments; an enumerator is NAME, NAME = <integer literal>
// (decimal, 0x hex, 0 octal, with an optional U/L suffix, optionally
// negative) or NAME = <earlier enumerator>; a bare NAME is the previous value
// plus one, as in C. Anything else in the body (a preprocessor line, an
// attribute, an expression) is an error, so a header that changes shape
// fails loudly rather than giving a wrong table. An enumerator is deprecated
// when the doc comment before it (or a trailing /**< */ one) says \deprecated
// or @deprecated.
//
// Aliases: when several names of one header share a code, the first
// non-deprecated one in header order names it (the first one when all are
// deprecated); the others are listed as aliases in the generated file. Across
// sources the first source's name wins; a different name for the same code in
// a later source is a conflict, reported on stderr and in the generated file.
// A name a later source gives another code than an earlier one is dropped
// with the same report, so every name is in a table once.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"go/format"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// enumSpec names one enum to read.
type enumSpec struct {
	file    string // header file name inside a source folder
	enum    string // the enum tag
	typedef string // the C type the agent sees
	table   string // Go table name
	fn      string // Go lookup function name
	example string // a name for the doc comment
}

var specs = []enumSpec{
	{"driver_types.h", "cudaError", "cudaError_t", "runtimeErrors", "RuntimeErrorName", "cudaErrorNoDevice"},
	{"cuda.h", "cudaError_enum", "CUresult", "driverErrors", "DriverErrorName", "CUDA_ERROR_NO_DEVICE"},
}

// enumerator is one NAME = value of an enum, in header order.
type enumerator struct {
	name       string
	value      uint32
	deprecated bool
}

// entry is one code of a generated table.
type entry struct {
	code       uint32
	name       string
	deprecated bool
	from       string   // the first source with the code (short name), when not the newest
	aliases    []string // other names of the code, "name (deprecated)" style
}

type source struct{ label, dir string }

// short is the label up to its first " (": "nvidia-cuda-dev 12.4.127~12.4.1-2".
func (s source) short() string {
	if i := strings.Index(s.label, " ("); i > 0 {
		return s.label[:i]
	}
	return s.label
}

type srcFlags []source

func (s *srcFlags) String() string { return fmt.Sprint(*s) }
func (s *srcFlags) Set(v string) error {
	i := strings.LastIndexByte(v, '=')
	if i < 0 || v[:i] == "" || v[i+1:] == "" {
		return fmt.Errorf("want LABEL=DIR, got %q", v)
	}
	*s = append(*s, source{v[:i], v[i+1:]})
	return nil
}

func main() {
	var srcs srcFlags
	out := flag.String("o", "", "output file (default: stdout)")
	by := flag.String("by", "scripts/nvidia/gen-errors.sh", "the generator named in the Code generated line")
	flag.Var(&srcs, "src", "LABEL=DIR: a folder with cuda.h and driver_types.h (split at the last =); repeat, newest first")
	flag.Parse()
	if len(srcs) == 0 || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: generrors [-o FILE] -src LABEL=DIR [-src LABEL=DIR ...]")
		os.Exit(2)
	}
	src, err := generate(srcs, *by)
	if err != nil {
		fmt.Fprintln(os.Stderr, "generrors:", err)
		os.Exit(1)
	}
	if *out == "" {
		os.Stdout.Write(src)
		return
	}
	if err := os.WriteFile(*out, src, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "generrors:", err)
		os.Exit(1)
	}
}

// notef reports something odd on stderr and keeps it for the generated file.
type notes []string

func (n *notes) add(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	fmt.Fprintln(os.Stderr, "generrors: note:", s)
	*n = append(*n, s)
}

func generate(srcs []source, by string) ([]byte, error) {
	var b bytes.Buffer
	var tables bytes.Buffer
	var allNotes notes
	var summary []string
	for _, sp := range specs {
		var perSource [][]enumerator
		for _, s := range srcs {
			path := filepath.Join(s.dir, sp.file)
			text, err := os.ReadFile(path)
			if err != nil {
				return nil, err
			}
			es, err := parseEnum(string(text), sp.enum)
			if err != nil {
				return nil, fmt.Errorf("%s: enum %s: %w", path, sp.enum, err)
			}
			perSource = append(perSource, es)
		}
		entries := merge(sp, srcs, perSource, &allNotes)
		parts := make([]string, len(srcs))
		for i, es := range perSource {
			parts[i] = fmt.Sprintf("%d enumerators in %s", len(es), srcs[i].short())
			if i > 0 {
				only := 0
				for _, e := range entries {
					if e.from == srcs[i].short() {
						only++
					}
				}
				parts[i] += fmt.Sprintf(" (%d codes not in %s)", only, srcs[0].short())
			}
		}
		summary = append(summary, fmt.Sprintf("%s (%s): %d codes; %s.", sp.typedef, sp.table, len(entries), strings.Join(parts, ", ")))
		writeTable(&tables, sp, entries)
	}

	fmt.Fprintf(&b, "// Code generated by %s from NVIDIA's CUDA headers. DO NOT EDIT.\n\n", by)
	b.WriteString("// Sources, newest first (a code several know takes the first one's name):\n")
	for _, s := range srcs {
		fmt.Fprintf(&b, "//   - %s\n", s.label)
	}
	b.WriteString("//\n")
	for _, s := range summary {
		fmt.Fprintf(&b, "// %s\n", s)
	}
	b.WriteString(`//
// Rules: the tables are the union of the sources' enums. When several names
// of one header share a code, the first non-deprecated one (header order)
// names it and the others are listed as aliases. A code the newest source
// lacks is marked "from <older source> only".
`)
	if len(allNotes) > 0 {
		b.WriteString("//\n// Notes:\n")
		for _, n := range allNotes {
			fmt.Fprintf(&b, "//   - %s\n", n)
		}
	}
	b.WriteString("\npackage event\n") // errorName and lookupError: event/results.go
	b.Write(tables.Bytes())
	return format.Source(b.Bytes())
}

// pick chooses a code's name among a header's enumerators sharing it.
func pick(es []enumerator) (chosen enumerator, aliases []string) {
	ci := 0
	for i, e := range es {
		if !e.deprecated {
			ci = i
			break
		}
	}
	for i, e := range es {
		if i == ci {
			continue
		}
		a := e.name
		if e.deprecated {
			a += " (deprecated)"
		}
		aliases = append(aliases, a)
	}
	return es[ci], aliases
}

func merge(sp enumSpec, srcs []source, perSource [][]enumerator, n *notes) []entry {
	byCode := map[uint32]*entry{}
	nameCode := map[string]uint32{}
	for si, es := range perSource {
		groups := map[uint32][]enumerator{}
		var order []uint32
		for _, e := range es {
			if _, ok := groups[e.value]; !ok {
				order = append(order, e.value)
			}
			groups[e.value] = append(groups[e.value], e)
		}
		for _, code := range order {
			chosen, aliases := pick(groups[code])
			if len(aliases) > 0 {
				n.add("%s %d in %s: %d names; kept %s, aliases %s", sp.typedef, code, srcs[si].short(), len(aliases)+1, chosen.name, strings.Join(aliases, ", "))
			}
			if old, ok := byCode[code]; ok {
				if old.name != chosen.name {
					n.add("%s %d: %s calls it %s, kept %s", sp.typedef, code, srcs[si].short(), chosen.name, old.name)
				}
				for _, a := range aliases {
					if !contains(old.aliases, a) && strings.TrimSuffix(a, " (deprecated)") != old.name {
						old.aliases = append(old.aliases, a)
					}
				}
				continue
			}
			if c, ok := nameCode[chosen.name]; ok {
				n.add("%s %s: %s gives it %d, an earlier source %d; dropped %d", sp.typedef, chosen.name, srcs[si].short(), code, c, code)
				continue
			}
			e := &entry{code: code, name: chosen.name, deprecated: chosen.deprecated, aliases: aliases}
			if si > 0 {
				e.from = srcs[si].short()
			}
			byCode[code] = e
			nameCode[chosen.name] = code
		}
	}
	out := make([]entry, 0, len(byCode))
	for _, e := range byCode {
		out = append(out, *e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].code < out[j].code })
	for _, e := range out {
		if e.from != "" {
			n.add("%s %d %s: not in %s, taken from %s", sp.typedef, e.code, e.name, srcs[0].short(), e.from)
		}
	}
	return out
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func writeTable(b *bytes.Buffer, sp enumSpec, entries []entry) {
	fmt.Fprintf(b, `
// %[1]s is the %[2]s name of a result (%[4]q); ok is false
// for a code the headers do not know. The C type is a 32-bit enum while a
// probe reads the whole 64-bit return register (rax): only the low 32 bits
// of code count (uint32(code)), so whatever the upper half holds does not
// hide the result.
func %[1]s(code uint64) (name string, ok bool) {
	return lookupError(%[3]s, uint32(code))
}

// %[3]s: enum %[5]s (%[2]s), sorted by code.
var %[3]s = []errorName{
`, sp.fn, sp.typedef, sp.table, sp.example, sp.enum)
	for _, e := range entries {
		var c []string
		if e.deprecated {
			c = append(c, "deprecated")
		}
		if e.from != "" {
			c = append(c, "from "+e.from+" only")
		}
		if len(e.aliases) > 0 {
			c = append(c, "alias "+strings.Join(e.aliases, ", "))
		}
		fmt.Fprintf(b, "\t{%d, %q},", e.code, e.name)
		if len(c) > 0 {
			fmt.Fprintf(b, " // %s", strings.Join(c, "; "))
		}
		b.WriteString("\n")
	}
	b.WriteString("}\n")
}

var (
	identRE   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	intSuffix = regexp.MustCompile(`[uUlL]+$`)
)

// parseEnum returns the enumerators of `enum NAME { ... }` in text.
func parseEnum(text, name string) ([]enumerator, error) {
	re := regexp.MustCompile(`\benum\s+(?:__device_builtin__\s+)?` + regexp.QuoteMeta(name) + `\s*\{`)
	locs := re.FindAllStringIndex(text, -1)
	if len(locs) != 1 {
		return nil, fmt.Errorf("found %d definitions, want 1", len(locs))
	}
	body := text[locs[0][1]:]
	end := strings.IndexByte(stripComments(body), '}')
	if end < 0 {
		return nil, fmt.Errorf("no closing brace")
	}
	// stripComments keeps offsets (comments become spaces), so end is an
	// offset into body too.
	body = body[:end]

	var (
		out    []enumerator
		values = map[string]uint32{}
		next   int64
		// A doc comment before an enumerator's name is about it (depCur); one
		// after its name but before its comma is about the next one (depNext,
		// as in 12.4's "= 999 /** ... */ , cudaErrorApiFailureBase"), unless
		// it is a trailing /**< */ comment, which is about the one before it.
		depCur, depNext bool
		item            strings.Builder
	)
	flush := func() error {
		s := strings.TrimSpace(item.String())
		item.Reset()
		if s == "" {
			return nil
		}
		lhs, rhs, hasValue := strings.Cut(s, "=")
		lhs = strings.TrimSpace(lhs)
		if !identRE.MatchString(lhs) {
			return fmt.Errorf("cannot parse enumerator %q", s)
		}
		v := next
		if hasValue {
			rhs = strings.Join(strings.Fields(rhs), "")
			if c, ok := values[rhs]; ok {
				v = int64(int32(c))
			} else {
				num := intSuffix.ReplaceAllString(rhs, "")
				var err error
				v, err = strconv.ParseInt(num, 0, 64)
				if err != nil {
					return fmt.Errorf("%s: cannot parse value %q", lhs, rhs)
				}
			}
		}
		if v < -1<<31 || v > 1<<32-1 {
			return fmt.Errorf("%s = %d does not fit 32 bits", lhs, v)
		}
		if _, dup := values[lhs]; dup {
			return fmt.Errorf("%s defined twice", lhs)
		}
		out = append(out, enumerator{name: lhs, value: uint32(v), deprecated: depCur})
		values[lhs] = uint32(v)
		next = v + 1
		depCur, depNext = depNext, false
		return nil
	}
	// comment notes a comment's deprecation for the right enumerator.
	comment := func(c string) {
		if !strings.Contains(c, `\deprecated`) && !strings.Contains(c, "@deprecated") {
			return
		}
		trailing := strings.HasPrefix(c, "/**<") || strings.HasPrefix(c, "/*!<") ||
			strings.HasPrefix(c, "///<") || strings.HasPrefix(c, "//!<")
		named := strings.TrimSpace(item.String()) != ""
		switch {
		case trailing && !named && len(out) > 0:
			out[len(out)-1].deprecated = true
		case trailing || !named:
			depCur = true
		default:
			depNext = true
		}
	}
	lineStart := true
	for i := 0; i < len(body); {
		switch {
		case strings.HasPrefix(body[i:], "/*"):
			j := strings.Index(body[i+2:], "*/")
			if j < 0 {
				return nil, fmt.Errorf("unterminated comment")
			}
			comment(body[i : i+2+j+2])
			item.WriteByte(' ')
			i += 2 + j + 2
		case strings.HasPrefix(body[i:], "//"):
			j := strings.IndexByte(body[i:], '\n')
			if j < 0 {
				j = len(body) - i
			}
			comment(body[i : i+j])
			i += j
		case lineStart && body[i] == '#':
			j := strings.IndexByte(body[i:], '\n')
			if j < 0 {
				j = len(body) - i
			}
			return nil, fmt.Errorf("preprocessor line inside the enum: %q (teach scripts/nvidia/generrors about it)", body[i:i+j])
		case body[i] == ',':
			if err := flush(); err != nil {
				return nil, err
			}
			i++
		default:
			c := body[i]
			item.WriteByte(c)
			if c == '\n' {
				lineStart = true
			} else if c != ' ' && c != '\t' && c != '\r' {
				lineStart = false
			}
			i++
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no enumerators")
	}
	return out, nil
}

// stripComments replaces C comments by spaces of the same length.
func stripComments(s string) string {
	b := []byte(s)
	for i := 0; i < len(b); {
		switch {
		case i+1 < len(b) && b[i] == '/' && b[i+1] == '*':
			j := bytes.Index(b[i+2:], []byte("*/"))
			end := len(b)
			if j >= 0 {
				end = i + 2 + j + 2
			}
			for k := i; k < end; k++ {
				if b[k] != '\n' {
					b[k] = ' '
				}
			}
			i = end
		case i+1 < len(b) && b[i] == '/' && b[i+1] == '/':
			for i < len(b) && b[i] != '\n' {
				b[i] = ' '
				i++
			}
		default:
			i++
		}
	}
	return string(b)
}

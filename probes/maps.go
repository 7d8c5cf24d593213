package probes

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/lanewatch/lanewatch/internal/ktext"
)

// Mapping is one line of /proc/PID/maps.
type Mapping struct {
	Start, End, Offset uint64
	Perms              string // "r-xp": read, write, execute, private|shared
	Dev                string // "fd:01", major:minor in hex
	Inode              uint64
	// Path is the rest of the line: a file path (may contain spaces, and ends
	// in " (deleted)" once the file is unlinked), a pseudo name such as
	// "[heap]" or "[anon:name]", or "" for an anonymous mapping. The kernel
	// escapes only '\n' (as "\012") and not '\\', so the path is kept as
	// printed rather than unescaped ambiguously.
	Path string
}

// Executable reports whether the mapping may hold code.
func (m Mapping) Executable() bool { return len(m.Perms) == 4 && m.Perms[2] == 'x' }

// FileBacked reports whether the mapping comes from a file (possibly
// deleted), as opposed to anonymous memory or a kernel pseudo mapping.
func (m Mapping) FileBacked() bool { return m.Inode != 0 && strings.HasPrefix(m.Path, "/") }

// maxMapsLine bounds one line: a path is at most PATH_MAX (4096) bytes, even
// escaped it stays far below this, so a longer line is not a maps file.
const maxMapsLine = 1 << 20

// ParseMaps parses the text of a /proc/PID/maps file. name is used in errors
// ("name:line: ..."). Mappings must come sorted and disjoint, as the kernel
// writes them; a file read while the process remaps may break that and
// gives an error the caller can retry. Blank lines, which the kernel never
// writes, are skipped (but counted in line numbers), as in every other
// parser of kernel text.
func ParseMaps(r io.Reader, name string) ([]Mapping, error) {
	var ms []Mapping
	err := ktext.Lines(r, name, maxMapsLine, func(_ int, text string) error {
		m, err := parseMapsLine(text)
		if err != nil {
			return err
		}
		if n := len(ms); n > 0 && m.Start < ms[n-1].End {
			return fmt.Errorf("mapping %x-%x overlaps or precedes %x-%x", m.Start, m.End, ms[n-1].Start, ms[n-1].End)
		}
		ms = append(ms, m)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ms, nil
}

// parseMapsLine parses "start-end perms offset dev inode [path]".
func parseMapsLine(s string) (Mapping, error) {
	var m Mapping
	rest := s
	field := func(what string) (string, error) {
		f, r, ok := strings.Cut(rest, " ")
		if f == "" {
			return "", fmt.Errorf("missing %s in %q", what, s)
		}
		if ok {
			rest = r
		} else {
			rest = ""
		}
		return f, nil
	}
	rng, err := field("address range")
	if err != nil {
		return m, err
	}
	lo, hi, ok := strings.Cut(rng, "-")
	if !ok {
		return m, fmt.Errorf("address range %q has no '-'", rng)
	}
	if m.Start, err = strconv.ParseUint(lo, 16, 64); err != nil {
		return m, fmt.Errorf("start address %q: %w", lo, err)
	}
	if m.End, err = strconv.ParseUint(hi, 16, 64); err != nil {
		return m, fmt.Errorf("end address %q: %w", hi, err)
	}
	if m.End <= m.Start {
		return m, fmt.Errorf("empty or reversed range %q", rng)
	}
	if m.Perms, err = field("permissions"); err != nil {
		return m, err
	}
	if !validPerms(m.Perms) {
		return m, fmt.Errorf("permissions %q, want like \"r-xp\"", m.Perms)
	}
	off, err := field("offset")
	if err != nil {
		return m, err
	}
	if m.Offset, err = strconv.ParseUint(off, 16, 64); err != nil {
		return m, fmt.Errorf("offset %q: %w", off, err)
	}
	if m.Dev, err = field("device"); err != nil {
		return m, err
	}
	major, minor, ok := strings.Cut(m.Dev, ":")
	if !ok || !ktext.IsHex(major) || !ktext.IsHex(minor) {
		return m, fmt.Errorf("device %q, want major:minor in hex", m.Dev)
	}
	ino, err := field("inode")
	if err != nil {
		return m, err
	}
	if m.Inode, err = strconv.ParseUint(ino, 10, 64); err != nil {
		return m, fmt.Errorf("inode %q: %w", ino, err)
	}
	// The kernel pads the path to a column with spaces; anonymous mappings
	// end right after the inode (with one trailing space).
	m.Path = strings.TrimLeft(rest, " ")
	return m, nil
}

func validPerms(p string) bool {
	return len(p) == 4 &&
		(p[0] == 'r' || p[0] == '-') &&
		(p[1] == 'w' || p[1] == '-') &&
		(p[2] == 'x' || p[2] == '-') &&
		(p[3] == 'p' || p[3] == 's')
}

// ReadMaps reads and parses <procRoot>/<pid>/maps. Errors wrap the os error,
// so errors.Is(err, fs.ErrNotExist) tells a process that is gone and
// fs.ErrPermission one the agent may not inspect.
func ReadMaps(procRoot string, pid int) ([]Mapping, error) {
	path := filepath.Join(procRoot, strconv.Itoa(pid), "maps")
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read maps: %w", err)
	}
	defer f.Close()
	return ParseMaps(f, path)
}

// FileID identifies the mapped file by device and inode ("fd:01", 1234), the
// same way the kernel and an attach by path do.
func (m Mapping) FileID() (FileID, error) {
	major, minor, ok := strings.Cut(m.Dev, ":")
	if !ok {
		return FileID{}, fmt.Errorf("bad device %q", m.Dev)
	}
	ma, err1 := strconv.ParseUint(major, 16, 32)
	mi, err2 := strconv.ParseUint(minor, 16, 32)
	if err1 != nil || err2 != nil {
		return FileID{}, fmt.Errorf("bad device %q", m.Dev)
	}
	return FileID{Dev: ma<<32 | mi, Inode: m.Inode}, nil
}

// MappedFiles lists the paths of the files a process maps (file-backed
// mappings of <procRoot>/<pid>/maps, in order, repeated as mapped).
func MappedFiles(procRoot string, pid int) ([]string, error) {
	maps, err := ReadMaps(procRoot, pid)
	if err != nil {
		return nil, err
	}
	var paths []string
	for _, m := range maps {
		if m.FileBacked() {
			paths = append(paths, m.Path)
		}
	}
	return paths, nil
}

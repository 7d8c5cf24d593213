package collectors

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/lanewatch/lanewatch/internal/ktext"
)

// ProcStatus is the part of /proc/PID/status the NUMA rules read, plus every
// line as text in Fields.
type ProcStatus struct {
	// Name as the kernel prints it: it escapes '\n' and '\\' in the command
	// name, and the name is truncated to 15 bytes.
	Name      string
	Tgid, Pid int
	// CpusAllowed and MemsAllowed are the sorted ids of Cpus_allowed_list
	// and Mems_allowed_list; nil when the kernel does not print them.
	CpusAllowed, MemsAllowed []int
	// CapEff is the effective capability mask; HasCapEff is false when the
	// line is missing (it always exists since Linux 2.6.x).
	CapEff    uint64
	HasCapEff bool
	// PeakRSSBytes is VmHWM, the resident set's high-water mark (0 for a
	// kernel thread, which has no VmHWM line).
	PeakRSSBytes uint64
	// Fields holds every "Key:\tvalue" line, value with surrounding white
	// space trimmed.
	Fields map[string]string
}

// CapSysNice is the bit of CAP_SYS_NICE in the capability masks. mbind(2)
// with MPOL_MF_MOVE_ALL and move_pages(2) on other users' processes need it,
// and numactl/libnuma use it; containers drop it by default.
const CapSysNice = 23

// HasCap reports whether bit is set in the effective capabilities.
func (s ProcStatus) HasCap(bit int) bool {
	return s.HasCapEff && bit >= 0 && bit < 64 && s.CapEff&(1<<bit) != 0
}

// ParseStatus parses the text of a /proc/PID/status file. name is used in
// errors ("name:line: ..."). Unknown keys are kept in Fields; a malformed
// line, a key given twice, or a bad value of a field we interpret is an error.
func ParseStatus(r io.Reader, name string) (ProcStatus, error) {
	st := ProcStatus{Fields: map[string]string{}}
	err := ktext.Lines(r, name, 1<<20, func(_ int, text string) error {
		key, val, ok := strings.Cut(text, ":")
		if !ok || key == "" || strings.ContainsAny(key, " \t") {
			return fmt.Errorf("want \"Key:\\tvalue\", got %q", text)
		}
		if _, dup := st.Fields[key]; dup {
			return fmt.Errorf("%s given twice", key)
		}
		// Name keeps inner spaces; only the tab after the colon goes.
		if key == "Name" {
			val = strings.TrimPrefix(val, "\t")
		} else {
			val = strings.TrimSpace(val)
		}
		st.Fields[key] = val
		if err := st.set(key, val); err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		return nil
	})
	if err != nil {
		return ProcStatus{}, err
	}
	return st, nil
}

func (st *ProcStatus) set(key, val string) error {
	var err error
	switch key {
	case "Name":
		st.Name = val
	case "Tgid":
		st.Tgid, err = parsePID(val)
	case "Pid":
		st.Pid, err = parsePID(val)
	case "Cpus_allowed_list":
		st.CpusAllowed, err = ktext.ParseList(val)
	case "Mems_allowed_list":
		st.MemsAllowed, err = ktext.ParseList(val)
	case "VmHWM":
		_, st.PeakRSSBytes, err = parseMeminfoLine(key + ":" + val) // "N kB", as in meminfo
	case "CapEff":
		if len(val) == 0 || len(val) > 16 || !ktext.IsHex(val) {
			return fmt.Errorf("%q is not a 64-bit hex mask", val)
		}
		st.CapEff, _ = strconv.ParseUint(val, 16, 64)
		st.HasCapEff = true
	}
	return err
}

func parsePID(s string) (int, error) {
	v, err := strconv.ParseInt(s, 10, 32)
	if err != nil || v < 0 || s[0] == '+' {
		return 0, fmt.Errorf("%q is not a pid", s)
	}
	return int(v), nil
}

// ReadStatus reads and parses <procRoot>/<pid>/status.
func ReadStatus(procRoot string, pid int) (ProcStatus, error) {
	path := filepath.Join(procRoot, strconv.Itoa(pid), "status")
	f, err := os.Open(path)
	if err != nil {
		return ProcStatus{}, fmt.Errorf("read status: %w", err)
	}
	defer f.Close()
	return ParseStatus(f, path)
}

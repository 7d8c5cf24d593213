package probes

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Capability bits (include/uapi/linux/capability.h).
const (
	capDACReadSearch     = 2
	capSysPtrace         = 19
	capSysAdmin          = 21
	capSysResource       = 24
	capPerfmon           = 38
	capBPF               = 39
	capCheckpointRestore = 40
)

// Privilege is a capability the agent lacks and what it is needed for.
type Privilege struct {
	Cap    string // "CAP_PERFMON"
	Needed string // what needs it
	// Fatal: the probes cannot run without it. Otherwise part of the
	// work is not done (Needed says which).
	Fatal bool
}

func (p Privilege) String() string { return p.Cap + " " + p.Needed }

// MissingPrivileges checks this process's effective capabilities (and, on
// kernels before 5.11, RLIMIT_MEMLOCK) against what the probes need, and
// names each one missing with what needs it. The minimum, found by running
// the agent as an unprivileged user against the reference data path
// (cmd/agent TestRunCapabilities): CAP_BPF and CAP_PERFMON, then for
// processes of other users (or holding capabilities the agent lacks)
// CAP_SYS_PTRACE to trace them at all and CAP_DAC_READ_SEARCH to read their
// environment, and CAP_CHECKPOINT_RESTORE to probe a library replaced on
// disk since it was mapped; CAP_SYS_ADMIN stands for the first two and the
// last. Being root is not needed.
func MissingPrivileges() ([]Privilege, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return nil, fmt.Errorf("capget: %w", err)
	}
	eff := uint64(data[0].Effective) | uint64(data[1].Effective)<<32
	major, minor, err := kernelVersion()
	if err != nil {
		return nil, err
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
		return nil, fmt.Errorf("getrlimit RLIMIT_MEMLOCK: %w", err)
	}
	return missingPrivileges(eff, major, minor, lim.Cur), nil
}

// missingPrivileges decides MissingPrivileges from the effective
// capability mask, the kernel's version and RLIMIT_MEMLOCK's soft limit.
func missingPrivileges(eff uint64, major, minor int, memlock uint64) []Privilege {
	has := func(c int) bool { return eff&(1<<c) != 0 }
	before := func(ma, mi int) bool { return major < ma || major == ma && minor < mi }
	var out []Privilege
	switch {
	case before(5, 8): // no CAP_BPF nor CAP_PERFMON yet
		if !has(capSysAdmin) {
			out = append(out, Privilege{"CAP_SYS_ADMIN", "to load the BPF programs and attach the uprobes (kernels before 5.8 have no CAP_BPF and CAP_PERFMON)", true})
		}
	case !has(capSysAdmin):
		if !has(capBPF) {
			out = append(out, Privilege{"CAP_BPF", "to load the BPF programs and maps (the ring buffer, the calls in flight)", true})
		}
		if !has(capPerfmon) {
			out = append(out, Privilege{"CAP_PERFMON", "to load tracing programs and attach the uprobes and the exec/exit tracepoints", true})
		}
	}
	if !has(capSysPtrace) {
		out = append(out, Privilege{"CAP_SYS_PTRACE", "to read the memory maps, libraries (/proc/PID/root) and page nodes (move_pages) of processes of other users or holding capabilities the agent lacks: those are not traced", false})
	}
	if !has(capSysAdmin) && (before(5, 9) || !has(capCheckpointRestore)) {
		cp := "CAP_CHECKPOINT_RESTORE"
		if before(5, 9) {
			cp = "CAP_SYS_ADMIN"
		}
		out = append(out, Privilege{cp, "to open a library replaced or deleted on disk since a process mapped it (/proc/PID/map_files, an in-place upgrade): such a library is not probed", false})
	}
	if !has(capDACReadSearch) {
		out = append(out, Privilege{"CAP_DAC_READ_SEARCH", "to read the environment of other users' processes (/proc/PID/environ is its owner's only: their CUDA_VISIBLE_DEVICES, so their GPUs, stay unknown) and libraries in directories the agent's user may not read", false})
	}
	if before(5, 11) && memlock != unix.RLIM_INFINITY && !has(capSysResource) {
		out = append(out, Privilege{"CAP_SYS_RESOURCE", fmt.Sprintf("to lift RLIMIT_MEMLOCK (%d bytes): kernels before 5.11 charge BPF maps to it (or start the agent under ulimit -l unlimited)", memlock), true})
	}
	return out
}

// kernelVersion is the running kernel's major and minor version.
func kernelVersion() (int, int, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return 0, 0, fmt.Errorf("uname: %w", err)
	}
	return parseKernelRelease(unix.ByteSliceToString(u.Release[:]))
}

// parseKernelRelease reads "MAJOR.MINOR" from the front of a kernel release
// ("6.18.44-fc-v1045", "5.10.0-28-amd64", "4.18.0-513.el8.x86_64").
func parseKernelRelease(r string) (int, int, error) {
	digits := func(s string) string {
		if i := strings.IndexFunc(s, func(c rune) bool { return c < '0' || c > '9' }); i >= 0 {
			return s[:i]
		}
		return s
	}
	ma, rest, ok := strings.Cut(r, ".")
	mi := digits(rest)
	major, err1 := strconv.Atoi(ma)
	minor, err2 := strconv.Atoi(mi)
	if !ok || digits(ma) != ma || mi == "" || err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("kernel release %q: no MAJOR.MINOR", r)
	}
	return major, minor, nil
}

// kernelBefore says whether the running kernel is older than major.minor
// (false when it cannot tell).
func kernelBefore(major, minor int) bool {
	ma, mi, err := kernelVersion()
	return err == nil && (ma < major || ma == major && mi < minor)
}

// fatalPrivileges is the error naming every missing privilege the probes
// cannot run without; nil when none is (or capabilities cannot be read).
func fatalPrivileges() error {
	missing, err := MissingPrivileges()
	if err != nil {
		return nil // the kernel's own answer will tell
	}
	var msgs []string
	for _, p := range missing {
		if p.Fatal {
			msgs = append(msgs, "missing "+p.String())
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return fmt.Errorf("%s", strings.Join(msgs, "; "))
}

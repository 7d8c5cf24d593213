package probes

import (
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMissingPrivileges(t *testing.T) {
	caps := func(cs ...int) uint64 {
		var m uint64
		for _, c := range cs {
			m |= 1 << c
		}
		return m
	}
	inf := uint64(unix.RLIM_INFINITY)
	for _, tc := range []struct {
		name          string
		eff           uint64
		major, minor  int
		memlock       uint64
		fatal, warned string
	}{
		{"the minimum", caps(capBPF, capPerfmon, capSysPtrace, capDACReadSearch, capCheckpointRestore), 6, 18, 8 << 20, "", ""},
		{"root", ^uint64(0), 6, 18, 8 << 20, "", ""},
		{"CAP_SYS_ADMIN stands for both", caps(capSysAdmin, capSysPtrace, capDACReadSearch), 6, 1, 8 << 20, "", ""},
		{"none", 0, 6, 18, 8 << 20, "CAP_BPF CAP_PERFMON", "CAP_SYS_PTRACE CAP_CHECKPOINT_RESTORE CAP_DAC_READ_SEARCH"},
		{"no CAP_PERFMON", caps(capBPF, capSysPtrace, capDACReadSearch, capCheckpointRestore), 6, 18, 8 << 20, "CAP_PERFMON", ""},
		{"no CAP_BPF", caps(capPerfmon, capSysPtrace, capDACReadSearch, capCheckpointRestore), 6, 18, 8 << 20, "CAP_BPF", ""},
		{"own processes only", caps(capBPF, capPerfmon), 6, 18, 8 << 20, "", "CAP_SYS_PTRACE CAP_CHECKPOINT_RESTORE CAP_DAC_READ_SEARCH"},
		{"others' GPUs unknown", caps(capBPF, capPerfmon, capSysPtrace, capCheckpointRestore), 6, 18, 8 << 20, "", "CAP_DAC_READ_SEARCH"},
		{"replaced libraries", caps(capBPF, capPerfmon, capSysPtrace, capDACReadSearch), 6, 18, 8 << 20, "", "CAP_CHECKPOINT_RESTORE"},
		{"5.8: only CAP_SYS_ADMIN opens map_files", caps(capBPF, capPerfmon, capSysPtrace, capDACReadSearch, capCheckpointRestore, capSysResource), 5, 8, 8 << 20, "", "CAP_SYS_ADMIN"},
		{"5.10 with a memlock limit", caps(capBPF, capPerfmon, capSysPtrace, capDACReadSearch, capCheckpointRestore), 5, 10, 64 << 10, "CAP_SYS_RESOURCE", ""},
		{"5.10 unlimited", caps(capBPF, capPerfmon, capSysPtrace, capDACReadSearch, capCheckpointRestore), 5, 10, inf, "", ""},
		{"5.10 may lift it", caps(capBPF, capPerfmon, capSysPtrace, capDACReadSearch, capCheckpointRestore, capSysResource), 5, 10, 64 << 10, "", ""},
		{"5.11 charges the cgroup", caps(capBPF, capPerfmon, capSysPtrace, capDACReadSearch, capCheckpointRestore), 5, 11, 64 << 10, "", ""},
		{"4.18 needs CAP_SYS_ADMIN", caps(capBPF, capPerfmon, capSysPtrace, capDACReadSearch, capCheckpointRestore, capSysResource), 4, 18, 64 << 10, "CAP_SYS_ADMIN", "CAP_SYS_ADMIN"},
	} {
		var fatal, warned []string
		for _, p := range missingPrivileges(tc.eff, tc.major, tc.minor, tc.memlock) {
			if p.Needed == "" {
				t.Errorf("%s: %s without a reason", tc.name, p.Cap)
			}
			if p.Fatal {
				fatal = append(fatal, p.Cap)
			} else {
				warned = append(warned, p.Cap)
			}
		}
		if f, w := strings.Join(fatal, " "), strings.Join(warned, " "); f != tc.fatal || w != tc.warned {
			t.Errorf("%s: fatal %q, warned %q; want %q, %q", tc.name, f, w, tc.fatal, tc.warned)
		}
	}
}

func TestParseKernelRelease(t *testing.T) {
	for _, tc := range []struct {
		r            string
		major, minor int
	}{{"6.18.44-fc-v1045", 6, 18}, {"5.10.0-28-amd64", 5, 10}, {"4.18.0-513.el8.x86_64", 4, 18}, {"6.1", 6, 1}, {"5.11-rc1", 5, 11}} {
		if ma, mi, err := parseKernelRelease(tc.r); err != nil || ma != tc.major || mi != tc.minor {
			t.Errorf("%q: %d.%d %v", tc.r, ma, mi, err)
		}
	}
	for _, bad := range []string{"", "6", "x.1", "6.x", "-1.2", "+6.1", "6.-1", ".1"} {
		if _, _, err := parseKernelRelease(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func FuzzParseKernelRelease(f *testing.F) {
	f.Add("6.18.44-fc-v1045")
	f.Add("4.18.0-513.el8.x86_64")
	f.Fuzz(func(t *testing.T, r string) {
		ma, mi, err := parseKernelRelease(r)
		if err != nil {
			return
		}
		if ma2, mi2, err := parseKernelRelease(fmt.Sprintf("%d.%d", ma, mi)); ma < 0 || mi < 0 || err != nil || ma2 != ma || mi2 != mi {
			t.Fatalf("%q: %d.%d, printed back %d.%d %v", r, ma, mi, ma2, mi2, err)
		}
	})
}

package main

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/bits"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/lanewatch/lanewatch/collectors"
	"github.com/lanewatch/lanewatch/probes"
)

// The checks below are what the flag package cannot make: each error names
// the flag and what is wrong with its value, and the command exits 2
// before it starts anything.

// checkRoot checks a --path.procfs or --path.sysfs: a directory.
func checkRoot(flag, path string) error {
	if path == "" {
		return fmt.Errorf("--%s is empty: give the mount point (or a captured tree)", flag)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("--%s: %w", flag, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("--%s %s: not a directory", flag, path)
	}
	return nil
}

// checkRootFS checks --path.rootfs: a directory, or - for none.
func checkRootFS(path string) error {
	if path == "-" {
		return nil
	}
	return checkRoot("path.rootfs", path)
}

// checkPIDs checks that every --pid names a running user-space process
// under procRoot: not gone, not a kernel thread (no library to probe), not
// one thread of a process (events carry the process's id).
func checkPIDs(procRoot string, pids []int) error {
	var errs []error
	for _, pid := range pids {
		dir := filepath.Join(procRoot, strconv.Itoa(pid))
		kernel, err := collectors.IsKernelThread(procRoot, pid)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			errs = append(errs, fmt.Errorf("--pid %d: no such process (no %s)", pid, dir))
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("--pid %d: %w", pid, err))
			continue
		}
		st, err := collectors.ReadStatus(procRoot, pid)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("--pid %d: %w", pid, err))
		case kernel:
			errs = append(errs, fmt.Errorf("--pid %d: %s is a kernel thread: it maps no library to probe", pid, st.Name))
		case st.Tgid != pid:
			errs = append(errs, fmt.Errorf("--pid %d: a thread of process %d (%s): give the process", pid, st.Tgid, st.Name))
		}
	}
	return errors.Join(errs...)
}

// checkLibs checks that every --lib is an ELF file the probes can attach
// to: 64-bit x86-64, a shared library or an executable.
// builtFor names the architecture the probes are built for.
func builtFor() string {
	if probes.HostMachine() == elf.EM_AARCH64 {
		return "arm64"
	}
	return "x86-64"
}

func checkLibs(libs []string) error {
	var errs []error
	for _, lib := range libs {
		if err := elfMagic(lib); err != nil {
			errs = append(errs, fmt.Errorf("--lib %s: %w", lib, err))
			continue
		}
		f, err := elf.Open(lib)
		if err != nil {
			errs = append(errs, fmt.Errorf("--lib %s: %w", lib, err))
			continue
		}
		switch {
		case f.Class != elf.ELFCLASS64 || f.Machine != probes.HostMachine():
			errs = append(errs, fmt.Errorf("--lib %s: an ELF file for %s (%s); the probes are built for %s", lib, f.Machine, f.Class, builtFor()))
		case f.Type != elf.ET_DYN && f.Type != elf.ET_EXEC:
			errs = append(errs, fmt.Errorf("--lib %s: an ELF %s, not a shared library or executable", lib, f.Type))
		}
		f.Close()
	}
	return errors.Join(errs...)
}

// elfMagic checks that path starts as an ELF file does.
func elfMagic(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var magic [4]byte
	n, err := io.ReadFull(f, magic[:])
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return err
	}
	if string(magic[:n]) != elf.ELFMAG {
		return fmt.Errorf("not an ELF file (it starts with %q)", magic[:n])
	}
	return nil
}

// maxRingBytes bounds --ring-bytes: the ring is locked kernel memory, and
// 1 GiB drains for seconds at the agent's rate.
const maxRingBytes = 1 << 30

// checkRing checks --ring-bytes: 0 (the default) or a power of two from a
// page to maxRingBytes, as the kernel's BPF ring buffer takes it.
func checkRing(n uint) error {
	page := uint(os.Getpagesize())
	if n != 0 && (bits.OnesCount(n) != 1 || n < page || n > maxRingBytes) {
		return fmt.Errorf("--ring-bytes %d: want a power of two from %d (a page) to %d (1 GiB), or 0 for 4 MiB", n, page, maxRingBytes)
	}
	return nil
}

// positive checks a duration flag that must be more than zero.
func positive(flag string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("--%s %s: must be positive", flag, d)
	}
	return nil
}

// positiveInt checks an integer flag that must be more than zero.
func positiveInt(flag string, n int) error {
	if n <= 0 {
		return fmt.Errorf("--%s %d: must be positive", flag, n)
	}
	return nil
}

// notNegative checks a duration flag for which zero means none or every time.
func notNegative(flag string, d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("--%s %s: must not be negative", flag, d)
	}
	return nil
}

// usageErrors prints each error of err on its own line, prefixed with the
// command, and returns 2 (nil: 0).
func usageErrors(stderr io.Writer, cmd string, err error) int {
	if err == nil {
		return 0
	}
	for _, e := range flatten(err) {
		fmt.Fprintf(stderr, "agent %s: %v\n", cmd, e)
	}
	return 2
}

// flatten lists the errors of nested errors.Join.
func flatten(err error) []error {
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	var errs []error
	for _, e := range joined.Unwrap() {
		errs = append(errs, flatten(e)...)
	}
	return errs
}

// checkPrivileges names every capability the probes lack
// (probes.MissingPrivileges): false when one they cannot run without is
// missing (each printed with what needs it); the others are logged.
func checkPrivileges(stderr io.Writer, cmd string, log *slog.Logger) bool {
	missing, err := probes.MissingPrivileges()
	if err != nil {
		log.Warn("capabilities unknown", "err", err)
		return true
	}
	ok := true
	for _, p := range missing {
		if p.Fatal {
			fmt.Fprintf(stderr, "agent %s: missing %s\n", cmd, p)
			ok = false
		} else {
			log.Warn("missing "+p.Cap, "needed", p.Needed)
		}
	}
	return ok
}

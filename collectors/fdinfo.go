package collectors

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ParseFdinfoFlags returns the open flags of /proc/PID/fdinfo/FD text (the
// "flags:" line, octal, as proc(5) gives it); name is used in errors. A
// missing or malformed flags line, or two of them, is an error.
func ParseFdinfoFlags(text, name string) (uint64, error) {
	var flags uint64
	found := false
	for line := range strings.SplitSeq(text, "\n") {
		v, ok := strings.CutPrefix(line, "flags:")
		if !ok {
			continue
		}
		if found {
			return 0, fmt.Errorf("%s: two flags lines", name)
		}
		v = strings.TrimSpace(v)
		f, err := strconv.ParseUint(v, 8, 64)
		if err != nil || v == "" || v[0] == '+' {
			return 0, fmt.Errorf("%s: flags %q is not an octal number", name, v)
		}
		flags, found = f, true
	}
	if !found {
		return 0, fmt.Errorf("%s: no flags line", name)
	}
	return flags, nil
}

// OpenFile is what a process's open file descriptor names: the device of
// its file system and its inode, and whether it was opened O_DIRECT.
type OpenFile struct {
	Dev, Ino uint64
	Direct   bool
}

// ReadOpenFile stats procRoot/PID/fd/FD and reads its fdinfo flags.
func ReadOpenFile(procRoot string, pid uint32, fd int32) (OpenFile, error) {
	of, err := StatFD(procRoot, pid, fd)
	if err != nil {
		return OpenFile{}, err
	}
	of.Direct, err = FDDirect(procRoot, pid, fd)
	return of, err
}

// StatFD is the device and inode of the file behind procRoot/PID/fd/FD
// (Direct unset).
func StatFD(procRoot string, pid uint32, fd int32) (OpenFile, error) {
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(procRoot, strconv.Itoa(int(pid)), "fd", strconv.Itoa(int(fd))), &st); err != nil {
		return OpenFile{}, fmt.Errorf("pid %d fd %d: %w", pid, fd, err)
	}
	return OpenFile{Dev: uint64(st.Dev), Ino: st.Ino}, nil
}

// FDDirect reports whether pid's fd is open O_DIRECT (its fdinfo flags).
func FDDirect(procRoot string, pid uint32, fd int32) (bool, error) {
	p := filepath.Join(procRoot, strconv.Itoa(int(pid)), "fdinfo", strconv.Itoa(int(fd)))
	b, err := os.ReadFile(p)
	if err != nil {
		return false, err
	}
	flags, err := ParseFdinfoFlags(string(b), p)
	return flags&unix.O_DIRECT != 0, err
}

// BlockDeviceName names the block device dev (a file system's st_dev) from
// sysRoot/dev/block/MAJ:MIN; "" and no error when dev is not a block
// device (major 0: tmpfs, overlayfs, btrfs subvolumes, procfs).
func BlockDeviceName(sysRoot string, dev uint64) (string, error) {
	maj, mnr := unix.Major(dev), unix.Minor(dev)
	if maj == 0 {
		return "", nil
	}
	l, err := os.Readlink(filepath.Join(sysRoot, "dev", "block", fmt.Sprintf("%d:%d", maj, mnr)))
	if err != nil {
		return "", err
	}
	return filepath.Base(l), nil
}

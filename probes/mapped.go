package probes

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// MappedFile is a file a process maps, held open by the agent: through the
// descriptor the file (its inode) stays readable and attachable after the
// process that mapped it exited, and even once the file was unlinked
// (docs/design.md, "Attach and discovery"). A uprobe attached through it
// holds the inode itself, so the descriptor can be closed once the attach
// is done.
type MappedFile struct {
	f    *os.File
	ID   FileID // device and inode, as the mapping names them
	Path string // the path as the process sees it (for messages and metrics)
	Via  string // how it was opened: "map_files" or "root"
}

// OpenPath is the path the agent reads and attaches the file by,
// /proc/self/fd/N: the kernel resolves it to the open file whatever its
// name is now.
func (mf *MappedFile) OpenPath() string { return "/proc/self/fd/" + strconv.Itoa(int(mf.f.Fd())) }

// Close releases the descriptor.
func (mf *MappedFile) Close() error { return mf.f.Close() }

// ErrFileReplaced says the path a process mapped a file by now names
// another file (a library upgraded in place), and the mapping itself could
// not be opened.
var ErrFileReplaced = errors.New("the path now names another file")

// OpenMapped opens the file behind one file-backed mapping of a process.
// It opens /proc/PID/map_files/START-END first: exactly the mapped file,
// deleted or renamed or not (the kernel asks CAP_SYS_ADMIN or
// CAP_CHECKPOINT_RESTORE for it, fs/proc/base.c). Without that, it opens
// the path through /proc/PID/root and accepts it only if it is still the
// mapped device and inode (ErrFileReplaced otherwise). Both need the
// process alive: a caller opens the file as soon as it reads the mapping,
// before the slow part (symbols, sites, attach). The error of a process
// that is gone wraps fs.ErrNotExist.
func OpenMapped(procRoot string, pid int, m Mapping) (*MappedFile, error) {
	id, err := m.FileID()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	mapFile := filepath.Join(dir, "map_files", strconv.FormatUint(m.Start, 16)+"-"+strconv.FormatUint(m.End, 16))
	f, mapErr := os.Open(mapFile)
	if mapErr == nil {
		return &MappedFile{f: f, ID: id, Path: m.Path, Via: "map_files"}, nil
	}
	root := filepath.Join(dir, "root", m.Path)
	f, err = os.Open(root)
	if err != nil {
		return nil, fmt.Errorf("%w (and %v)", err, mapErr)
	}
	got, err := fileIDOf(f)
	if err == nil && got != id {
		err = fmt.Errorf("%s: %w (device %#x inode %d, mapped %#x %d; %s: %v)", m.Path, ErrFileReplaced, got.Dev, got.Inode, id.Dev, id.Inode, mapFile, mapErr)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return &MappedFile{f: f, ID: id, Path: m.Path, Via: "root"}, nil
}

// fileIDOf is an open file's device and inode, in FileID's form.
func fileIDOf(f *os.File) (FileID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return FileID{}, fmt.Errorf("fstat %s: %w", f.Name(), err)
	}
	return FileID{Dev: uint64(unix.Major(st.Dev))<<32 | uint64(unix.Minor(st.Dev)), Inode: st.Ino}, nil
}

// OpenFile opens a file named by its path (a library given on the command
// line), as a MappedFile of its own device and inode.
func OpenFile(path string) (*MappedFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	id, err := fileIDOf(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &MappedFile{f: f, ID: id, Path: path, Via: "path"}, nil
}

// overlayMagic is overlayfs's statfs type (OVERLAYFS_SUPER_MAGIC).
const overlayMagic = 0x794c7630

// Fingerprint names a file on overlayfs by what every mount of the same
// image layer shows alike. Each container's overlay mount has a device of
// its own, so one layer's file has a FileID per container, while the
// kernel attaches uprobes to the one real inode: probing it once per
// container fires every probe that many times (a second entry overwrites
// the first, a second return finds none).
type Fingerprint struct {
	Inode, Size     uint64
	ModNs, ChangeNs int64
}

// Fingerprint is the file's overlay fingerprint; ok is false off overlayfs.
func (mf *MappedFile) Fingerprint() (fp Fingerprint, ok bool, err error) {
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(mf.f.Fd()), &fs); err != nil {
		return Fingerprint{}, false, fmt.Errorf("fstatfs %s: %w", mf.Path, err)
	}
	if fs.Type != overlayMagic {
		return Fingerprint{}, false, nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(mf.f.Fd()), &st); err != nil {
		return Fingerprint{}, false, fmt.Errorf("fstat %s: %w", mf.Path, err)
	}
	return Fingerprint{Inode: st.Ino, Size: uint64(st.Size), ModNs: st.Mtim.Nano(), ChangeNs: st.Ctim.Nano()}, true, nil
}

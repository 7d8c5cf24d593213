package probes

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lanewatch/lanewatch/internal/testenv"
)

// A live process's mapping opens through /proc/PID/map_files: exactly the
// mapped file, even once its path names another file or none.
func TestOpenMappedLive(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	bin := copyFile(t, "/bin/sleep", filepath.Join(dir, "sleep"))
	cmd := exec.Command(bin, "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var m Mapping
	for i := 0; i < 500 && m.Path == ""; i++ {
		maps, err := ReadMaps("/proc", cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		for _, mm := range maps {
			if mm.Path == bin && mm.Executable() {
				m = mm
			}
		}
	}
	if m.Path == "" {
		t.Fatalf("%s never mapped its own binary", bin)
	}
	os.Remove(bin) // its path names nothing now
	mf, err := OpenMapped("/proc", cmd.Process.Pid, m)
	if err != nil {
		t.Fatal(err)
	}
	defer mf.Close()
	want, _ := m.FileID()
	got, err := fileIDOf(mf.f)
	if mf.Via != "map_files" || err != nil || got != want || mf.ID != want {
		t.Errorf("opened via %s device %#x inode %d (%v), want map_files %#x %d", mf.Via, got.Dev, got.Inode, err, want.Dev, want.Inode)
	}
	if _, err := LookupSymbols(mf.OpenPath(), []string{"nanosleep"}); err != nil && !errors.Is(err, ErrNoSymbolTable) {
		t.Errorf("read through %s: %v", mf.OpenPath(), err)
	}
}

// Without map_files (a procfs that does not show them, or no
// CAP_SYS_ADMIN), the path through /proc/PID/root is taken only while it
// still names the mapped device and inode.
func TestOpenMappedThroughRoot(t *testing.T) {
	proc, dir := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "42"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/", filepath.Join(proc, "42", "root")); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, "libcuda.so.1")
	os.WriteFile(lib, []byte("first"), 0o644)
	mapping := func() Mapping {
		var st unix.Stat_t
		if err := unix.Stat(lib, &st); err != nil {
			t.Fatal(err)
		}
		return Mapping{Start: 0x1000, End: 0x2000, Perms: "r-xp", Dev: fmt.Sprintf("%02x:%02x", unix.Major(st.Dev), unix.Minor(st.Dev)), Inode: st.Ino, Path: lib}
	}
	m := mapping()
	mf, err := OpenMapped(proc, 42, m)
	if err != nil || mf.Via != "root" {
		t.Fatalf("OpenMapped through root: %+v %v", mf, err)
	}
	mf.Close()

	// Upgraded in place: a new file renamed over the path.
	os.WriteFile(lib+".new", []byte("second"), 0o644)
	if err := os.Rename(lib+".new", lib); err != nil {
		t.Fatal(err)
	}
	if mf, err := OpenMapped(proc, 42, m); !errors.Is(err, ErrFileReplaced) {
		t.Errorf("after the path was replaced: %+v %v, want ErrFileReplaced", mf, err)
	}
	os.Remove(lib)
	if mf, err := OpenMapped(proc, 42, m); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after the file was removed: %+v %v, want not exist", mf, err)
	}
}

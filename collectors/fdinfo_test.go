package collectors

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseFdinfoFlags(t *testing.T) {
	for _, c := range []struct {
		text string
		want uint64
		err  string
	}{
		{"pos:\t0\nflags:\t0140000\nmnt_id:\t25\nino:\t1234\n", 0o140000, ""},
		{"pos:\t4096\nflags:\t02\n", 2, ""},
		{"pos:\t0\nmnt_id:\t25\n", 0, "no flags line"},
		{"flags:\t09\n", 0, "not an octal number"},
		{"flags:\t\n", 0, "not an octal number"},
		{"flags:\t+7\n", 0, "not an octal number"},
		{"flags:\t02\nflags:\t02\n", 0, "two flags lines"},
	} {
		got, err := ParseFdinfoFlags(c.text, "fdinfo/3")
		if c.err != "" {
			if err == nil || !strings.HasPrefix(err.Error(), "fdinfo/3: ") || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: err %v, want %q", c.text, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: %o, %v; want %o", c.text, got, err, c.want)
		}
	}
}

func FuzzParseFdinfoFlags(f *testing.F) {
	f.Add("pos:\t0\nflags:\t0140000\nmnt_id:\t25\n")
	f.Add("flags:\t02\nflags:\t02\n")
	f.Fuzz(func(t *testing.T, text string) {
		flags, err := ParseFdinfoFlags(text, "fdinfo/3")
		if namesFile(t, err, "fdinfo/3") && !strings.Contains(text, "flags:") {
			t.Fatalf("parsed %o from text without a flags line", flags)
		}
	})
}

// This process's own file, opened O_DIRECT where the file system allows it,
// and a pipe, which is on no block device.
func TestReadOpenFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	plain, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	of, err := ReadOpenFile("/proc", uint32(os.Getpid()), int32(plain.Fd()))
	if err != nil || of.Direct || of.Ino == 0 {
		t.Fatalf("%+v %v", of, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil || uint64(st.Dev) != of.Dev || st.Ino != of.Ino {
		t.Fatalf("stat %+v vs %+v %v", st, of, err)
	}
	if name, err := BlockDeviceName("/sys", of.Dev); err != nil {
		t.Errorf("block device of %s: %v", p, err)
	} else if _, err := os.Stat(filepath.Join("/sys/class/block", name)); name != "" && err != nil {
		t.Errorf("block device %q of %s: %v", name, p, err)
	} else {
		t.Logf("%s is on block device %q (\"\" when the file system has none)", p, name)
	}
	if fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECT, 0); err == nil {
		defer unix.Close(fd)
		if of, err := ReadOpenFile("/proc", uint32(os.Getpid()), int32(fd)); err != nil || !of.Direct {
			t.Errorf("O_DIRECT fd: %+v %v", of, err)
		}
	} else {
		t.Logf("O_DIRECT not allowed on %s: %v", p, err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	of, err = ReadOpenFile("/proc", uint32(os.Getpid()), int32(r.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	if name, err := BlockDeviceName("/sys", of.Dev); name != "" || err != nil {
		t.Errorf("a pipe on block device %q (%v)", name, err)
	}
	if _, err := ReadOpenFile("/proc", uint32(os.Getpid()), 9999); err == nil {
		t.Error("fd 9999: want an error")
	}
}

package collectors

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestParseProcImage(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join("testdata", "stat", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	cat := read("lanewatch-dev_cat_self.stat")
	for _, tc := range []struct {
		name, stat string
		want       ProcImage
		err        string
	}{
		// cat reading its own stat on the development host (Linux 6.18)
		{"process", cat, ProcImage{StartTime: 878772, ArgStart: 140737239075293, ArgEnd: 140737239075313,
			EnvStart: 140737239075313, EnvEnd: 140737239076843}, ""},
		// a kernel thread: no memory, no arguments, no environment
		{"kernel thread", read("lanewatch-dev_kthreadd.stat"), ProcImage{StartTime: 25}, ""},
		// a command name with spaces and parentheses: fields count from the last ')'
		{"odd name", strings.Replace(cat, "(cat)", "(a) (b c)", 1), ProcImage{StartTime: 878772, ArgStart: 140737239075293,
			ArgEnd: 140737239075313, EnvStart: 140737239075313, EnvEnd: 140737239076843}, ""},
		// a kernel before 3.5: 44 fields, no addresses
		{"old kernel", strings.Join(strings.Fields(cat)[:44], " "), ProcImage{StartTime: 878772}, ""},
		{"no name", "19197 cat R 1", ProcImage{}, "no ')'"},
		{"short", "19197 (cat) R 19194 19194", ProcImage{}, "5 fields, want at least 22"},
		{"bad start time", strings.Replace(cat, " 878772 ", " -5 ", 1), ProcImage{}, `field 22: "-5"`},
		{"bad address", strings.Replace(cat, " 140737239076843 ", " 0x10 ", 1), ProcImage{}, `field 51: "0x10"`},
	} {
		got, err := ParseProcImage([]byte(tc.stat))
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %+v, %v; want error %q", tc.name, got, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("%s: %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		stat string
		want bool
		err  string
	}{
		{cat, false, ""},
		{read("lanewatch-dev_kthreadd.stat"), true, ""},
		{"5 (kworker/0:0H) I 2 0 0 0 -1 69238880 0", true, ""}, // flags 0x4208060
		{"5 (x) S 2 0 0 0", false, "7 fields, want at least 9"},
		{"5 (x) S 2 0 0 0 -1 0x10", false, `field 9: "0x10"`},
	} {
		got, err := ParseKernelThread([]byte(tc.stat))
		if got != tc.want || tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("ParseKernelThread(%q) = %v, %v; want %v, %q", tc.stat, got, err, tc.want, tc.err)
		}
	}
	if k, err := IsKernelThread("/proc", 2); err != nil || !k {
		t.Errorf("pid 2 (kthreadd): %v %v", k, err)
	}
	if k, err := IsKernelThread("/proc", os.Getpid()); err != nil || k {
		t.Errorf("this process: %v %v", k, err)
	}
	if _, err := ReadProcImage("/proc", os.Getpid()); err != nil {
		t.Errorf("this process: %v", err)
	}
	if _, err := ReadProcImage(t.TempDir(), 7); err == nil || !strings.Contains(err.Error(), "7/stat") {
		t.Errorf("missing: %v", err)
	}
}

func FuzzParseProcImage(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "stat", "*.stat"))
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("1 (a)) b) S 0 0 0 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 25"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ParseKernelThread(b)
		img, err := ParseProcImage(b)
		if err != nil {
			return
		}
		// the start time is the 20th field after the name
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if v, err := strconv.ParseUint(f[19], 10, 64); err != nil || v != img.StartTime {
			t.Fatalf("start time %d from %q", img.StartTime, f[19])
		}
	})
}

// openCounter counts the opens of one file (inotify IN_OPEN): how the
// tests see each read of a process's environment.
type openCounter struct{ fd int }

func countOpens(t *testing.T, path string) *openCounter {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.InotifyAddWatch(fd, path, unix.IN_OPEN); err != nil {
		t.Fatal(err)
	}
	return &openCounter{fd}
}

// take returns the opens since the last take.
func (c *openCounter) take(t *testing.T) int {
	t.Helper()
	n := 0
	buf := make([]byte, 4096)
	for {
		k, err := unix.Read(c.fd, buf)
		if err == unix.EAGAIN {
			return n
		}
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= k; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			if ev.Mask&unix.IN_OPEN != 0 {
				n++
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
}

// writeEnviron writes a fixture's PID/environ.
func writeEnviron(t *testing.T, procRoot string, pid int, block string) string {
	t.Helper()
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "environ")
	if err := os.WriteFile(path, []byte(block), 0o400); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeStat writes a fixture's PID/stat with the image's fields.
func writeStat(t *testing.T, procRoot string, pid int, img ProcImage) {
	t.Helper()
	f := make([]string, 52)
	for i := range f {
		f[i] = "0"
	}
	f[0], f[1], f[2] = strconv.Itoa(pid), "(python3)", "S"
	f[21] = strconv.FormatUint(img.StartTime, 10)
	f[47], f[48] = strconv.FormatUint(img.ArgStart, 10), strconv.FormatUint(img.ArgEnd, 10)
	f[49], f[50] = strconv.FormatUint(img.EnvStart, 10), strconv.FormatUint(img.EnvEnd, 10)
	if err := os.WriteFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"), []byte(strings.Join(f, " ")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A process's environment is read once per image, however often it is
// asked for: again after an exec (its environment block laid out anew) and
// for a new process under a reused pid, never otherwise, nor after it
// exited (answered from its last image); the rest of the block is neither
// kept nor returned. A process gone before it was asked about is an error
// and is not remembered.
func TestEnvCacheReadsOncePerImage(t *testing.T) {
	proc := t.TempDir()
	first := "PATH=/bin\x00SECRET_TOKEN=hunter2\x00CUDA_VISIBLE_DEVICES=1\x00"
	execd := "SECRET_TOKEN=hunter2\x00CUDA_VISIBLE_DEVICES=0,1\x00CUDA_DEVICE_ORDER=PCI_BUS_ID\x00"
	reused := "HOME=/root\x00"
	opens := countOpens(t, writeEnviron(t, proc, 4242, first))
	img := ProcImage{StartTime: 100, ArgStart: 0x7ffd0000, ArgEnd: 0x7ffd0010, EnvStart: 0x7ffd0010, EnvEnd: 0x7ffd0100}
	writeStat(t, proc, 4242, img)
	c := NewEnvCache(proc)
	get := func(want map[string]string) {
		t.Helper()
		for range 5 {
			got, err := c.Get(4242)
			if err != nil || len(got) != len(want) {
				t.Fatalf("Get: %v %v, want %v", got, err, want)
			}
			for k, v := range want {
				if got[k] != v {
					t.Fatalf("Get: %v, want %v", got, want)
				}
			}
			got["SECRET_TOKEN"] = "x" // a caller's copy: the cache keeps its own
		}
		if n := opens.take(t); n != 1 {
			t.Fatalf("environ read %d times, want once", n)
		}
	}
	get(map[string]string{"CUDA_VISIBLE_DEVICES": "1"})
	writeEnviron(t, proc, 4242, execd) // exec: another environment block, elsewhere
	img.ArgStart, img.ArgEnd, img.EnvStart, img.EnvEnd = 0x7ffe0000, 0x7ffe0010, 0x7ffe0010, 0x7ffe0200
	writeStat(t, proc, 4242, img)
	opens.take(t) // the fixture's own write
	get(map[string]string{"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
	writeEnviron(t, proc, 4242, reused) // the pid reused
	img.StartTime = 900
	writeStat(t, proc, 4242, img)
	opens.take(t)
	get(map[string]string{})
	c.Forget(4242)
	get(map[string]string{})
	if err := os.Remove(filepath.Join(proc, "4242", "stat")); err != nil { // exited
		t.Fatal(err)
	}
	for range 3 {
		if env, err := c.Get(4242); err != nil || len(env) != 0 {
			t.Errorf("after the exit: %v %v, want its last image's", env, err)
		}
	}
	if n := opens.take(t); n != 0 {
		t.Errorf("environ read %d times after the exit", n)
	}

	for k, e := range c.procs {
		for v := range e.env {
			if v != "CUDA_VISIBLE_DEVICES" && v != "CUDA_DEVICE_ORDER" {
				t.Errorf("pid %d: kept %s", k, v)
			}
		}
	}
	if _, err := c.Get(77); err == nil || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "77/environ") {
		t.Errorf("a process that is gone: %v", err)
	}
	if _, ok := c.procs[77]; ok {
		t.Error("a process that is gone is remembered")
	}
}

// A fixture without stat files: each process is read once.
func TestEnvCacheWithoutStat(t *testing.T) {
	proc := t.TempDir()
	opens := countOpens(t, writeEnviron(t, proc, 5, "CUDA_VISIBLE_DEVICES=3\x00"))
	c := NewEnvCache(proc)
	for range 3 {
		if env, err := c.Get(5); err != nil || env["CUDA_VISIBLE_DEVICES"] != "3" {
			t.Fatalf("%v %v", env, err)
		}
	}
	if n := opens.take(t); n != 1 {
		t.Errorf("environ read %d times", n)
	}
}

// The cache never remembers more than its maximum (maxEnvProcs, 64 here):
// past it, the processes no longer running their image go, then, if none
// did, all.
func TestEnvCacheBounded(t *testing.T) {
	proc := t.TempDir()
	c := NewEnvCache(proc)
	const max = 64
	c.max = max
	add := func(pid int) {
		t.Helper()
		writeEnviron(t, proc, pid, "CUDA_VISIBLE_DEVICES=0\x00")
		writeStat(t, proc, pid, ProcImage{StartTime: uint64(pid)})
		if _, err := c.Get(pid); err != nil {
			t.Fatal(err)
		}
	}
	for pid := 1; pid <= max; pid++ {
		add(pid)
	}
	for pid := 1; pid <= 10; pid++ { // exited
		if err := os.RemoveAll(filepath.Join(proc, strconv.Itoa(pid))); err != nil {
			t.Fatal(err)
		}
	}
	add(max + 1)
	if n := len(c.procs); n != max-10+1 {
		t.Errorf("%d processes remembered after 10 exited, want %d", n, max-10+1)
	}
	for pid := max + 2; pid <= max+11; pid++ {
		add(pid)
	}
	if n := len(c.procs); n != 1 {
		t.Errorf("%d processes remembered after the cap was hit with every one running, want 1", n)
	}
}

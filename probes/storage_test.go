package probes

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/lanewatch/lanewatch/internal/testenv"
	"golang.org/x/sys/unix"
)

func storageFile(tb testing.TB) *os.File {
	tb.Helper()
	p := filepath.Join(tb.TempDir(), "kv")
	if err := os.WriteFile(p, make([]byte, 1<<16), 0o644); err != nil {
		tb.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { f.Close() })
	return f
}

// Each read form of a watched process is reported with its fd, buffer and
// bytes; nothing is reported before the process is watched or after.
func TestStorageTracer(t *testing.T) {
	testenv.RequireRoot(t)
	tr, err := OpenStorageTracer(slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	f := storageFile(t)
	fd := int(f.Fd())
	buf := make([]byte, 4096)
	second := make([]byte, 512)
	addr := uint64(uintptr(unsafe.Pointer(&buf[0])))

	got := make(chan StorageRead, 1024)
	go func() {
		for {
			r, err := tr.Read()
			if err != nil {
				if !errors.Is(err, ringbuf.ErrClosed) {
					t.Error(err)
				}
				close(got)
				return
			}
			if r.FD == int32(fd) {
				got <- r
			}
		}
	}()
	if _, err := unix.Pread(fd, buf, 0); err != nil { // not watched yet
		t.Fatal(err)
	}
	if err := tr.Watch(uint32(os.Getpid())); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Pread(fd, buf[:1000], 0); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Read(fd, buf[:2000]); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Preadv(fd, [][]byte{buf[:3000], second}, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Preadv2(fd, [][]byte{buf[:100]}, 0, 0); err != nil {
		t.Fatal(err)
	}
	tr.Unwatch(uint32(os.Getpid()))
	if _, err := unix.Pread(fd, buf, 0); err != nil { // no longer watched
		t.Fatal(err)
	}
	want := []struct {
		call  string
		bytes int64
	}{{"pread64", 1000}, {"read", 2000}, {"preadv", 3512}, {"preadv2", 100}}
	for i, w := range want {
		select {
		case r := <-got:
			if r.Call != w.call || r.Bytes != w.bytes || r.Buf != addr || r.PID != uint32(os.Getpid()) || r.Time == 0 {
				t.Errorf("read %d: %+v, want %s of %d bytes into %#x", i, r, w.call, w.bytes, addr)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("read %d (%s) not reported", i, w.call)
		}
	}
	tr.Close()
	for r := range got {
		t.Errorf("reported after Unwatch or twice: %+v", r)
	}
	if d := tr.Drops(); d != 0 {
		t.Errorf("%d drops", d)
	}
}

// The cost of the attached program on a read syscall: none attached, attached
// (this process not watched: what every other process on the host pays), and
// watched (the reads reported and drained). And on a syscall it does not
// report (getppid), which pays the sys_exit tracepoint too.
func BenchmarkStorageTracer(b *testing.B) {
	testenv.RequireRoot(b)
	f := storageFile(b)
	fd := int(f.Fd())
	buf := make([]byte, 4096)
	pread := func(b *testing.B) {
		for b.Loop() {
			if _, err := unix.Pread(fd, buf, 0); err != nil {
				b.Fatal(err)
			}
		}
	}
	getppid := func(b *testing.B) {
		for b.Loop() {
			unix.Getppid()
		}
	}
	b.Run("pread/none", pread)
	b.Run("getppid/none", getppid)
	tr, err := OpenStorageTracer(slog.Default())
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	go func() {
		for {
			if _, err := tr.Read(); err != nil {
				return
			}
		}
	}()
	b.Run("pread/attached", pread)
	b.Run("getppid/attached", getppid)
	if err := tr.Watch(uint32(os.Getpid())); err != nil {
		b.Fatal(err)
	}
	b.Run("pread/watched", pread)
	b.Run("getppid/watched", getppid)
}

package probes

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"runtime"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
)

// StorageRead is one read a watched process made that returned data:
// read, pread64, preadv or preadv2 (bpf/storage.bpf.c). Buf is the buffer,
// or the first iovec's base for the vector forms.
type StorageRead struct {
	Time     uint64 // CLOCK_MONOTONIC ns at the call's return
	PID, TID uint32
	FD       int32
	Buf      uint64
	Bytes    int64
	Call     string
}

// StorageTracer reports the reads of the processes it watches. Its program
// runs at the exit of every system call on the host while attached
// (docs/design.md, "The storage leg", for its measured cost).
type StorageTracer struct {
	objs   storageObjects
	link   link.Link
	reader *ringbuf.Reader
}

// OpenStorageTracer loads and attaches the storage program.
func OpenStorageTracer(log *slog.Logger) (*StorageTracer, error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, err
	}
	spec, err := loadStorage()
	if err != nil {
		return nil, err
	}
	if err := setPIDNamespace(spec, log); err != nil {
		return nil, err
	}
	t := &StorageTracer{}
	if err := spec.LoadAndAssign(&t.objs, nil); err != nil {
		return nil, fmt.Errorf("load the storage program: %w", err)
	}
	if t.link, err = link.AttachTracing(link.TracingOptions{Program: t.objs.LwStorageExit}); err != nil {
		t.objs.Close()
		return nil, fmt.Errorf("attach tp_btf/sys_exit: %w", err)
	}
	if t.reader, err = ringbuf.NewReader(t.objs.StorageReads); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// Watch adds a process (its pid as the agent sees it).
func (t *StorageTracer) Watch(pid uint32) error {
	return t.objs.StoragePids.Update(pid, uint8(1), ebpf.UpdateAny)
}

// Unwatch removes a process; one never watched is no error.
func (t *StorageTracer) Unwatch(pid uint32) {
	_ = t.objs.StoragePids.Delete(pid)
}

// Read blocks until the next read; after Close it returns an error
// wrapping ringbuf.ErrClosed.
func (t *StorageTracer) Read() (StorageRead, error) {
	rec, err := t.reader.Read()
	if err != nil {
		return StorageRead{}, err
	}
	var r storageLwStorageRead
	if len(rec.RawSample) < binary.Size(r) {
		return StorageRead{}, fmt.Errorf("storage read record of %d bytes", len(rec.RawSample))
	}
	if _, err := binary.Decode(rec.RawSample, binary.NativeEndian, &r); err != nil {
		return StorageRead{}, err
	}
	return StorageRead{Time: r.TimeNs, PID: r.Pid, TID: r.Tid, FD: r.Fd, Buf: r.Buf, Bytes: r.Bytes, Call: readCallName(r.Nr)}, nil
}

// Drops is how many reads were lost to a full ring.
func (t *StorageTracer) Drops() uint64 {
	var per []uint64
	if err := t.objs.StorageDrops.Lookup(uint32(0), &per); err != nil {
		return 0
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n
}

// Close detaches the program and ends Read.
func (t *StorageTracer) Close() error {
	var errs []error
	if t.reader != nil {
		errs = append(errs, t.reader.Close())
	}
	if t.link != nil {
		errs = append(errs, t.link.Close())
	}
	errs = append(errs, t.objs.Close())
	return errors.Join(errs...)
}

// readCallName names the system calls the program reports.
func readCallName(nr uint32) string {
	names := map[uint32]string{0: "read", 17: "pread64", 295: "preadv", 327: "preadv2"}
	if runtime.GOARCH == "arm64" {
		names = map[uint32]string{63: "read", 67: "pread64", 69: "preadv", 286: "preadv2"}
	}
	if n, ok := names[nr]; ok {
		return n
	}
	return fmt.Sprintf("syscall %d", nr)
}

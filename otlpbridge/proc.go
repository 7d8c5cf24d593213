package otlpbridge

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
)

// ProcInfo tells the index what it needs of the host's processes.
type ProcInfo interface {
	// HostID is the host id SGLang computes inside process pid
	// (trace.py _get_host_id: /etc/machine-id as that process sees it);
	// false when it cannot be known here.
	HostID(pid uint32) (string, bool)
	// Parent is pid's parent process; false when unknown (gone, pid 1).
	Parent(pid uint32) (uint32, bool)
}

// ProcFS reads ProcInfo from a procfs mount, caching what it read (bounded;
// Forget drops it, so a reused pid is read again).
type ProcFS struct {
	root string

	mu      sync.Mutex
	hosts   map[uint32]hostID
	parents map[uint32]uint32 // 0: none or unknown
}

type hostID struct {
	id string
	ok bool
}

const procCacheMax = 8192

// NewProcFS reads processes under root ("": /proc).
func NewProcFS(root string) *ProcFS {
	if root == "" {
		root = "/proc"
	}
	return &ProcFS{root: root, hosts: map[uint32]hostID{}, parents: map[uint32]uint32{}}
}

// HostID reads ROOT/PID/root/etc/machine-id: the file SGLang's
// _get_host_id reads first, in the process's own mount namespace (a
// container has its own). When a process has none SGLang falls back to a
// MAC address (uuid.getnode), which cannot be read from outside: unknown.
func (p *ProcFS) HostID(pid uint32) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if h, ok := p.hosts[pid]; ok {
		return h.id, h.ok
	}
	id, err := readSmall(filepath.Join(p.root, strconv.FormatUint(uint64(pid), 10), "root", "etc", "machine-id"))
	h := hostID{id: string(bytes.TrimSpace(id)), ok: err == nil}
	h.ok = h.ok && h.id != ""
	if len(p.hosts) >= procCacheMax {
		clear(p.hosts)
	}
	p.hosts[pid] = h
	return h.id, h.ok
}

// Parent reads the ppid from ROOT/PID/stat.
func (p *ProcFS) Parent(pid uint32) (uint32, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pp, ok := p.parents[pid]; ok {
		return pp, pp != 0
	}
	b, err := readSmall(filepath.Join(p.root, strconv.FormatUint(uint64(pid), 10), "stat"))
	var pp uint32
	if err == nil {
		pp, _ = parseStatPPID(b)
	}
	if len(p.parents) >= procCacheMax {
		clear(p.parents)
	}
	p.parents[pid] = pp
	return pp, pp != 0
}

// Forget drops the cache.
func (p *ProcFS) Forget() {
	p.mu.Lock()
	clear(p.hosts)
	clear(p.parents)
	p.mu.Unlock()
}

func readSmall(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 4096))
}

// parseStatPPID reads the 4th field of /proc/PID/stat: "pid (comm) state
// ppid …"; comm may hold spaces and parentheses, so the fields start after
// the last ')'.
func parseStatPPID(b []byte) (uint32, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat: no ')' closing the command name")
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 2 {
		return 0, fmt.Errorf("stat: %d fields after the command name, want the state and ppid", len(f))
	}
	v, err := strconv.ParseUint(string(f[1]), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("stat: ppid %q: %w", f[1], err)
	}
	return uint32(v), nil
}

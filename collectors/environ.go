package collectors

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// BehaviourEnv names the only variables the agent reads from another
// process's environment: those that decide which GPU its CUDA calls use.
// Nothing else of /proc/PID/environ is kept, logged or exported (it holds
// the process's secrets as much as its settings).
var BehaviourEnv = []string{"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"}

// ParseBehaviourEnv picks the BehaviourEnv variables out of an environ
// block (NUL-separated KEY=VALUE). The last of repeated keys wins, as with
// getenv on a glibc environment built by execve. An entry without '=' is
// skipped: the kernel does not check the block's shape.
func ParseBehaviourEnv(block []byte) map[string]string {
	out := map[string]string{}
	for len(block) > 0 {
		entry, rest, _ := bytes.Cut(block, []byte{0})
		block = rest
		k, v, ok := bytes.Cut(entry, []byte{'='})
		if ok && slices.Contains(BehaviourEnv, string(k)) {
			out[string(k)] = string(v)
		}
	}
	return out
}

// ReadBehaviourEnv reads the BehaviourEnv variables of a process.
func ReadBehaviourEnv(procRoot string, pid int) (map[string]string, error) {
	path := filepath.Join(procRoot, strconv.Itoa(pid), "environ")
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return ParseBehaviourEnv(b), nil
}

// ProcImage tells one image of a process from another without reading its
// memory: the process's start time (a reused pid has another) and where its
// arguments and environment were laid out at exec (a new image lays them
// out anew, on a stack randomised at every exec). /proc/PID/stat fields 22
// and 48–51; the last four are 0 to a reader without ptrace access to the
// process, and absent before Linux 3.5.
type ProcImage struct {
	StartTime                          uint64 // clock ticks after boot
	ArgStart, ArgEnd, EnvStart, EnvEnd uint64
}

// statFields splits the text of /proc/PID/stat: field(n) is the unsigned
// number in field n (1-based, as proc(5) numbers them, from 3 on), and
// count the number of fields. The command name (field 2) may hold spaces
// and parentheses: the fields are counted from the last ')'.
func statFields(b []byte) (field func(n int) (uint64, error), count int, err error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, 0, errors.New("no ')' closing the command name")
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3, the state
	return func(n int) (uint64, error) {
		if n-3 >= len(f) {
			return 0, fmt.Errorf("%d fields, want at least %d", len(f)+2, n)
		}
		v, err := strconv.ParseUint(f[n-3], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("field %d: %q is not an unsigned number", n, f[n-3])
		}
		return v, nil
	}, len(f) + 2, nil
}

// ParseProcImage reads a ProcImage from the text of /proc/PID/stat.
func ParseProcImage(b []byte) (ProcImage, error) {
	field, count, err := statFields(b)
	if err != nil {
		return ProcImage{}, err
	}
	var img ProcImage
	if img.StartTime, err = field(22); err != nil {
		return ProcImage{}, err
	}
	if count >= 51 {
		for n, p := range map[int]*uint64{48: &img.ArgStart, 49: &img.ArgEnd, 50: &img.EnvStart, 51: &img.EnvEnd} {
			if *p, err = field(n); err != nil {
				return ProcImage{}, err
			}
		}
	}
	return img, nil
}

// pfKthread is PF_KTHREAD (include/linux/sched.h) in /proc/PID/stat's
// flags (field 9).
const pfKthread = 0x00200000

// ParseKernelThread says whether the text of /proc/PID/stat is a kernel
// thread's: it has no user memory, no library to probe.
func ParseKernelThread(b []byte) (bool, error) {
	field, _, err := statFields(b)
	if err != nil {
		return false, err
	}
	flags, err := field(9)
	if err != nil {
		return false, err
	}
	return flags&pfKthread != 0, nil
}

// IsKernelThread reads whether process pid is a kernel thread.
func IsKernelThread(procRoot string, pid int) (bool, error) {
	path := filepath.Join(procRoot, strconv.Itoa(pid), "stat")
	b, err := os.ReadFile(path)
	if err != nil {
		return false, fmt.Errorf("read %s: %w", path, err)
	}
	k, err := ParseKernelThread(b)
	if err != nil {
		return false, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// ReadProcImage reads the ProcImage of a process.
func ReadProcImage(procRoot string, pid int) (ProcImage, error) {
	path := filepath.Join(procRoot, strconv.Itoa(pid), "stat")
	b, err := os.ReadFile(path)
	if err != nil {
		return ProcImage{}, fmt.Errorf("read %s: %w", path, err)
	}
	img, err := ParseProcImage(b)
	if err != nil {
		return ProcImage{}, fmt.Errorf("%s: %w", path, err)
	}
	return img, nil
}

// maxEnvProcs bounds the processes an EnvCache remembers.
const maxEnvProcs = 4096

// EnvCache reads the BehaviourEnv variables of each process once per
// process image and keeps only those. The environment a process was given
// is fixed at exec (/proc/PID/environ shows that block, whatever the
// process did since with setenv), so a second read could only tell the
// same again, and would read the process's secrets again. An image is
// known by its ProcImage, read each time (it holds no secret): a new one
// (exec, a reused pid) is read anew. Where stat cannot be read (a procfs
// fixture with environ files only), a process is read once per pid. Safe
// for concurrent use.
type EnvCache struct {
	procRoot string
	max      int // processes remembered at most (maxEnvProcs)
	mu       sync.Mutex
	procs    map[int]envEntry
}

type envEntry struct {
	image ProcImage
	known bool // image was read
	env   map[string]string
}

// NewEnvCache returns an empty cache of the processes under procRoot.
func NewEnvCache(procRoot string) *EnvCache {
	return &EnvCache{procRoot: procRoot, max: maxEnvProcs, procs: map[int]envEntry{}}
}

// Get returns the BehaviourEnv variables of a process (a copy): from the
// cache while the process runs the image they were read from, or after it
// exited (its transfers are still judged), else read from its environ. A
// process whose environ cannot be read (gone before it was asked about, no
// permission) is an error naming the file, and is not remembered.
func (c *EnvCache) Get(pid int) (map[string]string, error) {
	img, imgErr := ReadProcImage(c.procRoot, pid)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.procs[pid]; ok {
		switch {
		case e.known == (imgErr == nil) && e.image == img:
			return maps.Clone(e.env), nil
		case e.known && errors.Is(imgErr, fs.ErrNotExist): // exited: nothing new to read
			return maps.Clone(e.env), nil
		}
	}
	delete(c.procs, pid)
	env, err := ReadBehaviourEnv(c.procRoot, pid)
	if err != nil {
		return nil, err
	}
	if len(c.procs) >= c.max {
		c.prune()
	}
	c.procs[pid] = envEntry{image: img, known: imgErr == nil, env: env}
	return maps.Clone(env), nil
}

// Forget drops what is known of a process (it exited or exec'd).
func (c *EnvCache) Forget(pid int) {
	c.mu.Lock()
	delete(c.procs, pid)
	c.mu.Unlock()
}

// prune drops the processes that no longer run the image they were read
// from; if all still do, it forgets them all (they are read again when
// asked): the cache never grows past its maximum.
func (c *EnvCache) prune() {
	for pid, e := range c.procs {
		if img, err := ReadProcImage(c.procRoot, pid); err != nil || !e.known || img != e.image {
			delete(c.procs, pid)
		}
	}
	if len(c.procs) >= c.max {
		clear(c.procs)
	}
}

package collectors

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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

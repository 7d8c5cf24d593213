package probes

import (
	"fmt"
	"log/slog"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// initPIDNamespace is the inode of the host's PID namespace, the same on
// every kernel (PROC_PID_INIT_INO, include/linux/proc_ns.h).
const initPIDNamespace = 0xEFFFFFFC

// setPIDNamespace tells the programs the agent's own PID namespace when it
// is not the host's (a sidecar sharing its pod's, `podman run --pid
// container:NAME`): events then carry pids as the agent's /proc shows
// them, and threads outside the namespace are ignored. In the host's
// namespace the programs keep host pids and see every thread.
func setPIDNamespace(spec *ebpf.CollectionSpec, log *slog.Logger) error {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &st); err != nil {
		return fmt.Errorf("the agent's PID namespace: %w", err)
	}
	if st.Ino == initPIDNamespace {
		return nil
	}
	if err := spec.Variables["pidns_dev"].Set(uint64(st.Dev)); err != nil {
		return fmt.Errorf("set pidns_dev: %w", err)
	}
	if err := spec.Variables["pidns_ino"].Set(st.Ino); err != nil {
		return fmt.Errorf("set pidns_ino: %w", err)
	}
	log.Info("in a PID namespace of its own: only its processes are traced, by their pids there", "pidns_inode", st.Ino)
	return nil
}

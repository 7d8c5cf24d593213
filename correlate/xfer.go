package correlate

import "strings"

// Transfer libraries (UCX, libfabric; docs/design.md, "Transfer
// libraries"): a transfer as the application posted it, the transport and
// device the library chose for it, and when it completed.

// TransportClass says what kind of lane a library's transport is.
type TransportClass uint8

const (
	TransportUnknown TransportClass = iota // not seen, or a name the agent does not know
	TransportRDMA                          // an RDMA NIC moves the bytes (rc_mlx5, dc_mlx5, rc_verbs, ud_*, efa, verbs)
	TransportNetwork                       // the host's network stack over a NIC (tcp, sockets, udp): no RDMA
	TransportLocal                         // the same host, no NIC (posix, sysv, cma, knem, xpmem, self, shm)
	TransportGPU                           // the GPU's own paths (cuda_ipc, cuda_copy, gdr_copy, rocm_*)
)

// ClassOf classifies a UCX transport name or a libfabric provider name
// ("tcp;ofi_rxm": the core provider, first, decides).
func ClassOf(transport string) TransportClass {
	core, _, _ := strings.Cut(transport, ";")
	switch {
	case core == "":
		return TransportUnknown
	case strings.HasPrefix(core, "rc_") || strings.HasPrefix(core, "dc_") || strings.HasPrefix(core, "ud_") ||
		core == "rc" || core == "dc" || core == "ud" || core == "efa" || core == "verbs" || core == "psm3" || core == "opx":
		return TransportRDMA
	case core == "tcp" || core == "sockets" || core == "udp" || core == "net":
		return TransportNetwork
	case core == "posix" || core == "sysv" || core == "cma" || core == "knem" || core == "xpmem" || core == "self" || core == "shm" || core == "sm":
		return TransportLocal
	case strings.HasPrefix(core, "cuda_") || core == "gdr_copy" || strings.HasPrefix(core, "rocm_"):
		return TransportGPU
	}
	return TransportUnknown
}

// MoverOf is who moves a library transfer's bytes on a lane of this class.
func MoverOf(c TransportClass) string {
	switch c {
	case TransportRDMA, TransportNetwork:
		return MoverNIC
	case TransportGPU:
		return MoverCopyEngine
	case TransportLocal:
		return MoverCPU
	}
	return ""
}

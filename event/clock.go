package event

import "golang.org/x/sys/unix"

// Now reads CLOCK_MONOTONIC, the clock the BPF programs stamp events with
// (bpf_ktime_get_ns), in ns: the time line of every Call and of the
// counter samples judged beside them.
func Now() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return uint64(ts.Nano())
}

package main

import (
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// defaultMemoryLimit is --memory-limit's default. Measured (make rss,
// docs/measurements.md "Agent memory"): `agent run` with the DaemonSet's
// flags under 48-61 k copies/s and process churn peaked at 104-114 MiB
// resident; 512 MiB, 4.5 times that, leaves its bounded parts (the OTLP
// span index an eighth of it, pending copies of many processes) room
// without letting a leak take the host.
const defaultMemoryLimit = 512 << 20

// nonGoBytes is what the agent holds outside the Go heap, taken from the
// memory limit before the Go runtime's soft limit is set: the BPF ring,
// mapped twice (the kernel maps its data pages back to back), and NVML's
// or DCGM's C allocations, stacks and binary.
func nonGoBytes(ringBytes uint64) uint64 {
	if ringBytes == 0 {
		ringBytes = 4 << 20
	}
	return 2*ringBytes + 64<<20
}

// minGoLimit is the smallest Go soft limit --memory-limit may leave: below
// it the collector would run without pause on the agent's steady heap.
const minGoLimit = 64 << 20

// parseSize reads a memory size as GOMEMLIMIT writes it: a number of bytes
// with an optional unit B, KiB, MiB, GiB or TiB, or "off" (no limit:
// math.MaxInt64).
func parseSize(s string) (int64, error) {
	if s == "off" {
		return math.MaxInt64, nil
	}
	num := strings.TrimRight(s, "BKMGTi")
	mult := map[string]int64{"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}[s[len(num):]]
	n, err := strconv.ParseInt(num, 10, 64)
	switch {
	case mult == 0:
		return 0, fmt.Errorf("%q: unit %q is not B, KiB, MiB, GiB or TiB", s, s[len(num):])
	case err != nil || n < 0 || num[0] == '+':
		return 0, fmt.Errorf("%q: want a number of bytes with an optional unit (B, KiB, MiB, GiB, TiB), or off", s)
	case n > math.MaxInt64/mult:
		return 0, fmt.Errorf("%q: more than %d bytes", s, int64(math.MaxInt64))
	}
	return n * mult, nil
}

// memoryLimit decides the agent's memory ceiling from --memory-limit
// (flag; "" its default), GOMEMLIMIT (env) and the ring size: the limit
// (math.MaxInt64: none), the Go runtime's soft limit to set, and where it
// came from. An explicit flag wins; else GOMEMLIMIT, which the Go runtime
// has already applied, is taken as the Go soft limit as it stands.
func memoryLimit(flag, env string, ringBytes uint64) (limit, goLimit int64, source string, err error) {
	switch {
	case flag != "":
		limit, source = 0, "--memory-limit"
		if limit, err = parseSize(flag); err != nil {
			return 0, 0, "", fmt.Errorf("--memory-limit %w", err)
		}
	case env != "":
		goLimit, err = parseSize(env)
		if err != nil {
			return 0, 0, "", fmt.Errorf("GOMEMLIMIT %w", err)
		}
		limit = goLimit
		if goLimit < math.MaxInt64-int64(nonGoBytes(ringBytes)) {
			limit = goLimit + int64(nonGoBytes(ringBytes))
		}
		return limit, goLimit, "GOMEMLIMIT", nil
	default:
		limit, source = defaultMemoryLimit, "default"
	}
	if limit == math.MaxInt64 {
		return limit, limit, source, nil
	}
	goLimit = limit - int64(nonGoBytes(ringBytes))
	if goLimit < minGoLimit {
		return 0, 0, "", fmt.Errorf("--memory-limit %d: leaves the Go heap %d bytes after the ring and C libraries (%d); want at least %d",
			limit, goLimit, nonGoBytes(ringBytes), limit-goLimit+minGoLimit)
	}
	return limit, goLimit, source, nil
}

// applyMemoryLimit sets the Go runtime's soft limit (debug.SetMemoryLimit)
// for `agent run`; see memoryLimit.
func applyMemoryLimit(flag string, ringBytes uint64) (limit, goLimit int64, source string, err error) {
	limit, goLimit, source, err = memoryLimit(flag, os.Getenv("GOMEMLIMIT"), ringBytes)
	if err == nil {
		debug.SetMemoryLimit(goLimit)
	}
	return limit, goLimit, source, err
}

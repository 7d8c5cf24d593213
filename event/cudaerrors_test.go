package event

import "testing"

func TestRuntimeErrorName(t *testing.T) {
	for _, c := range []struct {
		code uint64
		name string
	}{
		{0, "cudaSuccess"},
		{1, "cudaErrorInvalidValue"},
		{2, "cudaErrorMemoryAllocation"},
		{3, "cudaErrorInitializationError"},
		{4, "cudaErrorCudartUnloading"},
		{35, "cudaErrorInsufficientDriver"},
		{100, "cudaErrorNoDevice"},
		{201, "cudaErrorDeviceUninitialized"},
		{700, "cudaErrorIllegalAddress"},
		{811, "cudaErrorCdpNotSupported"}, // 12.4 only
		{999, "cudaErrorUnknown"},
		{10000, "cudaErrorApiFailureBase"}, // the last one: after a comment, before its comma, in 12.4
	} {
		if name, ok := RuntimeErrorName(c.code); !ok || name != c.name {
			t.Errorf("RuntimeErrorName(%d) = %q, %v; want %q", c.code, name, ok, c.name)
		}
	}
}

func TestDriverErrorName(t *testing.T) {
	for _, c := range []struct {
		code uint64
		name string
	}{
		{0, "CUDA_SUCCESS"},
		{1, "CUDA_ERROR_INVALID_VALUE"},
		{2, "CUDA_ERROR_OUT_OF_MEMORY"},
		{3, "CUDA_ERROR_NOT_INITIALIZED"},
		{4, "CUDA_ERROR_DEINITIALIZED"},
		{100, "CUDA_ERROR_NO_DEVICE"},
		{201, "CUDA_ERROR_INVALID_CONTEXT"},
		{202, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT"}, // deprecated, still the only name of 202
		{700, "CUDA_ERROR_ILLEGAL_ADDRESS"},
		{801, "CUDA_ERROR_NOT_SUPPORTED"},
		{811, "CUDA_ERROR_CDP_NOT_SUPPORTED"}, // 12.4 only
		{999, "CUDA_ERROR_UNKNOWN"},
	} {
		if name, ok := DriverErrorName(c.code); !ok || name != c.name {
			t.Errorf("DriverErrorName(%d) = %q, %v; want %q", c.code, name, ok, c.name)
		}
	}
}

func TestErrorNameUnknown(t *testing.T) {
	// 35 is a runtime code only, 10000 too; 1000 and 1<<31 are neither.
	for _, code := range []uint64{10, 35, 1000, 10000, 1 << 31, 1<<32 - 1} {
		if name, ok := DriverErrorName(code); ok {
			t.Errorf("DriverErrorName(%d) = %q, want not ok", code, name)
		}
	}
	for _, code := range []uint64{10, 1000, 9999, 10001, 1 << 31, 1<<32 - 1} {
		if name, ok := RuntimeErrorName(code); ok {
			t.Errorf("RuntimeErrorName(%d) = %q, want not ok", code, name)
		}
	}
	if name, ok := RuntimeErrorName(1000); ok || name != "" {
		t.Errorf("RuntimeErrorName(1000) = %q, %v; want \"\", false", name, ok)
	}
}

// The probes hand over all of rax; the enums are 32 bits, so a result
// sign- or garbage-extended into the upper half is still named.
func TestErrorNameHighBitsIgnored(t *testing.T) {
	for _, high := range []uint64{1 << 32, 0xffffffff << 32, 0xdeadbeef << 32} {
		if name, ok := RuntimeErrorName(high | 100); !ok || name != "cudaErrorNoDevice" {
			t.Errorf("RuntimeErrorName(%#x) = %q, %v", high|100, name, ok)
		}
		if name, ok := DriverErrorName(high | 4); !ok || name != "CUDA_ERROR_DEINITIALIZED" {
			t.Errorf("DriverErrorName(%#x) = %q, %v", high|4, name, ok)
		}
		if name, ok := DriverErrorName(high); !ok || name != "CUDA_SUCCESS" {
			t.Errorf("DriverErrorName(%#x) = %q, %v", high, name, ok)
		}
		if _, ok := RuntimeErrorName(high | 1000); ok {
			t.Errorf("RuntimeErrorName(%#x) ok", high|1000)
		}
	}
}

// Every entry of a table is found by its lookup; codes are strictly
// increasing (sorted, one name per code) and names are unique.
func TestErrorTables(t *testing.T) {
	for _, tb := range []struct {
		name   string
		table  []errorName
		lookup func(uint64) (string, bool)
		min    int
	}{
		{"runtimeErrors", runtimeErrors, RuntimeErrorName, 120},
		{"driverErrors", driverErrors, DriverErrorName, 90},
	} {
		if len(tb.table) < tb.min {
			t.Errorf("%s: %d codes, want at least %d", tb.name, len(tb.table), tb.min)
		}
		names := map[string]uint32{}
		for i, e := range tb.table {
			if i > 0 && e.code <= tb.table[i-1].code {
				t.Errorf("%s[%d]: code %d after %d: not sorted or two names for one code", tb.name, i, e.code, tb.table[i-1].code)
			}
			if e.name == "" {
				t.Errorf("%s: code %d has no name", tb.name, e.code)
			}
			if c, dup := names[e.name]; dup {
				t.Errorf("%s: %s names %d and %d", tb.name, e.name, c, e.code)
			}
			names[e.name] = e.code
			if name, ok := tb.lookup(uint64(e.code)); !ok || name != e.name {
				t.Errorf("%s lookup(%d) = %q, %v; want %q", tb.name, e.code, name, ok, e.name)
			}
			// Between two codes nothing is found.
			if i > 0 && e.code-tb.table[i-1].code > 1 {
				if name, ok := tb.lookup(uint64(e.code - 1)); ok {
					t.Errorf("%s lookup(%d) = %q, want not ok", tb.name, e.code-1, name)
				}
			}
		}
	}
}

func TestErrorNameNoAlloc(t *testing.T) {
	codes := []uint64{0, 3, 100, 999, 10000, 1000, 1<<32 | 4}
	var sink string
	allocs := testing.AllocsPerRun(100, func() {
		for _, c := range codes {
			n, _ := RuntimeErrorName(c)
			sink = n
			n, _ = DriverErrorName(c)
			sink = n
		}
	})
	_ = sink
	if allocs != 0 {
		t.Errorf("lookups allocate: %v allocations per run", allocs)
	}
}

func BenchmarkRuntimeErrorName(b *testing.B) {
	for i := 0; b.Loop(); i++ {
		RuntimeErrorName(uint64(i % 1024))
	}
}

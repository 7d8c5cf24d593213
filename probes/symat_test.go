package probes

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/internal/testenv"
)

// The host stub of the reference's sgl-kernel stand-in is a local symbol of
// kvpath under the kernel's mangled name (nvcc's stubs are named so):
// FunctionAt finds it at its start and inside it; the reference driver's
// exported cuLaunchKernel likewise; an offset in no function and a file
// that is no ELF answer nothing.
func TestFunctionAt(t *testing.T) {
	ref := testenv.RefDir(t)
	const stub = "_Z20transfer_kernel_implIXadL_Z20get_global_offset_lfIKcEPT_S3_PKmllllEEXadL_ZS0_IcES3_S3_S5_llllEELb0EEvPKvPvS7_S8_PKlSA_lllllllS5_S5_S5_S5_"
	cases := []struct {
		file, sym string
	}{
		{filepath.Join(ref, "bin", "kvpath"), stub},
		{filepath.Join(ref, "bin", "kvpath"), "sgl_transfer_kv_per_layer"},
		{filepath.Join(ref, "lib", "libcuda.so.1"), "cuLaunchKernel"},
	}
	for _, tc := range cases {
		// LookupSymbols skips local symbols it finds twice; look the
		// symbol up in .symtab through the same reader FunctionAt uses.
		syms, err := LookupSymbols(tc.file, []string{tc.sym})
		if err != nil || len(syms) != 1 {
			t.Fatalf("%s: %s: %v %v", tc.file, tc.sym, syms, err)
		}
		s := syms[tc.sym]
		for _, off := range []uint64{s.Offset, s.Offset + s.Size/2, s.Offset + s.Size - 1} {
			got, err := FunctionAt(tc.file, off)
			if err != nil || got != tc.sym {
				t.Errorf("%s at %#x: %q %v, want %s", filepath.Base(tc.file), off, got, err, tc.sym)
			}
		}
	}
	if got, err := FunctionAt(filepath.Join(ref, "lib", "libcuda.so.1"), 0); got != "" || err != nil {
		t.Errorf("the ELF header is no function: %q %v", got, err)
	}
	notELF := filepath.Join(t.TempDir(), "x")
	os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o644)
	if _, err := FunctionAt(notELF, 0); err == nil || !strings.Contains(err.Error(), notELF) {
		t.Errorf("not an ELF file: %v", err)
	}
	if _, err := FunctionAt(filepath.Join(t.TempDir(), "none"), 0); err == nil {
		t.Error("a missing file")
	}
}

func FuzzFunctionAt(f *testing.F) {
	if ref, err := filepath.Abs(filepath.Join("..", "refpath", "build", "lib", "libcuda.so.1")); err == nil {
		if b, err := os.ReadFile(ref); err == nil {
			f.Add(b[:min(len(b), 8192)], uint64(0x1000))
		}
	}
	f.Add([]byte("\x7fELF\x02\x01\x01"), uint64(0))
	dir := f.TempDir()
	if shm, err := os.MkdirTemp("/dev/shm", "lwfuzz"); err == nil {
		dir = shm
		f.Cleanup(func() { os.RemoveAll(shm) })
	}
	path := filepath.Join(dir, "f.elf")
	f.Fuzz(func(t *testing.T, data []byte, off uint64) {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := FunctionAt(path, off); err != nil && !strings.Contains(err.Error(), path) {
			t.Fatalf("error %q does not name the file", err)
		}
	})
}

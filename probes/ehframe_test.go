package probes

import (
	"os"
	"path/filepath"
	"testing"
)

// Every exported function of libc starts where its unwind table says a
// function starts, and an address inside one does not.
func TestFunctionStartsLibc(t *testing.T) {
	const libc = "/lib/x86_64-linux-gnu/libc.so.6"
	starts, err := FunctionStarts(libc)
	if err != nil {
		t.Fatal(err)
	}
	if len(starts) < 1000 {
		t.Fatalf("%d function starts in libc", len(starts))
	}
	syms, err := LookupSymbols(libc, []string{"malloc", "free", "pthread_create", "fopen", "qsort"})
	if err != nil || len(syms) != 5 {
		t.Fatalf("libc symbols: %v %v", syms, err)
	}
	for name, s := range syms {
		if !IsFunctionStart(starts, s.Value) {
			t.Errorf("%s at %#x is not in the unwind table", name, s.Value)
		}
		if IsFunctionStart(starts, s.Value+1) {
			t.Errorf("%s+1 counted as a function start", name)
		}
	}
}

func TestFunctionStartsErrors(t *testing.T) {
	dir := t.TempDir()
	text := filepath.Join(dir, "text")
	os.WriteFile(text, []byte("not an ELF file at all"), 0o644)
	if _, err := FunctionStarts(text); err == nil {
		t.Error("text file accepted")
	}
	for _, c := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"version 2", []byte{2, 0x1b, 0x03, 0x3b, 0, 0, 0, 0, 0, 0, 0, 0}},
		{"absolute table", []byte{1, 0x1b, 0x03, 0x03, 0, 0, 0, 0, 0, 0, 0, 0}},
		{"count too large", []byte{1, 0x1b, 0x03, 0x3b, 0, 0, 0, 0, 9, 0, 0, 0}},
		{"unsorted", []byte{1, 0x1b, 0x03, 0x3b, 0, 0, 0, 0, 2, 0, 0, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0}},
	} {
		if _, err := parseEhFrameHdr(c.b, 0x1000); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
	got, err := parseEhFrameHdr([]byte{1, 0x1b, 0x03, 0x3b, 0, 0, 0, 0, 2, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0, 0x20, 0, 0, 0, 0, 0, 0, 0}, 0x1000)
	if err != nil || len(got) != 2 || got[0] != 0x1010 || got[1] != 0x1020 {
		t.Errorf("two entries: %#x %v", got, err)
	}
}

func FuzzParseEhFrameHdr(f *testing.F) {
	f.Add([]byte{1, 0x1b, 0x03, 0x3b, 0, 0, 0, 0, 1, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		starts, err := parseEhFrameHdr(b, 0x400000)
		if err == nil {
			for i := 1; i < len(starts); i++ {
				if starts[i] < starts[i-1] {
					t.Fatal("accepted an unsorted table")
				}
			}
		}
	})
}

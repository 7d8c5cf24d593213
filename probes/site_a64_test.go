package probes

import (
	"encoding/binary"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// le is an instruction word as it lies in memory.
func le(words ...uint32) []byte {
	b := make([]byte, 4*len(words))
	for i, w := range words {
		binary.LittleEndian.PutUint32(b[4*i:], w)
	}
	return b
}

// Words from `clang --target=aarch64-linux-gnu` (llvm-objdump -d): function
// starts of a -O2 -mbranch-protection=standard build of a small C file and
// single instructions assembled one by one.
func TestChooseSiteARM64(t *testing.T) {
	for _, tc := range []struct {
		name   string
		code   []byte
		nopSim bool
		off    uint64
		cost   SiteCost
		insn   string // a prefix of the decoded instruction
		err    string // a substring of the error; "" when a site is chosen
	}{
		// C function starts.
		{"tail call after BTI c", le(0xd503245f, 0x14000000), false, 4, CostSimulated, "B ", ""},
		{"ADRP after BTI c", le(0xd503245f, 0x90000008, 0xf9400108), false, 4, CostSimulated, "ADRP ", ""},
		{"PACIASP", le(0xd503233f, 0xa9be7bfd), false, 0, CostSingleStep, "", ""},
		{"STP x29, x30 pre-index", le(0xa9bf7bfd), false, 0, CostSingleStep, "STP ", ""},
		{"SUB sp", le(0xd10083ff), false, 0, CostSingleStep, "SUB ", ""},
		{"MOV x29, sp", le(0x910003fd), false, 0, CostSingleStep, "MOV ", ""},
		{"LDR register offset", le(0xf9400420), false, 0, CostSingleStep, "LDR ", ""},
		// What the kernel simulates.
		{"ADR", le(0x10ffff49), false, 0, CostSimulated, "ADR ", ""},
		{"BL", le(0x97fffff8), false, 0, CostSimulated, "BL ", ""},
		{"B.NE", le(0x54fffee1), false, 0, CostSimulated, "B NE, ", ""},
		{"CBZ", le(0xb4fffec0), false, 0, CostSimulated, "CBZ ", ""},
		{"CBNZ", le(0x35fffea1), false, 0, CostSimulated, "CBNZ ", ""},
		{"TBZ", le(0x361ffe82), false, 0, CostSimulated, "TBZ ", ""},
		{"TBNZ", le(0x370ffe63), false, 0, CostSimulated, "TBNZ ", ""},
		{"BR", le(0xd61f0200), false, 0, CostSimulated, "BR ", ""},
		{"BLR", le(0xd63f0100), false, 0, CostSimulated, "BLR ", ""},
		{"RET", le(0xd65f03c0), false, 0, CostSimulated, "RET", ""},
		{"NOP since 6.13", le(0xd503201f), true, 0, CostSimulated, "NOP", ""},
		{"NOP before 6.13", le(0xd503201f), false, 0, CostSingleStep, "NOP", ""},
		// Hints: on the kernel's single-step list, or refused.
		{"BTI j then NOP", le(0xd503249f, 0xd503201f), true, 4, CostSimulated, "NOP", ""},
		{"AUTIASP", le(0xd50323bf), false, 0, 0, "", "the kernel refuses to probe it (a hint it does not single-step)"},
		{"YIELD", le(0xd503203f), false, 0, 0, "", "a hint it does not single-step"},
		// What the kernel refuses.
		{"RETAA", le(0xd65f0bff), false, 0, 0, "", "a branch it does not simulate"},
		{"LDR literal", le(0x58fffda0), false, 0, 0, "", "a literal load"},
		{"LDRSW literal", le(0x98fffd81), false, 0, 0, "", "a literal load"},
		{"LDXR", le(0xc85f7c20), false, 0, 0, "", "an exclusive load or store"},
		{"STXR", le(0xc8027c20), false, 0, 0, "", "an exclusive load or store"},
		{"SVC", le(0xd4000001), false, 0, 0, "", "an exception-generating instruction"},
		{"BRK", le(0xd4200000), false, 0, 0, "", "an exception-generating instruction"},
		{"MSR TPIDR_EL0", le(0xd51bd040), false, 0, 0, "", "a system register write"},
		{"MRS DAIF", le(0xd53b4220), false, 0, 0, "", "a read of DAIF"},
		{"MRS TPIDR_EL0", le(0xd53bd040), false, 0, CostSingleStep, "MRS ", ""},
		// Not a function start.
		{"short", []byte{0x1f, 0x20, 0x03}, false, 0, 0, "", "want a 4-byte instruction"},
		{"BTI alone", le(0xd503245f), false, 0, 0, "", "code ends after BTI"},
		{"undefined", le(0x00000000), false, 0, 0, "", "decode 00000000 at +0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ChooseSiteARM64(tc.code, tc.nopSim)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, %v; want an error holding %q", s, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Offset != tc.off || s.Cost != tc.cost || !strings.HasPrefix(s.Insn, tc.insn) || s.SPDelta != 0 {
				t.Errorf("got %+v, want +%d %q… %v", s, tc.off, tc.insn, tc.cost)
			}
			if (s.Offset == 4) != (s.Skipped == "BTI") {
				t.Errorf("skipped %q at +%d", s.Skipped, s.Offset)
			}
		})
	}
}

// Any bytes: an error or a site within them, never a panic.
func FuzzChooseSiteARM64(f *testing.F) {
	f.Add(le(0xd503245f, 0x14000000), true)
	f.Add(le(0xd503233f), false)
	f.Add([]byte{0xff}, false)
	f.Fuzz(func(t *testing.T, code []byte, nop bool) {
		s, err := ChooseSiteARM64(code, nop)
		if err != nil {
			return
		}
		if s.Offset+4 > uint64(len(code)) || s.Insn == "" || s.Cost != CostSimulated && s.Cost != CostSingleStep {
			t.Fatalf("% x: %+v", code, s)
		}
	})
}

// On arm64 a single-stepped site is refused unless --allow-single-step; a
// simulated one always passes, and so does an error.
func TestARMSitePolicy(t *testing.T) {
	step := Site{Insn: "PACIASP", Cost: CostSingleStep}
	sim := Site{Offset: 4, Insn: "B .+0x0", Cost: CostSimulated, Skipped: "BTI"}
	refuse, allow := sitePolicy{}, sitePolicy{allowSingleStep: true}
	if _, err := refuse.arm(step, nil); err == nil || !strings.Contains(err.Error(), "PACIASP at +0 is single-stepped, refused on arm64") {
		t.Errorf("single-step not refused: %v", err)
	}
	if s, err := refuse.arm(sim, nil); err != nil || s != sim {
		t.Errorf("simulated: %v %v", s, err)
	}
	if s, err := allow.arm(step, nil); err != nil || s != step {
		t.Errorf("single-step allowed: %v %v", s, err)
	}
}

// The arm64 objects hold the same programs, maps and load-time variables
// as the x86-64 ones (they are built from the same source for another
// register layout: bpf/arm64_types.h).
func TestARM64Objects(t *testing.T) {
	for _, name := range []string{"lanewatch", "empty"} {
		x86, err := ebpf.LoadCollectionSpec(name + "_x86_bpfel.o")
		if err != nil {
			t.Fatal(err)
		}
		arm, err := ebpf.LoadCollectionSpec(name + "_arm64_bpfel.o")
		if err != nil {
			t.Fatal(err)
		}
		if got, want := slices.Sorted(maps.Keys(arm.Programs)), slices.Sorted(maps.Keys(x86.Programs)); !slices.Equal(got, want) {
			t.Errorf("%s: arm64 programs %v, x86-64 %v", name, got, want)
		}
		if got, want := slices.Sorted(maps.Keys(arm.Maps)), slices.Sorted(maps.Keys(x86.Maps)); !slices.Equal(got, want) {
			t.Errorf("%s: arm64 maps %v, x86-64 %v", name, got, want)
		}
		if got, want := slices.Sorted(maps.Keys(arm.Variables)), slices.Sorted(maps.Keys(x86.Variables)); !slices.Equal(got, want) {
			t.Errorf("%s: arm64 variables %v, x86-64 %v", name, got, want)
		}
		if name == "lanewatch" && arm.Programs["lw_call"] == nil {
			t.Errorf("no lw_call program in the arm64 object")
		}
	}
}

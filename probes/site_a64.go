// The arm64 classifier builds on every GOARCH (so its tests run on x86-64): hence not *_arm64.go.
package probes

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/arch/arm64/arm64asm"
)

// CostSimulated: the kernel does what the instruction does in its
// breakpoint handler, without copying it out and single-stepping it (arm64).
const CostSimulated SiteCost = CostTrampoline + 1

// ChooseSiteARM64 classifies the first instruction of an arm64 function
// as the kernel's uprobe code does (arch/arm64/kernel/probes/decode-insn.c,
// arm_probe_decode_insn): it simulates branches (B, BL, B.cond, CBZ/CBNZ,
// TBZ/TBNZ, BR, BLR, RET), ADR and ADRP, and, since Linux 6.13, NOP
// (nopSimulated); it refuses what cannot run out of line (literal loads,
// exclusives, exception and system-register instructions, other branches,
// hints off its list); it single-steps the rest. Only a BTI landing pad
// is skipped: it changes no register, like ENDBR64 on x86-64.
func ChooseSiteARM64(code []byte, nopSimulated bool) (s Site, err error) {
	defer func() {
		if r := recover(); r != nil {
			s, err = Site{}, fmt.Errorf("decode % x: %v", head(code), r)
		}
	}()
	if len(code) < 4 {
		return Site{}, fmt.Errorf("decode % x: want a 4-byte instruction", code)
	}
	if isBTI(binary.LittleEndian.Uint32(code)) {
		s.Offset, s.Skipped = 4, "BTI"
		code = code[4:]
		if len(code) < 4 {
			return Site{}, errors.New("code ends after BTI")
		}
	}
	w := binary.LittleEndian.Uint32(code)
	cost, refused := classifyARM64(w, nopSimulated)
	inst, decodeErr := arm64asm.Decode(code[:4])
	if refused != "" {
		name := fmt.Sprintf("%08x", w) // arm64asm does not know every one (RETAA)
		if decodeErr == nil {
			name = inst.String()
		}
		return Site{}, fmt.Errorf("%s at +%d: the kernel refuses to probe it (%s)", name, s.Offset, refused)
	}
	if decodeErr != nil {
		return Site{}, fmt.Errorf("decode %08x at +%d: %w", w, s.Offset, decodeErr)
	}
	s.Insn, s.Cost = inst.String(), cost
	return s, nil
}

// isBTI: HINT #32, #34, #36 or #38 (BTI, BTI c, BTI j, BTI jc).
func isBTI(w uint32) bool { return w&0xFFFFFF3F == 0xD503241F }

// classifyARM64 is a site's cost, or why the kernel refuses it.
func classifyARM64(w uint32, nopSimulated bool) (SiteCost, string) {
	switch {
	case w == 0xD503201F: // NOP
		if nopSimulated {
			return CostSimulated, ""
		}
		return CostSingleStep, ""
	case w&0xFFFFF01F == 0xD503201F: // HINT #imm
		if steppableHint((w >> 5) & 0x7F) {
			return CostSingleStep, ""
		}
		return 0, "a hint it does not single-step"
	case w&0xFC000000 == 0x14000000, w&0xFC000000 == 0x94000000, // B, BL
		w&0xFF000010 == 0x54000000,                             // B.cond
		w&0x7E000000 == 0x34000000, w&0x7E000000 == 0x36000000, // CBZ/CBNZ, TBZ/TBNZ
		w&0x1F000000 == 0x10000000,                                                         // ADR, ADRP
		w&0xFFFFFC1F == 0xD61F0000, w&0xFFFFFC1F == 0xD63F0000, w&0xFFFFFC1F == 0xD65F0000: // BR, BLR, RET
		return CostSimulated, ""
	case w&0x3B000000 == 0x18000000:
		return 0, "a literal load: PC-relative, wrong out of line"
	case w&0x3F000000 == 0x08000000:
		return 0, "an exclusive load or store: single-stepping breaks its monitor"
	case w&0x1C000000 == 0x14000000: // the rest of branches, exceptions and system instructions
		switch {
		case w&0xFE000000 == 0xD6000000:
			return 0, "a branch it does not simulate (pointer-authenticated, ERET)"
		case w&0xFF000000 == 0xD4000000:
			return 0, "an exception-generating instruction"
		case w&0xFFF8F01F == 0xD500401F, w&0xFFF00000 == 0xD5100000:
			return 0, "a system register write"
		case w&0xFFFFFFE0 == 0xD53B4220:
			return 0, "a read of DAIF"
		}
	}
	return CostSingleStep, ""
}

// steppableHint: the hints the kernel single-steps
// (aarch64_insn_is_steppable_hint): NOP, the PAC signing hints and BTI.
func steppableHint(imm uint32) bool {
	switch imm {
	case 0, 7, 8, 10, 24, 25, 26, 27, 32, 34, 36, 38:
		return true
	}
	return false
}

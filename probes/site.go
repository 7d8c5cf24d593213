package probes

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/arch/x86/x86asm"
)

// SiteCost is what one hit of a uprobe costs, decided by the instruction the
// kernel finds at the probe site (measured on Linux 6.18: see docs/design.md, "Probe sites").
type SiteCost uint8

const (
	CostSingleStep SiteCost = iota + 1 // copied out and single-stepped: ≈6.4 µs
	CostEmulated                       // emulated in the kernel (push reg, nop, relative jumps and calls): ≈0.75 µs
	CostTrampoline                     // 5-byte nop rewritten into a call: ≈0.34 µs
)

func (c SiteCost) String() string {
	switch c {
	case CostSingleStep:
		return "single-step"
	case CostEmulated:
		return "emulated"
	case CostTrampoline:
		return "trampoline"
	case CostSimulated:
		return "simulated"
	}
	return fmt.Sprintf("SiteCost(%d)", uint8(c))
}

// Site is where to attach a uprobe within a function.
type Site struct {
	Offset  uint64 // bytes past the symbol (or past Thunk.Impl when Thunk is set)
	SPDelta int    // bytes pushed between the symbol and the site; 0 while only ENDBR64 is skipped
	Insn    string // the instruction at the site, e.g. "PUSH RBP"
	Cost    SiteCost
	Skipped string // what was skipped to get there ("ENDBR64"), or ""
	// Thunk is set when the symbol is a dispatch thunk probed at its
	// implementation instead (NVIDIA's driver entry points).
	Thunk *Thunk
	// NotResolved says why a symbol that looks like a dispatch thunk is
	// probed at the thunk itself ("" when it is not one, or was resolved).
	NotResolved string
}

func (s Site) String() string {
	str := fmt.Sprintf("+%d %s (%s", s.Offset, s.Insn, s.Cost)
	if s.Thunk != nil {
		str = fmt.Sprintf("implementation %#x +%d %s (%s, through the thunk's slot %#x", s.Thunk.Impl, s.Offset, s.Insn, s.Cost, s.Thunk.Slot)
	}
	if s.Skipped != "" {
		str += ", after " + s.Skipped
	}
	if s.SPDelta != 0 {
		str += fmt.Sprintf(", sp%+d", -s.SPDelta)
	}
	return str + ")"
}

// endbr64 opens every function of a CET-built library. It only marks a valid
// indirect-branch target, so a probe after it sees the same registers and
// stack pointer as one at the symbol, but the kernel cannot emulate it.
const endbr64 = "\xf3\x0f\x1e\xfa"

// nop5 is the 5-byte NOP the kernel rewrites into a call to its trampoline.
const nop5 = "\x0f\x1f\x44\x00\x00"

// ChooseSite picks the cheapest safe uprobe site in a function whose first
// bytes are code. It skips ENDBR64, and a compare of registers (TEST or
// CMP, which write only the flags) when the instruction after it is a
// conditional jump the kernel emulates: the probe there sees the symbol's
// registers and stack, and every call passes it (a leaf such as UCX's
// uct_sm_ep_put_short opens with `test edx, edx; je`). Nothing else is
// skipped: a push would move the stack pointer, a mov could overwrite an
// argument register. Any decodable instruction is a valid site; Cost says
// what a hit costs.
func ChooseSite(code []byte) (s Site, err error) {
	// x86asm is table driven and well fuzzed, but a panic here would take
	// the agent down over one odd function; turn it into an error.
	defer func() {
		if r := recover(); r != nil {
			s, err = Site{}, fmt.Errorf("decode % x: %v", head(code), r)
		}
	}()
	if len(code) == 0 {
		return Site{}, errors.New("no code to decode")
	}
	at := code
	if len(code) >= len(endbr64) && string(code[:len(endbr64)]) == endbr64 {
		s.Offset, s.Skipped = uint64(len(endbr64)), "ENDBR64"
		at = code[len(endbr64):]
		if len(at) == 0 {
			return Site{}, errors.New("code ends after ENDBR64")
		}
	}
	if len(at) >= len(endbr64) && string(at[:len(endbr64)]) == endbr64 {
		// x86asm does not know ENDBR64; a second one is single-stepped.
		s.Insn, s.Cost = "ENDBR64", CostSingleStep
		return s, nil
	}
	inst, err := x86asm.Decode(at, 64)
	if err != nil {
		return Site{}, fmt.Errorf("decode % x at +%d: %w", head(at), s.Offset, err)
	}
	// x86asm returns a lone prefix as an instruction with no opcode when the
	// bytes that follow are cut off or unknown to it; UD0-UD2 decode but only
	// trap. Neither is a function start to probe.
	switch inst.Op {
	case 0:
		return Site{}, fmt.Errorf("decode % x at +%d: incomplete instruction", head(at), s.Offset)
	case x86asm.UD0, x86asm.UD1, x86asm.UD2:
		return Site{}, fmt.Errorf("decode % x at +%d: %v is not code", head(at), s.Offset, inst.Op)
	}
	s.Insn = inst.String()
	s.Cost = classify(at[:inst.Len])
	if s.Cost == CostSingleStep && flagsOnly(inst) && len(at) > inst.Len {
		if next, err := x86asm.Decode(at[inst.Len:], 64); err == nil && isJcc(next.Op) &&
			classify(at[inst.Len:inst.Len+next.Len]) == CostEmulated {
			s.Skipped = strings.TrimPrefix(s.Skipped+", "+s.Insn, ", ")
			s.Offset += uint64(inst.Len)
			s.Insn, s.Cost = next.String(), CostEmulated
		}
	}
	return s, nil
}

// flagsOnly says whether an instruction writes nothing but the flags: a
// TEST or CMP of registers, or of a register and a constant.
func flagsOnly(inst x86asm.Inst) bool {
	if inst.Op != x86asm.TEST && inst.Op != x86asm.CMP {
		return false
	}
	for _, a := range inst.Args {
		switch a.(type) {
		case nil, x86asm.Reg, x86asm.Imm:
		default:
			return false // a memory operand: keep it at the site
		}
	}
	return true
}

// isJcc says whether op is a conditional jump.
func isJcc(op x86asm.Op) bool {
	switch op {
	case x86asm.JA, x86asm.JAE, x86asm.JB, x86asm.JBE, x86asm.JE, x86asm.JG, x86asm.JGE, x86asm.JL, x86asm.JLE,
		x86asm.JNE, x86asm.JNO, x86asm.JNP, x86asm.JNS, x86asm.JO, x86asm.JP, x86asm.JS:
		return true
	}
	return false
}

// classify follows the kernel's x86 uprobe code: it emulates push of a
// general register (with REX 0x41 only, for r8-r15), the 1-byte nop and
// relative jumps, conditional jumps and calls without an operand-size
// prefix (branch_setup_xol_ops), optimizes the 5-byte nop, and
// single-steps everything else.
func classify(insn []byte) SiteCost {
	switch {
	case len(insn) == 2 && (insn[0] >= 0x70 && insn[0] <= 0x7f || insn[0] == 0xeb): // jcc rel8, jmp rel8
		return CostEmulated
	case len(insn) == 5 && (insn[0] == 0xe9 || insn[0] == 0xe8): // jmp rel32, call rel32
		return CostEmulated
	case len(insn) == 6 && insn[0] == 0x0f && insn[1] >= 0x80 && insn[1] <= 0x8f: // jcc rel32
		return CostEmulated
	case len(insn) == 1 && insn[0] >= 0x50 && insn[0] <= 0x57:
		return CostEmulated
	case len(insn) == 2 && insn[0] == 0x41 && insn[1] >= 0x50 && insn[1] <= 0x57:
		return CostEmulated
	case len(insn) == 1 && insn[0] == 0x90:
		return CostEmulated
	case string(insn) == nop5:
		return CostTrampoline
	}
	return CostSingleStep
}

// head is the start of code, short enough for an error message.
func head(code []byte) []byte {
	if len(code) > 16 {
		return code[:16]
	}
	return code
}

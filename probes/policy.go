package probes

import (
	"debug/elf"
	"fmt"
	"runtime"
)

// sitePolicy says which sites may be probed. allowSingleStep: on arm64,
// sites the kernel single-steps too (Options.AllowSingleStep,
// --allow-single-step); the zero value refuses them.
type sitePolicy struct{ allowSingleStep bool }

// HostMachine is the ELF machine of the processes the probes are built for.
func HostMachine() elf.Machine {
	if runtime.GOARCH == "arm64" {
		return elf.EM_AARCH64
	}
	return elf.EM_X86_64
}

// choose picks a site by this host's architecture and applies the
// site policy: on arm64, single-stepped uprobes have corrupted probed
// processes (Grace hosts), so a site the kernel does not simulate is
// refused unless --allow-single-step. Linux simulates NOP from 6.13 on.
func (pol sitePolicy) choose(code []byte) (Site, error) {
	if runtime.GOARCH != "arm64" {
		return ChooseSite(code)
	}
	return pol.arm(ChooseSiteARM64(code, !kernelBefore(6, 13)))
}

// arm refuses a single-stepped arm64 site unless allowed.
func (pol sitePolicy) arm(s Site, err error) (Site, error) {
	if err == nil && s.Cost == CostSingleStep && !pol.allowSingleStep {
		return Site{}, fmt.Errorf("%s at +%d is single-stepped, refused on arm64 where single-stepped uprobes have corrupted probed processes (--allow-single-step to probe it anyway)", s.Insn, s.Offset)
	}
	return s, err
}

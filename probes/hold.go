package probes

import (
	"errors"
	"fmt"
	"time"

	"github.com/lanewatch/lanewatch/event"

	"github.com/cilium/ebpf"
)

// The hold at the dynamic linker's notification (bpf/hold.bpf.c;
// docs/design.md, "Attach and discovery"): a thread whose process newly
// maps a CUDA file the agent has not inspected waits there, a bounded
// time, until the agent says the file is known (MarkKnown) — so the
// process's first call into it is traced.

// HoldBound is the longest a thread is held; BeatStale, how long after the
// agent's last beat a hold ends (an agent that died or hangs). A hold
// took 32–640 ms here under load (docs/design.md, "Attach and
// discovery").
const (
	HoldBound = 5 * time.Second
	BeatStale = 2 * time.Second
)

// loadHold loads the hold program beside the others, sharing their event
// ring. A kernel that refuses it (no sleepable uprobes, no task VMA
// iterator) keeps lw_call at the notification, without the hold: said
// once, and HoldAvailable says so.
func (p *Probes) loadHold() {
	spec, err := loadHold()
	if err == nil {
		spec.Maps["events"].MaxEntries = p.objs.Events.MaxEntries() // replaced by the shared ring
		err = errors.Join(setPIDNamespace(spec, p.log), spec.Variables["hold_max_ns"].Set(uint64(HoldBound)),
			spec.Variables["beat_stale_ns"].Set(uint64(BeatStale)))
	}
	if err == nil {
		var objs holdObjects
		err = spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{"events": p.objs.Events}})
		if err == nil {
			p.hold = &objs
			return
		}
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			err = fmt.Errorf("%w (verifier: %v)", err, verr.Log[max(0, len(verr.Log)-3):])
		}
	}
	p.log.Warn("this kernel cannot hold a process at its loader notification: a CUDA library first seen in a process is probed after its first calls there (late attach)",
		"err", err)
}

// HoldAvailable says whether the hold program is loaded.
func (p *Probes) HoldAvailable() bool { return p.hold != nil }

// Beat says the agent is alive now: holds begin only while it beats
// (within beat_stale_ns), and end when it stops, so an agent that died
// keeps no process waiting.
func (p *Probes) Beat() error {
	if p.hold == nil {
		return nil
	}
	return p.hold.AgentBeatNs.Set(event.Now())
}

// EndBeat says the agent is stopping: holds end at once, and none begins.
func (p *Probes) EndBeat() error {
	if p.hold == nil {
		return nil
	}
	return p.hold.AgentBeatNs.Set(uint64(0))
}

// MarkKnown says the agent has inspected a file: probed it or found
// nothing to probe in it (probed), or failed to (a blind spot: a process
// going on with it mapped is not proven traced). A process waiting for it
// goes on.
func (p *Probes) MarkKnown(id FileID, probed bool) error {
	if p.hold == nil {
		return nil
	}
	v := uint8(holdLwKnownUnprobed)
	if probed {
		v = holdLwKnownProbed
	}
	return p.hold.Known.Update(holdLwFile{Dev: id.Dev, Ino: id.Inode}, v, ebpf.UpdateAny)
}

// Values of the known map (bpf/lanewatch.h LW_KNOWN_*).
const (
	holdLwKnownProbed   = 1
	holdLwKnownUnprobed = 2
)

// ForgetKnown undoes MarkKnown for a file whose probes were detached: the
// next process that maps it waits again.
func (p *Probes) ForgetKnown(id FileID) error {
	if p.hold == nil {
		return nil
	}
	err := p.hold.Known.Delete(holdLwFile{Dev: id.Dev, Ino: id.Inode})
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil
	}
	return err
}

// Verified is what a process's linker notifications proved
// (struct lw_verified): OK, the latest time (CLOCK_MONOTONIC ns) it went
// on with every CUDA file it maps known to the agent; Broken, the latest
// time it went on without that proven (a hold that gave up, mappings that
// could not be walked, a notification the agent could not be told of).
type Verified struct {
	OK, Broken uint64
	Found      bool // the process has an entry
}

// BrokenSince says the process went on unproven (a hold that gave up) at
// or after t.
func (v Verified) BrokenSince(t uint64) bool { return v.Found && v.Broken != 0 && v.Broken >= t }

// VerifiedOf reads pid's entry.
func (p *Probes) VerifiedOf(pid uint32) (Verified, error) {
	if p.hold == nil {
		return Verified{}, nil
	}
	var v holdLwVerified
	err := p.hold.Verified.Lookup(pid, &v)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return Verified{}, nil
	}
	if err != nil {
		return Verified{}, err
	}
	return Verified{OK: v.Ok, Broken: v.Broken, Found: true}, nil
}

// HoldStats are the hold program's counters.
type HoldStats struct {
	Available bool
	Holds     uint64 // holds begun
	Bound     uint64 // ended by the time bound (the file not probed in time)
	AgentGone uint64 // ended because the agent stopped beating
	Unwalked  uint64 // notifications whose mappings could not be walked (not held)
	RingFull  uint64 // notifications the agent could not be told of (not held)
	HeldNS    uint64 // total time held
	MaxNS     uint64 // the longest hold
}

// HoldStats reads the counters.
func (p *Probes) HoldStats() (HoldStats, error) {
	if p.hold == nil {
		return HoldStats{}, nil
	}
	s := HoldStats{Available: true}
	h := p.hold
	for _, v := range []struct {
		v   *ebpf.Variable
		dst *uint64
	}{{h.Holds, &s.Holds}, {h.HoldBound, &s.Bound}, {h.HoldAgentGone, &s.AgentGone}, {h.HoldUnwalked, &s.Unwalked},
		{h.RingFull, &s.RingFull}, {h.HoldNs, &s.HeldNS}, {h.HoldNsMax, &s.MaxNS}} {
		if err := v.v.Get(v.dst); err != nil {
			return s, fmt.Errorf("read %s: %w", v.v, err)
		}
	}
	return s, nil
}

// ByEnd counts the holds by how they ended (lanewatch_loader_holds_total);
// nil without the hold.
func (s HoldStats) ByEnd() map[string]uint64 {
	if !s.Available {
		return nil
	}
	released := s.Holds - min(s.Holds, s.Bound+s.AgentGone) // holds in progress count as released
	return map[string]uint64{"released": released, "bound": s.Bound, "agent_gone": s.AgentGone}
}

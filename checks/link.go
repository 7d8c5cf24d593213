package checks

import (
	"fmt"
	"maps"
	"slices"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/topology"
)

// LinkLoad is a link's state read while it carried traffic (the link
// judgement of docs/design.md 1.2, "degraded link"): GPUs train their link
// down when idle, so only a state read under load says whether the link is
// degraded.
type LinkLoad struct {
	GTs    float64 // current speed as read
	Width  int     // current width as read
	Bps    float64 // bytes/s the link carried (both directions) around the read
	Source string  // where the state was read: "nvml", "dcgm", "sysfs"
	// MaxGTs and MaxWidth are the source's own maximum (NVML's and DCGM's
	// max generation and width: what the device and system support), 0
	// unknown. They bound a GPU sysfs does not show; for one it shows, the
	// device's and its slot's max_link_* do.
	MaxGTs   float64
	MaxWidth int
}

// GBs is the per-direction rate at the state read.
func (l LinkLoad) GBs() float64 { return topology.LinkGBs(l.GTs, l.Width) }

// LaneCapacity is the per-direction capacity of a GPU link's lanes for the
// lane judgements (same-direction overlap, lane metrics, link-underused):
// the link's trained maximum, the lower of the GPU's and its slot's max
// speed and width (topology.LinkCapacity), never its current training — an
// idle GPU reads Gen1, and two 10 GB/s flows would "saturate" its 4 GB/s
// (docs/design.md "Placement"). gbs is 0 when unknown; why says where the
// number comes from, or why there is none.
func (h *Host) LaneCapacity(gpu string) (gbs float64, why string) {
	c, ok := h.Topo.LinkCapacity(gpu)
	if !ok {
		return 0, fmt.Sprintf("lane capacity unknown: no PCI function %s in %s", gpu, h.SysRoot)
	}
	if !c.Known() {
		return 0, "lane capacity unknown: " + c.String()
	}
	why = "lane capacity: trained max " + c.String()
	if l := h.Topo.Functions[gpu].Link; l.Known {
		why += fmt.Sprintf("; reads %s %.2f GB/s now", genWidth(l.CurSpeedGTs, l.CurWidth), l.CurGBs())
	}
	return c.GBs(), why
}

// linkCheck judges the PCIe links of the GPUs, NICs and NVMe drives against
// what each can train to (link-degraded). A GPU is judged by the state read
// under load (h.Loads) and not at all without one; a GPU that only the GPU
// counters show (not in sysfs) is judged by their maximum.
func (h *Host) linkCheck() Check {
	const name = "PCIe links"
	var lines []string
	c := Check{Scope: HostScope, Name: name, Status: Pass}
	unjudged := 0
	for _, kind := range []string{topology.KindGPU, topology.KindNIC, topology.KindNVMe} {
		for _, bdf := range h.Topo.BDFs(kind) {
			l := h.Topo.Functions[bdf].Link
			capy, _ := h.Topo.LinkCapacity(bdf)
			if !capy.Known() {
				continue // virtual device: no link state
			}
			facts := correlate.LinkFacts{Device: kind + " " + bdf, DeviceGTs: capy.DeviceGTs, DeviceWidth: capy.DeviceWidth,
				SlotGTs: capy.SlotGTs, SlotWidth: capy.SlotWidth, CurGTs: l.CurSpeedGTs, CurWidth: l.CurWidth, Source: "sysfs",
				IdleTrainsDown: kind == topology.KindGPU}
			line := fmt.Sprintf("%s %s trains to %s, reads %s", kind, bdf, capy, genWidth(l.CurSpeedGTs, l.CurWidth))
			if ld, ok := h.Loads[bdf]; ok {
				facts.CurGTs, facts.CurWidth, facts.BusyBytesPerSec, facts.Source = ld.GTs, ld.Width, ld.Bps, ld.Source
				line += fmt.Sprintf(", %s under load (%.2f GB/s, %s)", genWidth(ld.GTs, ld.Width), ld.Bps/1e9, ld.Source)
			} else if kind == topology.KindGPU {
				line += " (idle or load unknown: not judged)"
				unjudged++
			}
			lines = append(lines, line)
			if f := correlate.LinkDegraded(facts); f != nil {
				c.Findings = append(c.Findings, *f)
			}
		}
	}
	for _, bus := range slices.Sorted(maps.Keys(h.Loads)) {
		if h.Topo.Functions[bus] != nil {
			continue
		}
		ld := h.Loads[bus]
		lines = append(lines, fmt.Sprintf("gpu %s (%s only) trains to %s, %s under load (%.2f GB/s)", bus, ld.Source,
			genWidth(ld.MaxGTs, ld.MaxWidth), genWidth(ld.GTs, ld.Width), ld.Bps/1e9))
		f := correlate.LinkDegraded(correlate.LinkFacts{Device: topology.KindGPU + " " + bus, DeviceGTs: ld.MaxGTs, DeviceWidth: ld.MaxWidth,
			CurGTs: ld.GTs, CurWidth: ld.Width, Source: ld.Source, BusyBytesPerSec: ld.Bps, IdleTrainsDown: true})
		if f != nil {
			c.Findings = append(c.Findings, *f)
		}
	}
	if len(lines) == 0 {
		return Skipped(HostScope, name, "no GPU, NIC or NVMe reports a PCIe link state (virtual devices)")
	}
	c.Detail = JoinLimited(lines, 6)
	if unjudged > 0 {
		c.Detail += fmt.Sprintf("; %d GPU link(s) not judged: a GPU trains down when idle, so its speed and width are judged only as read under load (GPU counters showing traffic around the read: agent run, or diagnose --sample, with DCGM or NVML)", unjudged)
	}
	return c
}

// genWidth prints "Gen4 x16" ("Gen? x16" for an unknown rate).
func genWidth(gts float64, width int) string {
	g, w := "Gen?", "x?"
	if n := topology.Generation(gts); n > 0 {
		g = fmt.Sprintf("Gen%d", n)
	}
	if width > 0 {
		w = fmt.Sprintf("x%d", width)
	}
	return g + " " + w
}

// LinkCheck is the host check of the PCIe links (HostChecks runs it in
// order), for callers that judge the links alone, with h.Loads as read.
func (h *Host) LinkCheck() Check { return h.linkCheck() }

package topology

import "fmt"

// encodingEfficiency is the fraction of raw line bits that carry payload
// at a given signalling rate (GT/s); 0 for a rate PCIe does not define.
//
//   - Gen1 2.5 and Gen2 5 GT/s: 8b/10b line code, 8/10.
//   - Gen3 8, Gen4 16 and Gen5 32 GT/s: 128b/130b, 128/130.
//   - Gen6 64 GT/s (and Gen7 128 GT/s): PAM4 signalling in FLIT mode, no
//     block code. A 256-byte FLIT carries 236 bytes of TLP and 6 of DLLP
//     (242 together); the other 14 are 8 bytes CRC and 6 bytes FEC, so
//     242/256. Reusing 128/130 here would overstate Gen6 by about 4%.
//
// Like the seeds' 63 GB/s, these rates do not subtract TLP headers or flow
// control; measured H2D lands at 80-90% of them.
func encodingEfficiency(gts float64) float64 {
	switch gts {
	case 2.5, 5:
		return 8.0 / 10
	case 8, 16, 32:
		return 128.0 / 130
	case 64, 128:
		return 242.0 / 256
	}
	return 0
}

// LinkGBs is the payload rate of one direction of a PCIe link in GB/s
// (1e9 bytes/s): rate × efficiency × lanes / 8 bits. 0 when either input is
// unknown. Gen5 ×16: 32 × 128/130 × 16 / 8 = 63.015… GB/s.
func LinkGBs(gts float64, width int) float64 {
	if width <= 0 {
		return 0
	}
	return gts * encodingEfficiency(gts) * float64(width) / 8
}

// CurGBs is the per-direction rate at the link's current training, as read:
// not a capacity (idle GPUs train down to Gen1, and narrower, to save power;
// docs/design.md "Placement"). Capacities come from LinkCapacity.
func (l Link) CurGBs() float64 { return LinkGBs(l.CurSpeedGTs, l.CurWidth) }

// MaxGBs is the per-direction rate at the function's own maximum state,
// whatever its slot allows; LinkCapacity also takes the slot into account.
func (l Link) MaxGBs() float64 { return LinkGBs(l.MaxSpeedGTs, l.MaxWidth) }

// LinkCapacity is what the PCIe link above a device can train to: the lower
// of the device's own maximum and its slot's — the upstream port the link
// ends at (root port or switch downstream port), whose max_link_speed and
// max_link_width say what the slot supports — since a link trains to what
// both ends support. It is the capacity every lane judgement uses, never
// current_link_*: the current training at an idle moment is power saving,
// not what the link carries under load (docs/design.md "Placement").
type LinkCapacity struct {
	Device string `json:"device"` // BDF
	// DeviceGTs and DeviceWidth are the device's max_link_*; 0 unknown.
	DeviceGTs   float64 `json:"device_gts"`
	DeviceWidth int     `json:"device_width"`
	// Slot is the upstream port's BDF, "" when the device hangs directly off
	// the host bridge; SlotGTs and SlotWidth are its max_link_*, 0 unknown.
	Slot      string  `json:"slot,omitempty"`
	SlotGTs   float64 `json:"slot_gts"`
	SlotWidth int     `json:"slot_width"`
	// GTs and Width are the lower of both ends where both are known, else
	// the one known; 0 unknown.
	GTs   float64 `json:"gts"`
	Width int     `json:"width"`
}

// GBs is the per-direction payload rate at the trained maximum; 0 unknown.
func (c LinkCapacity) GBs() float64 { return LinkGBs(c.GTs, c.Width) }

// Known reports whether both speed and width are known.
func (c LinkCapacity) Known() bool { return c.GBs() > 0 }

// SlotLimited reports whether the slot, not the device, sets the maximum:
// a slower or narrower slot than the card (an x16 card in an x8 slot).
func (c LinkCapacity) SlotLimited() bool {
	return (c.SlotGTs > 0 && c.DeviceGTs > c.SlotGTs) || (c.SlotWidth > 0 && c.DeviceWidth > c.SlotWidth)
}

// String says the trained maximum and where it comes from:
// "Gen4 x8 15.75 GB/s (device Gen4 x16, slot 0000:00:01.1 Gen4 x8)".
func (c LinkCapacity) String() string {
	if !c.Known() {
		return fmt.Sprintf("unknown (device %s, slot %s)", genWidth(c.DeviceGTs, c.DeviceWidth), c.slotText())
	}
	return fmt.Sprintf("%s %.2f GB/s (device %s, slot %s)", genWidth(c.GTs, c.Width), c.GBs(), genWidth(c.DeviceGTs, c.DeviceWidth), c.slotText())
}

func (c LinkCapacity) slotText() string {
	if c.Slot == "" {
		return "none: on the host bridge"
	}
	return c.Slot + " " + genWidth(c.SlotGTs, c.SlotWidth)
}

// genWidth prints "Gen4 x16", "? x16" for an unknown rate, "Gen4 x?".
func genWidth(gts float64, width int) string {
	g, w := "Gen?", "x?"
	if n := Generation(gts); n > 0 {
		g = fmt.Sprintf("Gen%d", n)
	}
	if width > 0 {
		w = fmt.Sprintf("x%d", width)
	}
	return g + " " + w
}

// LinkCapacity is the trained maximum of the link above function bdf; false
// when there is no such function. Its slot is the function's parent in the
// sysfs tree (Function.Parent).
func (h *Host) LinkCapacity(bdf string) (LinkCapacity, bool) {
	f := h.Functions[bdf]
	if f == nil {
		return LinkCapacity{}, false
	}
	return h.linkCapacity(f, f.Parent), true
}

// linkCapacity is the trained maximum of the link between f and port.
func (h *Host) linkCapacity(f *Function, port string) LinkCapacity {
	c := LinkCapacity{Device: f.BDF, DeviceGTs: f.Link.MaxSpeedGTs, DeviceWidth: f.Link.MaxWidth, GTs: f.Link.MaxSpeedGTs, Width: f.Link.MaxWidth}
	if p := h.Functions[port]; p != nil {
		c.Slot, c.SlotGTs, c.SlotWidth = port, p.Link.MaxSpeedGTs, p.Link.MaxWidth
		c.GTs = minKnown(c.GTs, c.SlotGTs)
		c.Width = int(minKnown(float64(c.Width), float64(c.SlotWidth)))
	}
	return c
}

// GenGTs is the signalling rate of a PCIe generation (1..7), 0 if unknown:
// Generation's inverse, for sources that report a generation (NVML, DCGM).
func GenGTs(gen int) float64 {
	switch gen {
	case 1:
		return 2.5
	case 2:
		return 5
	case 3:
		return 8
	case 4:
		return 16
	case 5:
		return 32
	case 6:
		return 64
	case 7:
		return 128
	}
	return 0
}

// Generation is the PCIe generation of a signalling rate (1..7), 0 if
// unknown.
func Generation(gts float64) int {
	switch gts {
	case 2.5:
		return 1
	case 5:
		return 2
	case 8:
		return 3
	case 16:
		return 4
	case 32:
		return 5
	case 64:
		return 6
	case 128:
		return 7
	}
	return 0
}

package topology

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

// CurGBs is the per-direction capacity at the link's current state (what
// it can carry now; idle GPUs train down to Gen1 to save power).
func (l Link) CurGBs() float64 { return LinkGBs(l.CurSpeedGTs, l.CurWidth) }

// MaxGBs is the per-direction capacity at the link's maximum state.
func (l Link) MaxGBs() float64 { return LinkGBs(l.MaxSpeedGTs, l.MaxWidth) }

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

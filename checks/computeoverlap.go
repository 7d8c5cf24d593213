package checks

// CheckComputeOverlap is seed 000's L2→L1 item 3: H2D vs compute overlap
// and syncs (correlate.ComputeOverlap; the rule is judge's).
const CheckComputeOverlap = "H2D vs compute overlap and syncs"

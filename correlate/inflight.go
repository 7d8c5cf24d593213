package correlate

// Pending is the number of copies waiting for a synchronisation to prove
// their completion (emitted later, or at PendingTimeout without one).
func (e *Engine) Pending() int {
	n := 0
	for _, p := range e.procs {
		n += p.live
	}
	return n
}

//go:build !linux || !cgo

package collectors

// OpenDCGM needs cgo (go-dcgm is a cgo binding that dlopens libdcgm.so):
// this build has none, so DCGM is reported unavailable and the agent
// carries on.
func OpenDCGM(opts DCGMOptions) (GPUCounters, error) {
	return nil, errDCGMUnavailable("built without cgo", nil)
}

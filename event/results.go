package event

// errorName is one code of a generated result table (cudaerrors.go,
// scripts/nvidia/gen-errors.sh).
type errorName struct {
	code uint32
	name string
}

// lookupError finds code in t, sorted by code (a binary search: no
// allocation, no map built at init).
func lookupError(t []errorName, code uint32) (string, bool) {
	lo, hi := 0, len(t)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if t[m].code < code {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(t) && t[lo].code == code {
		return t[lo].name, true
	}
	return "", false
}

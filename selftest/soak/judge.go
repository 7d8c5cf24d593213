package soak

import (
	"fmt"
	"slices"
)

// growth compares a figure's level after warm-up with its level at the
// end: the median of the first third of the samples taken after warm-up
// against the median of the last third. Medians, so a burst of hostile
// traffic or a GC cycle caught in one sample does not decide.
type growth struct {
	Name        string
	Base, Last  float64
	Limit       float64 // the most Last may be
	Floor       float64 // growth up to this is allowed whatever the ratio
	Samples     int
	Fail        bool
	TooFewSince bool   // fewer than 3 samples after warm-up: not judged
	Excused     string // why a growth beyond the limit is not a failure
}

// judgeGrowth judges values (the samples after warm-up, in order) with a
// relative allowance (0.10) and an absolute floor.
func judgeGrowth(name string, values []float64, rel, floor float64) growth {
	g := growth{Name: name, Floor: floor, Samples: len(values)}
	if len(values) < 3 {
		g.TooFewSince = true
		return g
	}
	third := len(values) / 3
	g.Base = median(values[:third])
	g.Last = median(values[len(values)-third:])
	g.Limit = max(g.Base*(1+rel), g.Base+floor)
	g.Fail = g.Last > g.Limit
	return g
}

func (g growth) String() string {
	if g.TooFewSince {
		return fmt.Sprintf("%s: %d samples after warm-up, too few to judge", g.Name, g.Samples)
	}
	pct := 0.0
	if g.Base != 0 {
		pct = 100 * (g.Last - g.Base) / g.Base
	}
	verdict := "ok"
	switch {
	case g.Fail && g.Excused != "":
		verdict = "beyond the limit, but " + g.Excused
	case g.Fail:
		verdict = "FAIL: grew beyond the limit"
	}
	return fmt.Sprintf("%s: %s after warm-up, %s at the end (%+.1f%%, limit %s): %s", g.Name, fmtFigure(g.Name, g.Base),
		fmtFigure(g.Name, g.Last), pct, fmtFigure(g.Name, g.Limit), verdict)
}

func fmtFigure(name string, v float64) string {
	switch name {
	case "rss":
		return fmt.Sprintf("%.1f MiB", v/(1<<20))
	}
	return fmt.Sprintf("%.1f", v)
}

// median of a non-empty slice (not changed).
func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

package judge

import (
	"testing"

	"github.com/lanewatch/lanewatch/correlate"
)

// Every finding rule judged in a window (correlate.Rules, InWindow) is
// raised by exactly one registered window rule, and every window rule has
// a reason to give when there is no window.
func TestEveryWindowRuleRegistered(t *testing.T) {
	raisedBy := map[string][]string{}
	for _, r := range Rules() {
		if r.Unsampled() == "" {
			t.Errorf("rule %q gives no reason for not judging without a window", r.Check())
		}
		for _, name := range r.Raises() {
			raisedBy[name] = append(raisedBy[name], r.Check())
		}
	}
	for _, c := range correlate.Rules {
		if c.Where&correlate.InWindow == 0 {
			if len(raisedBy[c.Name]) > 0 {
				t.Errorf("%s is not a window rule but %v raise it", c.Name, raisedBy[c.Name])
			}
			continue
		}
		if len(raisedBy[c.Name]) != 1 {
			t.Errorf("window rule %s is raised by %v, want exactly one registered rule", c.Name, raisedBy[c.Name])
		}
	}
}

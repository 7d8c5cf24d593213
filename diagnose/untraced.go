package diagnose

import (
	"fmt"
	"slices"
	"strings"

	"github.com/lanewatch/lanewatch/checks"
	"github.com/lanewatch/lanewatch/judge"
	"github.com/lanewatch/lanewatch/probes"
)

// CheckTraced says, per process, whether it maps an object that moves data
// past every probe (probes.Untraced): mlx5 direct verbs, the verbs work
// request API, GPU-initiated RDMA, NVSHMEM, DOCA, gdrcopy.
const CheckTraced = "transfers traced"

// rdmaChecks are the rows that judge RDMA work requests: a PASS of one
// cannot vouch for a process whose RDMA the probes do not see. RDMA
// congestion is left out: it reads the ports' own counters, which count
// every sender.
var rdmaChecks = []string{checks.CheckOverlap, checks.CheckInFlight, judge.CheckOrdering}

// untracedTarget is a target process and what the probes cannot see of it.
type untracedTarget struct {
	pid     int
	scope   string
	objects []probes.Untraced
	unread  []string // objects or maps that could not be read: unknown
}

// blind says whether it maps an object that hides RDMA, and whether one
// certainly does (probes.Untraced.Certain) rather than can.
func (u untracedTarget) blind() (rdma, certain bool) {
	for _, o := range u.objects {
		if o.RDMA() {
			rdma, certain = true, certain || o.Certain()
		}
	}
	return rdma, certain
}

func (u untracedTarget) text() string {
	parts := make([]string, len(u.objects))
	for i, o := range u.objects {
		parts[i] = o.String()
	}
	return strings.Join(parts, "; ")
}

// untracedOf reads one target's maps and classifies what it maps (files
// keeps each file's verdict for the next process).
func untracedOf(files *probes.UntracedFiles, procRoot string, pid int, scope string) untracedTarget {
	u := untracedTarget{pid: pid, scope: scope}
	maps, err := probes.ReadMaps(procRoot, pid)
	if err != nil {
		u.unread = []string{err.Error()}
		return u
	}
	objs, errs := files.Process(procRoot, pid, maps)
	u.objects = objs
	for _, err := range errs {
		u.unread = append(u.unread, err.Error())
	}
	return u
}

// tracedCheck is the process's CheckTraced row: SKIP, saying what is not
// seen and why, when it maps such an object or one could not be read; PASS
// otherwise.
func (u untracedTarget) check() checks.Check {
	switch {
	case len(u.objects) > 0:
		c := checks.Skipped(u.scope, CheckTraced, "what it moves through these objects is not seen, and no RDMA check vouches for it: %s", u.text())
		if len(u.unread) > 0 {
			c.Detail += fmt.Sprintf("; and not read, so unknown: %s", checks.JoinLimited(u.unread, 4))
		}
		c.Fix = "judge these transfers by the library's own counters, or move the KV transfer to a library the agent traces (docs/design.md, \"Transfer libraries\")"
		return c
	case len(u.unread) > 0:
		return checks.Skipped(u.scope, CheckTraced, "whether its objects move data past the probes is unknown: %s", checks.JoinLimited(u.unread, 4))
	}
	return checks.Check{Scope: u.scope, Name: CheckTraced, Status: checks.Pass,
		Detail: "no object it maps moves data past the probes (mlx5 direct verbs, verbs work request API, GPU-initiated RDMA, NVSHMEM, DOCA, gdrcopy)"}
}

// qualifyRDMA keeps each PASS of an RDMA check from vouching for a process
// whose RDMA is not seen: the process's own rows, and every GPU's lane
// rows (which GPU links its work requests cross is not known). Where an
// object certainly posts past the probes the PASS becomes a SKIP saying
// so, followed by what was seen; where one only can (known by its
// imports), the PASS stands on what was seen and says what it leaves out.
// Findings stand: what was seen is still judged.
func qualifyRDMA(r *checks.Report, untraced []untracedTarget) {
	type blindTarget struct {
		untracedTarget
		certain bool
	}
	var blind []blindTarget
	var certain, possible []string
	for _, u := range untraced {
		rdma, sure := u.blind()
		if !rdma {
			continue
		}
		blind = append(blind, blindTarget{u, sure})
		if sure {
			certain = append(certain, fmt.Sprintf("pid %d", u.pid))
		} else {
			possible = append(possible, fmt.Sprintf("pid %d", u.pid))
		}
	}
	for i := range r.Checks {
		c := &r.Checks[i]
		if c.Status != checks.Pass || !slices.Contains(rdmaChecks, c.Name) {
			continue
		}
		switch k := slices.IndexFunc(blind, func(u blindTarget) bool { return u.scope == c.Scope }); {
		case strings.HasPrefix(c.Scope, "GPU ") && len(certain) > 0:
			c.Status = checks.Skip
			c.Detail = fmt.Sprintf("the RDMA of %s is not seen (%s): which GPU links it crosses is unknown; what was seen: %s",
				checks.JoinLimited(certain, 4), CheckTraced, c.Detail)
		case strings.HasPrefix(c.Scope, "GPU ") && len(possible) > 0:
			c.Detail += fmt.Sprintf("; not judged: what %s may post past the probes (%s)", checks.JoinLimited(possible, 4), CheckTraced)
		case k >= 0 && blind[k].certain:
			c.Status, c.Detail = checks.Skip, "its RDMA is not seen: "+blind[k].text()+"; what was seen: "+c.Detail
		case k >= 0:
			c.Detail += "; not judged: what it may post past the probes: " + blind[k].text()
		}
	}
}

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

// rdma says whether it hides RDMA work requests.
func (u untracedTarget) rdma() bool { return slices.ContainsFunc(u.objects, probes.Untraced.RDMA) }

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
		c := checks.Skipped(u.scope, CheckTraced, "its transfers through these objects are not seen, and its RDMA checks do not pass it: %s", u.text())
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

// qualifyRDMA turns each PASS of an RDMA check that would vouch for a
// process whose RDMA is not seen into a SKIP saying so, followed by what
// was seen: the process's own rows, and every GPU's lane rows (which GPU
// links its work requests cross is not known). Findings stand: what was
// seen is still judged.
func qualifyRDMA(r *checks.Report, untraced []untracedTarget) {
	var blind []untracedTarget
	for _, u := range untraced {
		if u.rdma() {
			blind = append(blind, u)
		}
	}
	if len(blind) == 0 {
		return
	}
	var pids []string
	for _, u := range blind {
		pids = append(pids, fmt.Sprintf("pid %d", u.pid))
	}
	for i := range r.Checks {
		c := &r.Checks[i]
		if c.Status != checks.Pass || !slices.Contains(rdmaChecks, c.Name) {
			continue
		}
		var why string
		if strings.HasPrefix(c.Scope, "GPU ") {
			why = fmt.Sprintf("the RDMA of %s is not seen (%s): which GPU links it crosses is unknown", checks.JoinLimited(pids, 4), CheckTraced)
		} else if k := slices.IndexFunc(blind, func(u untracedTarget) bool { return u.scope == c.Scope }); k >= 0 {
			why = "its RDMA is not seen: " + blind[k].text()
		} else {
			continue
		}
		c.Status, c.Detail = checks.Skip, why+"; what was seen: "+c.Detail
	}
}

package judge

import "github.com/lanewatch/lanewatch/checks"

// The rules over each process's copies (checks.Window): pageable-copy,
// fragmented-copies, and remote-numa-pool on the pages they read.

var (
	_ = register(processRule{check: checks.CheckPageable, raises: []string{"pageable-copy"}, unsampled: unsampledCopies,
		judge: func(w *Window, env *Env, pid uint32) checks.Check { return w.PageableCheck(env.scope(pid), pid) }})
	_ = register(processRule{check: checks.CheckFragmentation, raises: []string{"fragmented-copies"}, unsampled: unsampledCopies,
		judge: func(w *Window, env *Env, pid uint32) checks.Check { return w.FragmentationCheck(env.scope(pid), pid) }})
	// remote-numa-pool on the bytes each process's copies moved, by the
	// node of their host pages (checks.Window.PagesCheck).
	_ = register(processRule{check: checks.CheckPages, raises: []string{"remote-numa-pool"},
		unsampled: "needs a live window (--sample): the pages copies read are located as they are made",
		judge: func(w *Window, env *Env, pid uint32) checks.Check {
			return w.PagesCheck(env.scope(pid), pid, env.Place(pid), env.NUMA)
		}})
)

const unsampledCopies = "needs a live window (--sample): copies are judged as they are made"

// processRule is a rule judged once per process, from the facts the
// window's rules share: every process that copied, and the caller's
// targets (each gets its SKIP when it did not).
type processRule struct {
	check, unsampled string
	raises           []string
	judge            func(w *Window, env *Env, pid uint32) checks.Check
}

func (r processRule) Check() string     { return r.check }
func (r processRule) Raises() []string  { return r.raises }
func (r processRule) Unsampled() string { return r.unsampled }

func (r processRule) Judge(w *Window, env *Env) (j Judgement) {
	for _, pid := range env.pids(w.PIDs()) {
		j.Checks = append(j.Checks, r.judge(w, env, pid))
	}
	return j
}

// pids are the processes a per-process rule judges: those in the window
// and those the caller asked about.
func (env *Env) pids(inWindow []uint32) []uint32 {
	return mergePIDs(inWindow, env.Targets)
}

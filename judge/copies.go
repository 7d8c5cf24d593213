package judge

import "github.com/lanewatch/lanewatch/checks"

// The rules over each process's copies (checks.Window): pageable-copy,
// fragmented-copies and remote-numa-pool on the pages they read.

var (
	_ = register(pageableRule{})
	_ = register(fragmentRule{})
	_ = register(pagesRule{})
)

const unsampledCopies = "needs a live window (--sample): copies are judged as they are made"

// pids are the processes a per-process rule judges: those in the window
// and those the caller asked about.
func (env *Env) pids(inWindow []uint32) []uint32 {
	return mergePIDs(inWindow, env.Targets)
}

type pageableRule struct{}

func (pageableRule) Check() string     { return checks.CheckPageable }
func (pageableRule) Raises() []string  { return []string{"pageable-copy"} }
func (pageableRule) Unsampled() string { return unsampledCopies }
func (pageableRule) Judge(w *Window, env *Env) (j Judgement) {
	for _, pid := range env.pids(w.PIDs()) {
		j.Checks = append(j.Checks, w.PageableCheck(env.scope(pid), pid))
	}
	return j
}

type fragmentRule struct{}

func (fragmentRule) Check() string     { return checks.CheckFragmentation }
func (fragmentRule) Raises() []string  { return []string{"fragmented-copies"} }
func (fragmentRule) Unsampled() string { return unsampledCopies }
func (fragmentRule) Judge(w *Window, env *Env) (j Judgement) {
	for _, pid := range env.pids(w.PIDs()) {
		j.Checks = append(j.Checks, w.FragmentationCheck(env.scope(pid), pid))
	}
	return j
}

// pagesRule judges remote-numa-pool on the bytes each process's copies
// moved, by the node of their host pages (checks.Window.PagesCheck).
type pagesRule struct{}

func (pagesRule) Check() string    { return checks.CheckPages }
func (pagesRule) Raises() []string { return []string{"remote-numa-pool"} }
func (pagesRule) Unsampled() string {
	return "needs a live window (--sample): the pages copies read are located as they are made"
}
func (pagesRule) Judge(w *Window, env *Env) (j Judgement) {
	for _, pid := range env.pids(w.PIDs()) {
		j.Checks = append(j.Checks, w.PagesCheck(env.scope(pid), pid, env.Place(pid), env.NUMA))
	}
	return j
}

package selftest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/lanewatch/lanewatch/agent"
	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/selftest/kineto"
)

// DefaultReplayMaxGap is the longest idle stretch a replay keeps
// (kineto.ScriptOptions.MaxGap).
const DefaultReplayMaxGap = 100 * time.Millisecond

// ReplayResult is one replayed trace: CUPTI's copies beside the agent's
// records, by direction/host memory ("H2D/pinned"), and the findings.
type ReplayResult struct {
	Trace string `json:"trace"`
	// CUPTI counts the trace's copies that have a call (a copy inside a
	// graph launch or whose call began before the trace is not one).
	CUPTI    map[string]kineto.Count `json:"cupti"`
	Agent    map[string]kineto.Count `json:"agent"`
	InGraphs int                     `json:"in_graphs"`
	// NoCall counts the copies CUPTI ran whose call is not in the trace.
	NoCall   int             `json:"no_call"`
	Findings []ReplayFinding `json:"findings"`
	// Skipped counts the trace's calls not replayed, by API: attribute
	// queries, allocations and the like, and calls whose GPU record the
	// trace lacks (kineto.Trace.Skipped).
	Skipped  map[string]int `json:"not_replayed,omitempty"`
	Plan     kineto.Plan    `json:"-"`
	Records  Result         `json:"-"` // the record-by-record comparison with the replay's truth
	Expect   *ReplayExpect  `json:"-"`
	Verdicts []string       `json:"verdict_problems,omitempty"` // expected verdicts that did not hold
	Problems []string       `json:"problems,omitempty"`
	Elapsed  time.Duration  `json:"-"`
	// Activities: the agent's launches, graph launches, host waits and
	// event records beside the replay's ("launch 79/79, ...").
	Activities string `json:"-"`
}

// ReplayFinding is a finding the agent's judge raised on a replay.
type ReplayFinding struct {
	Rule     string             `json:"rule"`
	Severity correlate.Severity `json:"severity"`
	Summary  string             `json:"-"`
}

// ReplayExpect is a trace's provenance and its expected verdicts, the file
// beside it: NAME.json.gz → NAME.expect.json.
type ReplayExpect struct {
	Source struct {
		Repository string `json:"repository"`
		Path       string `json:"path"`
		Commit     string `json:"commit"`
		License    string `json:"license"`
		Ran        string `json:"ran"` // what ran, on what
		Cut        string `json:"cut,omitempty"`
	} `json:"source"`
	// Verdicts: each rule a person reading the trace says fires (with its
	// severity) or stays silent, and why. A rule not listed must stay
	// silent but for INFO.
	Verdicts []ReplayVerdict `json:"verdicts"`
}

// ReplayVerdict is one rule's expected verdict on a trace.
type ReplayVerdict struct {
	Rule     string             `json:"rule"`
	Fires    bool               `json:"fires"`
	Severity correlate.Severity `json:"severity,omitempty"` // when it fires
	Why      string             `json:"why"`                // what a person reading the trace sees
}

// ExpectPath is where a trace's expectations are.
func ExpectPath(trace string) string {
	base := strings.TrimSuffix(strings.TrimSuffix(trace, ".gz"), ".json")
	return base + ".expect.json"
}

// ReadExpect reads a trace's expectations.
func ReadExpect(trace string) (*ReplayExpect, error) {
	path := ExpectPath(trace)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var e ReplayExpect
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for i, v := range e.Verdicts {
		if _, ok := correlate.RuleNamed(v.Rule); !ok || v.Why == "" || v.Fires != (v.Severity != "") {
			return nil, fmt.Errorf("%s: verdict %d: want a known rule, a why, and a severity exactly when it fires", path, i)
		}
	}
	return &e, nil
}

// Replay replays each trace through the reference runtime under the agent
// (refpath/kvpath/replay.c), one process per trace, and compares: every
// copy the replay made with the agent's record of it, thread by thread
// (Compare); CUPTI's copies by direction/host memory with the agent's;
// and, where the trace has an expect file, the findings with its verdicts.
func Replay(ctx context.Context, cfg Config, traces []string, maxGap time.Duration) (out []ReplayResult, stats agent.Stats, err error) {
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	kvpath := filepath.Join(cfg.RefDir, "bin", "kvpath")
	if _, err := os.Stat(kvpath); err != nil {
		return nil, stats, fmt.Errorf("reference data path not built (run `make -C refpath`): %w", err)
	}
	// Every trace parses before the agent starts: a bad file is said at once.
	parsed := make([]*kineto.Trace, len(traces))
	for i, path := range traces {
		t, err := kineto.ReadFile(path)
		if err != nil {
			return nil, stats, err
		}
		parsed[i] = t
	}
	tmp, err := os.MkdirTemp("", "lanewatch-replay-")
	if err != nil {
		return nil, stats, err
	}
	defer os.RemoveAll(tmp)
	col := NewCollector(cfg.Live)
	defer col.StartLive()()
	ag, stopAgent, err := startAgent(ctx, cfg, col, nil)
	if err != nil {
		return nil, stats, err
	}
	defer stopAgent()
	defer func() { stats = ag.Stats() }()
	drops := func(pids ...uint32) uint64 { return col.Lost(pids...) + ag.Stats().Engine.LostAny + shedOf(ag, pids) }

	for i, t := range parsed {
		r := ReplayResult{Trace: t.Name, CUPTI: kineto.CountCopies(t.Copies), InGraphs: len(t.InGraphs), NoCall: len(t.NoCall),
			Skipped: t.Skipped, Findings: []ReplayFinding{}}
		if e, err := ReadExpect(traces[i]); err == nil {
			r.Expect = e
		} else if !os.IsNotExist(err) {
			return out, stats, err
		}
		if err := replayOne(ctx, kvpath, tmp, i, t, maxGap, col, cfg, drops, &r); err != nil {
			return out, stats, err
		}
		r.checkVerdicts()
		out = append(out, r)
	}
	return out, stats, nil
}

func replayOne(ctx context.Context, kvpath, tmp string, i int, t *kineto.Trace, maxGap time.Duration, col *Collector,
	cfg Config, drops lossCount, r *ReplayResult) error {
	script := filepath.Join(tmp, fmt.Sprintf("trace-%d.script", i))
	f, err := os.Create(script)
	if err != nil {
		return err
	}
	r.Plan, err = kineto.Script(f, t, kineto.ScriptOptions{MaxGap: maxGap})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	for why, n := range r.Plan.NotReplayed {
		r.Problems = append(r.Problems, fmt.Sprintf("%d calls not replayed: %s", n, why))
	}
	truth := filepath.Join(tmp, fmt.Sprintf("trace-%d.jsonl", i))
	before := drops()
	began := time.Now()
	cmd := exec.CommandContext(ctx, kvpath, "--scenario", "replay", "--truth", truth, "--script", script)
	cmd.Stderr = cfg.drivers()
	// the reference GPU's memory: both device buffers and room for the runtime's own
	cmd.Env = append(os.Environ(), fmt.Sprintf("LW_REF_DEVICE_MB=%d", 2*r.Plan.DeviceBytes>>20+64))
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the replay of %s: %w", t.Name, err)
	}
	p := &proc{cmd: cmd, pid: uint32(cmd.Process.Pid), truth: truth}
	res := &r.Records
	*res = Result{Scenario: "replay " + t.Name, Runtime: "plain", PID: p.pid}
	if err := p.wait(col, cfg.Timeout); err != nil {
		res.Problems = append(res.Problems, err.Error())
	}
	r.Elapsed = time.Since(began)
	res.Drops = drops(p.pid) - before
	calls, err := ReadTruthFile(truth)
	if err != nil {
		res.Problems = append(res.Problems, err.Error())
	}
	got := col.Take(p.pid)
	acts := col.TakeActivities(p.pid)
	compareByThread(res, calls, got)
	r.Activities = compareActivities(res, calls, acts)
	r.Agent = map[string]kineto.Count{}
	for _, g := range got {
		if g.Failed() {
			continue
		}
		k := string(g.Direction) + "/" + string(g.HostMem)
		if g.Direction == correlate.DirD2D {
			k = string(g.Direction) + "/device"
		}
		v := r.Agent[k]
		v.Add(g.Bytes)
		r.Agent[k] = v
	}
	// judged as `agent run` judges a window: the process on its own
	// reference GPU, kernels probed
	fs := windowFindings([]scenarioProc{{pid: p.pid, gpu: privateGPU(p.pid)}}, got, acts)
	for _, f := range fs {
		r.Findings = append(r.Findings, ReplayFinding{Rule: f.Rule, Severity: f.Severity, Summary: f.Summary})
	}
	slices.SortFunc(r.Findings, func(a, b ReplayFinding) int { return strings.Compare(a.Rule, b.Rule) })
	return nil
}

// compareByThread is Compare per thread: a thread's calls are in order, the
// threads' among each other are not (two calls of two threads at one
// instant may enter their probes either way round). Event queries are left
// out: cudaEventQuery is not a call the agent reports, and its
// cudaErrorNotReady is an answer, not a failure.
func compareByThread(res *Result, truth []TruthCall, got []correlate.Transfer) {
	byTID := map[uint32][]TruthCall{}
	for _, c := range truth {
		if c.Op != TruthEventQuery {
			byTID[c.TID] = append(byTID[c.TID], c)
		}
	}
	gotBy := map[uint32][]correlate.Transfer{}
	for _, g := range got {
		gotBy[g.TID] = append(gotBy[g.TID], g)
	}
	tids := slices.Sorted(maps.Keys(byTID))
	for tid := range gotBy {
		if _, ok := byTID[tid]; !ok {
			tids = append(tids, tid)
		}
	}
	for _, tid := range tids {
		var one Result
		Compare(&one, byTID[tid], gotBy[tid])
		res.WantRecords += one.WantRecords
		res.Got += one.Got
		res.WantBytes += one.WantBytes
		res.GotBytes += one.GotBytes
		res.WantFailed += one.WantFailed
		res.GotFailed += one.GotFailed
		res.ErrorErrs += one.ErrorErrs
		res.DirectionErrs += one.DirectionErrs
		res.MemoryErrs += one.MemoryErrs
		res.OtherErrs += one.OtherErrs
		for _, p := range one.Problems {
			if len(res.Problems) < 8 {
				res.Problems = append(res.Problems, fmt.Sprintf("tid %d: %s", tid, p))
			}
		}
	}
}

// compareActivities compares the agent's launches, graph launches, host
// waits and event records with the replay's: the compute the rules see.
// It returns a line of both: "launch 79/79, ..." (agent/replay).
func compareActivities(res *Result, truth []TruthCall, acts []correlate.Activity) string {
	want, got := map[event.Op]int{}, map[event.Op]int{}
	for _, t := range truth {
		if t.Result == 0 && slices.Contains(activityOps, t.Op.Agent()) {
			want[t.Op.Agent()]++
		}
	}
	for _, a := range acts {
		got[a.Op]++
	}
	var line []string
	for _, op := range activityOps {
		line = append(line, fmt.Sprintf("%s %d/%d", op, got[op], want[op]))
		if want[op] != got[op] {
			res.OtherErrs++
			res.Problems = append(res.Problems, fmt.Sprintf("%s: the replay made %d, the agent reported %d", op, want[op], got[op]))
		}
	}
	return strings.Join(line, ", ")
}

// Keys are every direction/host memory either side counted, in table order.
func (r ReplayResult) Keys() []string {
	order := func(k string) int {
		i := slices.Index([]string{"H2D/pinned", "H2D/pageable", "H2D/device", "H2D/unknown", "D2H/pinned", "D2H/pageable",
			"D2H/device", "D2H/unknown", "D2D/device"}, k)
		if i < 0 {
			return 100
		}
		return i
	}
	ks := slices.Collect(maps.Keys(r.CUPTI))
	for k := range r.Agent {
		if _, ok := r.CUPTI[k]; !ok {
			ks = append(ks, k)
		}
	}
	slices.SortFunc(ks, func(a, b string) int {
		if d := order(a) - order(b); d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	return ks
}

// CountsAgree says whether CUPTI's and the agent's copies agree, per
// direction/host memory, in count and bytes.
func (r ReplayResult) CountsAgree() bool { return maps.Equal(r.CUPTI, r.Agent) }

// checkVerdicts compares the findings with the expected verdicts.
func (r *ReplayResult) checkVerdicts() {
	if r.Expect == nil {
		return
	}
	listed := map[string]bool{}
	for _, v := range r.Expect.Verdicts {
		listed[v.Rule] = true
		var got []ReplayFinding
		for _, f := range r.Findings {
			if f.Rule == v.Rule && (v.Fires || f.Severity != correlate.SevInfo) {
				got = append(got, f)
			}
		}
		switch {
		case v.Fires && len(got) == 0:
			r.Verdicts = append(r.Verdicts, fmt.Sprintf("%s: expected %s (%s), silent", v.Rule, v.Severity, v.Why))
		case v.Fires && !slices.ContainsFunc(got, func(f ReplayFinding) bool { return f.Severity == v.Severity }):
			r.Verdicts = append(r.Verdicts, fmt.Sprintf("%s: expected %s (%s), got %s: %s", v.Rule, v.Severity, v.Why, got[0].Severity, got[0].Summary))
		case !v.Fires && len(got) > 0:
			r.Verdicts = append(r.Verdicts, fmt.Sprintf("%s: expected silent (%s), got %s: %s", v.Rule, v.Why, got[0].Severity, got[0].Summary))
		}
	}
	for _, f := range r.Findings {
		if !listed[f.Rule] && f.Severity != correlate.SevInfo {
			r.Verdicts = append(r.Verdicts, fmt.Sprintf("%s: not expected, got %s: %s", f.Rule, f.Severity, f.Summary))
		}
	}
}

// OK says the replay matched: every record, CUPTI's counts, the verdicts.
func (r ReplayResult) OK() bool {
	return r.Records.OK() && r.CountsAgree() && len(r.Verdicts) == 0 && len(r.Problems) == 0
}

// PrintReplay writes the replay table and returns whether all passed.
func PrintReplay(w io.Writer, results []ReplayResult, stats agent.Stats) bool {
	ok := true
	for _, r := range results {
		verdict := "ok"
		if !r.OK() {
			verdict, ok = "FAIL", false
		}
		fmt.Fprintf(w, "%s: %d threads, %d streams, replayed in %.2fs; records %d/%d, drops %d; %d copies in graphs (%d graph launches), %d with no call in the trace: %s\n",
			r.Trace, r.Plan.Threads, r.Plan.Streams, r.Elapsed.Seconds(), r.Records.Got, r.Records.WantRecords, r.Records.Drops,
			r.InGraphs, r.Plan.GraphLaunches, r.NoCall, verdict)
		fmt.Fprintf(w, "  calls agent/replay: %s\n", r.Activities)
		if len(r.Skipped) > 0 {
			var parts []string
			n := 0
			for _, api := range slices.Sorted(maps.Keys(r.Skipped)) {
				parts = append(parts, fmt.Sprintf("%s %d", api, r.Skipped[api]))
				n += r.Skipped[api]
			}
			fmt.Fprintf(w, "  not replayed: %d calls (%s)\n", n, strings.Join(parts, ", "))
		}
		fmt.Fprintf(w, "  %-14s %-22s %-22s\n", "COPIES", "CUPTI", "AGENT")
		for _, k := range r.Keys() {
			c, a := r.CUPTI[k], r.Agent[k]
			mark := ""
			if c != a {
				mark = "  differs"
			}
			fmt.Fprintf(w, "  %-14s %-22s %-22s%s\n", k, fmt.Sprintf("%d / %d B", c.Copies, c.Bytes), fmt.Sprintf("%d / %d B", a.Copies, a.Bytes), mark)
		}
		if len(r.Findings) == 0 {
			fmt.Fprintf(w, "  findings: none\n")
		}
		for _, f := range r.Findings {
			fmt.Fprintf(w, "  finding %s %s: %s\n", f.Severity, f.Rule, f.Summary)
		}
		for _, p := range append(append(slices.Clone(r.Records.Problems), r.Problems...), r.Verdicts...) {
			fmt.Fprintf(w, "    %s\n", p)
		}
	}
	fmt.Fprintf(w, "events %d, drops %d, attach points %d in %d files\n", stats.Events, stats.Drops.Total(), stats.Links, stats.Files)
	return ok
}

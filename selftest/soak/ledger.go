package soak

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lanewatch/lanewatch/correlate"
	"github.com/lanewatch/lanewatch/selftest"
)

// monoNow is CLOCK_MONOTONIC in ns, the clock of the agent's submit_ns and
// of the truth's stamps.
func monoNow() uint64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// finished is one process of the workload, from its start: its records
// are those of its pid submitted between start and end (pids are reused:
// the soak starts thousands of processes). Once it exited, its truth says
// which records it must have.
type finished struct {
	kind       string
	pid        uint32
	start, end uint64 // CLOCK_MONOTONIC brackets around the process's life; end 0 while it runs
	truth      []selftest.TruthCall
	rdma       bool
	want       int // records the truth asks for
	exited     bool
	exitedAt   time.Time

	got    []correlate.Transfer
	judged bool
	ok     bool
	res    selftest.Result
}

// wantRecords counts the records a truth asks for: every copy, every
// other call that failed, every RDMA work request (selftest.Compare,
// selftest.CompareRDMA).
func wantRecords(truth []selftest.TruthCall) int {
	n := 0
	for _, t := range truth {
		switch {
		case t.IsCopy(), t.Result != 0:
			n++
		case t.Op == selftest.TruthPostSend, t.Op == selftest.TruthPostRecv:
			n++
		}
	}
	return n
}

func (f *finished) contains(submit uint64) bool {
	return submit >= f.start && (f.end == 0 || submit <= f.end)
}

// ledger matches the agent's JSONL records with the truth of every
// process of the workload: each process is known from its start, judged
// once it exited and its records number what its truth asks for
// (selftest.Compare, record by record), and at the end, after the agent
// flushed everything, a process still short of records has lost them.
// Records of other processes (other programs on the host using CUDA
// libraries) are counted and dropped; those of a pid not known yet wait
// a moment (an RDMA role is known once its launcher's child is seen).
type ledger struct {
	mu        sync.Mutex
	procs     map[uint32][]*finished // by pid, every incarnation not yet forgotten
	unclaimed []heldRecord           // oldest first
	st        ledgerStats
	problems  []string
}

type heldRecord struct {
	t  correlate.Transfer
	at time.Time
}

// Records of an unknown pid are kept this long, and this many at most.
const (
	unclaimedKeep = 3 * time.Second
	unclaimedMax  = 50_000
)

// ledgerStats are the ledger's counts.
type ledgerStats struct {
	Finished     int // processes exited with their truth
	Matched      int // judged: every record as the truth says
	Mismatched   int // judged: a record differs, or more records than calls
	WantRecords  int // of the exited processes
	GotRecords   int // records of the workload's processes
	Foreign      int // records of processes the workload did not start (other programs using CUDA libraries)
	ExtraRecords int // records that came after their process was judged
	Lost         int // records never reported (known at the end)
	LostProcs    int
}

func newLedger() *ledger {
	return &ledger{procs: map[uint32][]*finished{}}
}

func (l *ledger) problem(format string, args ...any) {
	if len(l.problems) < 40 {
		l.problems = append(l.problems, fmt.Sprintf(format, args...))
	}
}

// add takes one record of the agent's output.
func (l *ledger) add(t correlate.Transfer, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.claim(t) {
		if len(l.unclaimed) >= unclaimedMax {
			l.unclaimed = l.unclaimed[1:]
			l.st.Foreign++
		}
		l.unclaimed = append(l.unclaimed, heldRecord{t, now})
	}
}

// claim gives t to the process it belongs to, if known.
func (l *ledger) claim(t correlate.Transfer) bool {
	for _, f := range l.procs[t.PID] {
		if !f.contains(t.SubmitNs) {
			continue
		}
		l.st.GotRecords++
		if f.judged {
			l.st.ExtraRecords++
			if f.ok {
				f.ok = false
				l.st.Matched--
				l.st.Mismatched++
			}
			l.problem("%s pid %d: record after its %d were judged: %s %d B submit %d", f.kind, f.pid, f.want, t.API, t.Bytes, t.SubmitNs)
			return true
		}
		f.got = append(f.got, t)
		l.judge(f)
		return true
	}
	return false
}

// begin adds a process of the workload that started at start (before
// its first call) and claims its records that came before it was known.
func (l *ledger) begin(pid uint32, kind string, start uint64) *finished {
	f := &finished{kind: kind, pid: pid, start: start}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.procs[pid] = append(l.procs[pid], f)
	keep := l.unclaimed[:0]
	for _, h := range l.unclaimed {
		if !l.claim(h.t) {
			keep = append(keep, h)
		}
	}
	clear(l.unclaimed[len(keep):])
	l.unclaimed = keep
	return f
}

// exit records that f's process, of kind, exited before end with truth.
func (l *ledger) exit(f *finished, kind string, end uint64, truth []selftest.TruthCall, rdma bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f.kind, f.end, f.truth, f.rdma = kind, end, truth, rdma
	f.want = wantRecords(truth)
	f.exited, f.exitedAt = true, time.Now()
	l.st.Finished++
	l.st.WantRecords += f.want
	l.judge(f)
}

// abandon forgets a process whose run failed (the workload reports it).
func (l *ledger) abandon(f *finished) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fs := l.procs[f.pid]
	for i, g := range fs {
		if g == f {
			l.procs[f.pid] = append(fs[:i:i], fs[i+1:]...)
			break
		}
	}
	if len(l.procs[f.pid]) == 0 {
		delete(l.procs, f.pid)
	}
}

// judge compares a process's records with its truth once they number
// what the truth asks for.
func (l *ledger) judge(f *finished) {
	if f.judged || !f.exited || len(f.got) < f.want {
		return
	}
	f.judged = true
	f.res = selftest.Result{Scenario: f.kind, PID: f.pid}
	got := append([]correlate.Transfer(nil), f.got...)
	if f.rdma {
		selftest.CompareRDMA(&f.res, f.truth, got)
	} else {
		selftest.Compare(&f.res, f.truth, got)
	}
	f.ok = f.res.OK()
	if f.ok {
		l.st.Matched++
	} else {
		l.st.Mismatched++
		l.problem("%s pid %d: %d/%d records, %d/%d bytes, errors direction %d memory %d error %d other %d: %v", f.kind, f.pid,
			f.res.Got, f.res.WantRecords, f.res.GotBytes, f.res.WantBytes, f.res.DirectionErrs, f.res.MemoryErrs, f.res.ErrorErrs,
			f.res.OtherErrs, f.res.Problems)
	}
	f.got, f.truth = nil, nil // judged: keep only the counts
}

// forget drops judged processes that exited more than keep ago (their
// pid may be reused) and records of unknown pids older than
// unclaimedKeep: records of processes the workload did not start.
func (l *ledger) forget(now time.Time, keep time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for pid, fs := range l.procs {
		live := fs[:0]
		for _, f := range fs {
			if !f.judged || now.Sub(f.exitedAt) < keep {
				live = append(live, f)
			}
		}
		if len(live) == 0 {
			delete(l.procs, pid)
		} else {
			l.procs[pid] = live
		}
	}
	n := 0
	for n < len(l.unclaimed) && now.Sub(l.unclaimed[n].at) >= unclaimedKeep {
		n++
	}
	l.st.Foreign += n
	l.unclaimed = l.unclaimed[n:]
}

// pending is how many finished processes still wait for records, and the
// longest any has waited.
func (l *ledger) pending(now time.Time) (n int, oldest time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, fs := range l.procs {
		for _, f := range fs {
			if f.exited && !f.judged {
				n++
				oldest = max(oldest, now.Sub(f.exitedAt))
			}
		}
	}
	return n, oldest
}

// close ends the ledger once the agent exited and its output was read to
// the end: every process still short of records lost them.
func (l *ledger) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, fs := range l.procs {
		for _, f := range fs {
			if f.judged || !f.exited {
				continue
			}
			l.st.LostProcs++
			l.st.Lost += f.want - len(f.got)
			// Judge what came, for the problems' sake.
			f.res = selftest.Result{Scenario: f.kind, PID: f.pid}
			if f.rdma {
				selftest.CompareRDMA(&f.res, f.truth, f.got)
			} else {
				selftest.Compare(&f.res, f.truth, f.got)
			}
			l.problem("%s pid %d: lost %d of %d records: %v", f.kind, f.pid, f.want-len(f.got), f.want, f.res.Problems)
			f.judged = true
		}
	}
	l.st.Foreign += len(l.unclaimed)
	l.unclaimed = nil
}

func (l *ledger) stats() ledgerStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st
}

func (l *ledger) problemList() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.problems...)
}

// tailer reads the agent's JSONL output as it grows and hands each record
// to the ledger. Behind what it read it punches holes in the file, so a
// long soak's output takes no disk (the agent writes at its own offset;
// the file's size grows, its blocks do not).
type tailer struct {
	f       *os.File
	off     int64
	punched int64
	partial []byte
	buf     []byte
	lines   int
	bad     int
	noPunch error
}

const punchEvery = 16 << 20

func openTailer(path string) (*tailer, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	return &tailer{f: f, buf: make([]byte, 1<<20)}, nil
}

// poll reads what was written since the last call.
func (t *tailer) poll(l *ledger) error {
	now := time.Now()
	for {
		n, err := t.f.ReadAt(t.buf, t.off)
		if n > 0 {
			t.off += int64(n)
			data := t.buf[:n]
			for {
				i := bytes.IndexByte(data, '\n')
				if i < 0 {
					t.partial = append(t.partial, data...)
					break
				}
				line := data[:i]
				if len(t.partial) > 0 {
					line = append(t.partial, line...)
				}
				t.line(line, l, now)
				t.partial = t.partial[:0]
				data = data[i+1:]
			}
		}
		if err == io.EOF || n == 0 {
			break
		}
		if err != nil {
			return err
		}
	}
	if t.noPunch == nil && t.off-t.punched >= punchEvery {
		end := t.off &^ (4096 - 1)
		if err := unix.Fallocate(int(t.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, end); err != nil {
			t.noPunch = err
		} else {
			t.punched = end
		}
	}
	return nil
}

func (t *tailer) line(b []byte, l *ledger, now time.Time) {
	if len(bytes.TrimSpace(b)) == 0 {
		return
	}
	t.lines++
	var tr correlate.Transfer
	if err := json.Unmarshal(b, &tr); err != nil {
		t.bad++
		l.mu.Lock()
		l.problem("output line %d: %v: %.200s", t.lines, err, b)
		l.mu.Unlock()
		return
	}
	l.add(tr, now)
}

func (t *tailer) close() error { return t.f.Close() }

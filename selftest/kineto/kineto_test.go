package kineto

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

const testdata = "../testdata/replay"

// What a person counts in each real trace (python over the JSON, by
// correlation id): the copies that have a call, by direction/host memory,
// those inside graph launches and those whose call precedes the trace, the
// host threads and the calls replayed by op.
func TestRealTraces(t *testing.T) {
	for _, tc := range []struct {
		file             string
		threads          int
		streams          []int64
		copies           map[string]Count
		inGraphs, noCall int
		ops              map[Op]int
	}{
		{file: "hta-simple-add.json.gz", threads: 1, streams: []int64{7, 20},
			copies: map[string]Count{"H2D/pageable": {16, 244403360}},
			ops:    map[Op]int{OpCopy: 16, OpKernel: 79, OpMemset: 3, OpStreamSync: 16, OpStreamWait: 34, OpDeviceSync: 5}},
		{file: "hta-event-sync.json.gz", threads: 1, streams: []int64{7},
			copies: map[string]Count{"D2H/pageable": {1, 1}},
			ops: map[Op]int{OpCopy: 1, OpKernel: 4, OpEventRecord: 2, OpEventSync: 1, OpEventQuery: 1, OpStreamSync: 1,
				OpDeviceSync: 1}},
		{file: "hta-inference-rank0.json.gz", threads: 6, streams: []int64{7, 25, 27, 84, 285, 363},
			copies: map[string]Count{"H2D/pinned": {35, 253534084}, "H2D/pageable": {45, 6720}, "D2H/pageable": {30, 8600},
				"D2D/device": {1140, 14778918200}},
			noCall: 140,
			ops: map[Op]int{OpCopy: 1250, OpKernel: 5240, OpGraph: 70, OpMemset: 40, OpEventQuery: 25773, OpStreamSync: 75,
				OpStreamWait: 425, OpDeviceSync: 1}},
		{file: "hta-graph-window.json.gz", threads: 3, streams: []int64{7, 14, 15, 16},
			copies:   map[string]Count{"H2D/pinned": {25, 70646644}, "D2H/pageable": {5, 3960}, "D2D/device": {687, 3435313352}},
			inGraphs: 1, noCall: 335,
			ops: map[Op]int{OpCopy: 717, OpKernel: 771, OpGraph: 2, OpMemset: 46, OpEventQuery: 1253, OpStreamSync: 5, OpStreamWait: 25}},
		{file: "kineto-resnet50-workers0.json.gz", threads: 2, streams: []int64{7},
			copies: map[string]Count{"H2D/pageable": {12, 115607040}},
			ops: map[Op]int{OpCopy: 12, OpKernel: 8772, OpMemset: 312, OpEventRecord: 1596, OpEventQuery: 12, OpStreamSync: 12,
				OpDeviceSync: 1}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			tr, err := ReadFile(filepath.Join(testdata, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if len(tr.Threads) != tc.threads {
				t.Errorf("%d threads, want %d", len(tr.Threads), tc.threads)
			}
			if !equal(tr.Streams, tc.streams) {
				t.Errorf("streams %v, want %v", tr.Streams, tc.streams)
			}
			if got := CountCopies(tr.Copies); !mapsEqual(got, tc.copies) {
				t.Errorf("copies %v, want %v", got, tc.copies)
			}
			if len(tr.InGraphs) != tc.inGraphs || len(tr.NoCall) != tc.noCall {
				t.Errorf("%d copies in graphs, %d without a call; want %d, %d", len(tr.InGraphs), len(tr.NoCall), tc.inGraphs, tc.noCall)
			}
			ops := map[Op]int{}
			for _, th := range tr.Threads {
				last := int64(-1)
				for _, c := range th.Calls {
					ops[c.Op]++
					if c.StartNs < last {
						t.Fatalf("thread %s: calls out of order at %d ns", th.ID, c.StartNs)
					}
					last = c.StartNs
					if (c.Op == OpKernel || c.Op == OpCopy || c.Op == OpMemset) && c.Stream == NoStream {
						t.Errorf("thread %s: %s %s without its GPU stream", th.ID, c.API, c.Op)
					}
				}
			}
			if !mapsEqual(ops, tc.ops) {
				t.Errorf("ops %v, want %v", ops, tc.ops)
			}
			// the script replays every copy that has a call, nothing else
			var buf bytes.Buffer
			p, err := Script(&buf, tr, ScriptOptions{MaxGap: 100 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if !mapsEqual(p.Copies, tc.copies) || len(p.NotReplayed) != 0 {
				t.Errorf("script replays %v (not %v), want %v", p.Copies, p.NotReplayed, tc.copies)
			}
			if n := strings.Count(buf.String(), " copy "); n != len(tr.Copies) {
				t.Errorf("script has %d copy lines, want %d", n, len(tr.Copies))
			}
		})
	}
}

// CUPTI's sync records join their calls: a stream wait of hta-simple-add
// that CUPTI recorded says its stream, the event and the record's stream.
func TestSyncFacts(t *testing.T) {
	tr, err := ReadFile(filepath.Join(testdata, "hta-simple-add.json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	waits, known := 0, 0
	for _, c := range tr.Threads[0].Calls {
		if c.Op == OpStreamWait {
			waits++
			if c.Stream != NoStream && c.Event >= 0 && c.RecordStream != NoStream {
				known++
			}
		}
	}
	// 34 waits; CUPTI recorded 20 of them (cuda_sync "Stream Wait Event")
	if waits != 34 || known != 20 {
		t.Errorf("%d stream waits, %d with stream, event and the record's stream; want 34, 20", waits, known)
	}
}

// Gaps longer than MaxGap are cut, on every thread alike.
func TestScriptMaxGap(t *testing.T) {
	tr := &Trace{Name: "gaps", Streams: []int64{7}, Threads: []Thread{
		{ID: "a", Calls: []Call{{Op: OpDeviceSync, StartNs: 0}, {Op: OpDeviceSync, StartNs: 5e9}}},
		{ID: "b", Calls: []Call{{Op: OpDeviceSync, StartNs: 1000}, {Op: OpDeviceSync, StartNs: 5e9 + 1000}}},
	}}
	var buf bytes.Buffer
	p, err := Script(&buf, tr, ScriptOptions{MaxGap: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	want := "thread 2\n0 device_sync\n1001000 device_sync\n# thread b\nthread 2\n1000 device_sync\n1002000 device_sync\n"
	if !strings.Contains(buf.String(), want) || p.ShortenedNs != 5e9-1000-1e6 {
		t.Errorf("script\n%s\nshortened %d; want it to contain\n%s", buf.String(), p.ShortenedNs, want)
	}
}

// Bad input is an error naming the file and where, never a panic.
func TestBadInput(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"traceEvents": [`, "bad.json: line 1"},
		{`{"traceEvents": [{"ph":"X","cat":"kernel","name":"k","ts":1,"dur":1,"args":{"stream":7}}]}`,
			"bad.json: traceEvents[0] (kernel \"k\"): GPU event without a correlation id"},
		{`{"traceEvents": [{"ph":"X","cat":"gpu_memcpy","name":"Memcpy HtoD (Pinned -> Device)","ts":1,"args":{"correlation":3,"bytes":-4}}]}`,
			"negative bytes"},
		{`{"traceEvents": [{"ph":"X","cat":"gpu_memcpy","name":"Memset","ts":1,"args":{"correlation":3,"bytes":4}}]}`,
			"not a CUPTI copy name"},
		{`{"traceEvents": [{"ph":"X","cat":"cuda_runtime","name":"cudaMemcpyAsync","ts":"x1","args":{"correlation":3}}]}`,
			"not a time"},
		{`{"traceEvents": [{"ph":"X","cat":"cuda_runtime","name":"a","ts":1,"args":{"correlation":3}},
		  {"ph":"X","cat":"cuda_runtime","name":"b","ts":2,"args":{"correlation":3}}]}`, "traceEvents[1]"},
		{`{"foo": 1}`, "no traceEvents"},
		{`{"traceEvents": [{"ph":"X","cat":"cpu_op","name":"aten::add","ts":1}]}`, "no CUDA call to replay"},
		{`{"traceEvents": [{"ph":"X","cat":"kernel","name":"k","ts":1,"args":{"correlation":[1]}}]}`, "bad.json: traceEvents[0]: not a number"},
	} {
		_, err := Parse([]byte(tc.in), "bad.json")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%.60q) = %v, want an error containing %q", tc.in, err, tc.want)
		}
	}
	if _, err := ReadFile(filepath.Join(t.TempDir(), "missing.json")); err == nil || !strings.Contains(err.Error(), "missing.json") {
		t.Errorf("missing file: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "notgz.json.gz")
	os.WriteFile(bad, []byte("{}"), 0o644)
	if _, err := ReadFile(bad); err == nil || !strings.Contains(err.Error(), "notgz.json.gz") {
		t.Errorf("not gzip: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	for _, name := range []string{"hta-event-sync.json.gz"} {
		fh, err := os.Open(filepath.Join(testdata, name))
		if err != nil {
			f.Fatal(err)
		}
		gz, err := gzip.NewReader(fh)
		if err != nil {
			f.Fatal(err)
		}
		b, err := io.ReadAll(gz)
		fh.Close()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"traceEvents": [{"ph":"X","cat":"cuda_runtime","name":"cudaGraphLaunch","ts":1,"args":{"correlation":3}},` +
		`{"ph":"X","cat":"kernel","name":"k","ts":"2.5","dur":1,"args":{"correlation":3,"stream":"stream 7"}},` +
		`{"ph":"X","cat":"gpu_memcpy","name":"Memcpy DtoD (Device -> Device)","ts":4,"args":{"correlation":1,"stream":7,"bytes":9}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := Parse(data, "fuzz.json")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.json") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		if _, err := Script(io.Discard, tr, ScriptOptions{MaxGap: time.Millisecond}); err != nil && !strings.HasPrefix(err.Error(), "fuzz.json") {
			t.Fatalf("script error does not name the trace: %v", err)
		}
	})
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// A graph's replayed nodes keep their capture's correlation ids: a copy
// with no call belongs to the graph launch whose work last ran on its
// stream, unless a plain call's work came between; elsewhere its call
// preceded the trace.
func TestGraphOwnership(t *testing.T) {
	ev := func(cat, name string, corr, stream int, ts, dur, bytes int) string {
		return fmt.Sprintf(`{"ph":"X","cat":%q,"name":%q,"ts":%d,"dur":%d,"args":{"correlation":%d,"stream":%d,"bytes":%d}}`,
			cat, name, ts, dur, corr, stream, bytes)
	}
	rt := func(name string, corr, ts int) string {
		return fmt.Sprintf(`{"ph":"X","cat":"cuda_runtime","name":%q,"pid":1,"tid":1,"ts":%d,"dur":1,"args":{"correlation":%d}}`, name, ts, corr)
	}
	d2d := "Memcpy DtoD (Device -> Device)"
	events := []string{
		ev("gpu_memcpy", d2d, 1, 5, 5, 1, 100), // before any launch: its call preceded the trace
		rt("cudaGraphLaunch", 10, 10),
		ev("kernel", "k", 10, 5, 20, 5, 0),
		ev("gpu_memcpy", d2d, 2, 5, 26, 2, 200), // the graph's
		ev("gpu_memcpy", d2d, 3, 6, 27, 2, 300), // another stream: no call
		rt("cudaLaunchKernel", 11, 12),
		ev("kernel", "k", 11, 5, 30, 5, 0),
		ev("gpu_memcpy", d2d, 4, 5, 40, 2, 400), // after a plain launch's work: no call
	}
	tr, err := Parse([]byte(`{"traceEvents":[`+strings.Join(events, ",")+`]}`), "graphs.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.InGraphs) != 1 || tr.InGraphs[0].Bytes != 200 || len(tr.NoCall) != 3 {
		t.Fatalf("in graphs %v, no call %v; want the 200 B copy in the graph, three without a call", tr.InGraphs, tr.NoCall)
	}
	g := tr.Threads[0].Calls[0]
	if g.Op != OpGraph || g.Stream != 5 || g.GPUNs != 8000 || len(g.GraphCopies) != 1 {
		t.Errorf("graph launch %+v: want stream 5, 8 µs from its kernel to its copy's end, one copy", g)
	}
}

// The replay's ops are named as refpath/kvpath/replay.c reads them, in its
// order (ops[]): a script line names each by String.
func TestOpNamesAsReplayReadsThem(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "..", "refpath", "kvpath", "replay.c"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`ops\[\] = \{([^}]*)\}`).FindSubmatch(src)
	if m == nil {
		t.Fatal("replay.c: no ops[] table")
	}
	names := regexp.MustCompile(`"([a-z_]+)"`).FindAllSubmatch(m[1], -1)
	if len(names) != int(OpDeviceSync) {
		t.Fatalf("replay.c names %d ops, kineto has %d", len(names), OpDeviceSync)
	}
	for i, n := range names {
		if op := Op(i + 1); op.String() != string(n[1]) {
			t.Errorf("op %d is %q, replay.c reads %q", op, op, n[1])
		}
	}
	if Op(0).String() != "unknown" || (OpDeviceSync+1).String() != "unknown" {
		t.Error("an op outside the table has a name")
	}
}

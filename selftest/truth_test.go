package selftest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/event"
)

// Real ground truth written by the reference data path (refpath/kvpath).
func TestReadTruthSamples(t *testing.T) {
	cases := []struct {
		file            string
		calls, copies   int
		unknown, pinned int
		firstAPI        string
		lastOp          TruthOp
	}{
		{"api-coverage.jsonl", 70, 39, 0, 24, "cudaMallocHost", TruthOp(event.OpDeviceFree)},
		{"hicache-load-4layers.jsonl", 18, 4, 0, 4, "cudaHostRegister", TruthOp(event.OpHostUnregister)},
		{"late-attach.jsonl", 38, 33, 32, 0, "cudaHostRegister", TruthOp(event.OpHostUnregister)},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			path := filepath.Join("testdata", "truth", c.file)
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			calls, err := ReadTruth(f, path)
			if err != nil {
				t.Fatal(err)
			}
			copies, unknown, pinned := 0, 0, 0
			for _, tc := range calls {
				if tc.IsCopy() {
					copies++
					switch tc.ExpectHostMem {
					case "unknown":
						unknown++
					case "pinned":
						pinned++
					}
				}
			}
			if len(calls) != c.calls || copies != c.copies || unknown != c.unknown || pinned != c.pinned {
				t.Errorf("calls %d copies %d unknown %d pinned %d; want %d %d %d %d",
					len(calls), copies, unknown, pinned, c.calls, c.copies, c.unknown, c.pinned)
			}
			if calls[0].API != c.firstAPI || calls[len(calls)-1].Op != c.lastOp {
				t.Errorf("first api %s, last op %s", calls[0].API, calls[len(calls)-1].Op)
			}
		})
	}
}

func TestReadTruthErrors(t *testing.T) {
	good := `{"seq":1,"api":"cudaMemcpy","op":"copy","bytes":4}`
	cases := []struct{ name, in, want string }{
		{"no end line", good + "\n", "t.jsonl: no end line"},
		{"bad json", good + "\n{\"seq\":\n", "t.jsonl:2:"},
		{"count mismatch", good + "\n" + `{"end":true,"calls":2}` + "\n", "t.jsonl:2: end line says 2 calls, file has 1"},
		{"no api", `{"seq":1,"op":"copy"}` + "\n", "t.jsonl:1: call without api or op"},
		{"after end", good + "\n" + `{"end":true,"calls":1}` + "\n" + good + "\n", "t.jsonl:3: data after the end line"},
		{"wrong type", `{"seq":"x","api":"a","op":"copy"}` + "\n", "t.jsonl:1:"},
		{"unknown op", good + "\n" + `{"seq":2,"api":"cudaMemcpy","op":"copy3d"}` + "\n", `t.jsonl:2: unknown op "copy3d"`},
		{"empty op", `{"seq":1,"api":"cudaMemcpy","op":""}` + "\n", `t.jsonl:1: unknown op ""`},
		{"op as number", `{"seq":1,"api":"cudaMemcpy","op":1}` + "\n", "t.jsonl:1:"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadTruth(strings.NewReader(c.in), "t.jsonl")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err %v, want it to contain %q", err, c.want)
			}
		})
	}
}

func FuzzReadTruth(f *testing.F) {
	for _, name := range []string{"api-coverage.jsonl", "late-attach.jsonl"} {
		b, err := os.ReadFile(filepath.Join("testdata", "truth", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Add("{\"end\":true,\"calls\":0}\n")
	f.Fuzz(func(t *testing.T, in string) {
		calls, err := ReadTruth(strings.NewReader(in), "fuzz")
		if err == nil {
			for _, c := range calls {
				if c.API == "" || c.Op == 0 || c.Op.String() == "unknown" {
					t.Fatalf("accepted a call without api/op: %+v", c)
				}
			}
		} else if !strings.HasPrefix(err.Error(), "fuzz") {
			t.Fatalf("error does not name the file: %v", err)
		}
	})
}

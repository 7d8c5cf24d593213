package collectors

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// The shapes CUDA_VISIBLE_DEVICES takes, and what the CUDA driver keeps of
// each: the documented forms (indices, UUIDs, MIG devices; CUDA C
// Programming Guide) and the driver's edge cases as PyTorch's tests of its
// reimplementation record them (test/test_cuda_nvml_based_avail.py).
func TestParseVisibleDevices(t *testing.T) {
	for _, tc := range []struct {
		in      string
		indices []int
		uuids   []string
		mig     []string
		notes   int
	}{
		{in: "0", indices: []int{0}},
		{in: "0,1,2,3", indices: []int{0, 1, 2, 3}},
		{in: "2,1", indices: []int{2, 1}},                         // reordered
		{in: "0,2,-1,1", indices: []int{0, 2}, notes: 1},          // the guide's example
		{in: "1gpu2,2ampere", indices: []int{1, 2}},               // strtoul: the rest of an entry is ignored
		{in: "0, 1, 2, -1, 3", indices: []int{0, 1, 2}, notes: 1}, // blanks; a negative ends the list
		{in: "0, 1, 2, 1", notes: 1},                              // an index twice: no device
		{in: "2, +3, -0, 5", indices: []int{2, 3, 0, 5}},          // signs
		{in: "one,two,3,4", notes: 1},                             // nothing before the first non-index
		{in: "4,3,two,one", indices: []int{4, 3}, notes: 1},       // a word ends the list
		{in: "", notes: 1},                                        // set and empty: no device
		{in: "-1", notes: 1},                                      // the usual way to hide every GPU
		{in: "0,,1", indices: []int{0}, notes: 1},                 // an empty entry ends it
		{in: "99999999999999999999", notes: 1},                    // past any index
		{in: "GPU-9e8d35e3", uuids: []string{"GPU-9e8d35e3"}},     // a UUID prefix
		{in: "GPU-123, 2", uuids: []string{"GPU-123"}, notes: 1},  // indices after UUIDs are not read
		{in: "0,GPU-123", indices: []int{0}, notes: 1},            // nor UUIDs after indices
		{in: "GPU-9e8d35e3,GPU-9e8d35e3", notes: 1},               // a UUID twice
		{in: "MIG-89c850dc", mig: []string{"MIG-89c850dc"}},       // R470+ MIG device
		{in: "MIG-GPU-8932f937-d72c-4106-c12f-20bd9faed9f6/1/2", mig: []string{"MIG-GPU-8932f937-d72c-4106-c12f-20bd9faed9f6/1/2"}},
		{in: " GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1 , GPU-7c3c", uuids: []string{"GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1", "GPU-7c3c"}},
	} {
		got := ParseVisibleDevices(tc.in)
		if !reflect.DeepEqual(got.Indices, tc.indices) || !reflect.DeepEqual(got.UUIDs, tc.uuids) ||
			!reflect.DeepEqual(got.MIG, tc.mig) || len(got.Notes) != tc.notes {
			t.Errorf("ParseVisibleDevices(%q) = %+v, want indices %v uuids %v mig %v and %d notes", tc.in, got, tc.indices, tc.uuids, tc.mig, tc.notes)
		}
		for _, n := range got.Notes {
			if !strings.Contains(n, "CUDA_VISIBLE_DEVICES") {
				t.Errorf("%q: note %q does not name the variable", tc.in, n)
			}
		}
	}
}

func FuzzParseVisibleDevices(f *testing.F) {
	for _, s := range []string{"0", "0,2,-1,1", "1gpu2,2ampere", "GPU-9e8d35e3,GPU-1", "MIG-GPU-x/1/2", "", " +0, -0", "4,3,two"} {
		f.Add(s)
	}
	var gpus []CUDAGPU // the H100 SXM x8 capture's GPUs (thamada_H100SXMx8.nvidia-smi-q.txt)
	for i, u := range h100UUIDs {
		gpus = append(gpus, CUDAGPU{BusID: h100Bus[i], UUID: u, Model: "NVIDIA H100 80GB HBM3"})
	}
	f.Fuzz(func(t *testing.T, v string) {
		got := ParseVisibleDevices(v)
		forms := 0
		for _, n := range []int{len(got.Indices), len(got.UUIDs), len(got.MIG)} {
			if n > 0 {
				forms++
			}
		}
		if forms > 1 {
			t.Errorf("%q: more than one form kept: %+v", v, got)
		}
		seen := map[int]bool{}
		for _, i := range got.Indices {
			if i < 0 || seen[i] {
				t.Errorf("%q: index %d negative or repeated: %+v", v, i, got)
			}
			seen[i] = true
		}
		if len(got.Indices) > strings.Count(v, ",")+1 {
			t.Errorf("%q: %d indices from %d entries", v, len(got.Indices), strings.Count(v, ",")+1)
		}
		// Whatever it parses to, every ordinal names one of the host's GPUs or none.
		ords, _ := CUDAOrdinals(map[string]string{"CUDA_VISIBLE_DEVICES": v}, gpus)
		for _, o := range ords {
			if o != "" && !hasBus(gpus, o) {
				t.Errorf("%q: ordinal on %s, not a GPU of the host", v, o)
			}
		}
	})
}

func hasBus(gpus []CUDAGPU, bus string) bool {
	for _, g := range gpus {
		if g.BusID == bus {
			return true
		}
	}
	return false
}

// sampleGPUs is the host of an nvidia-smi -q capture, as NVML describes it.
func sampleGPUs(t *testing.T, file string) []CUDAGPU {
	var out []CUDAGPU
	for _, r := range smiQueryReadings(t, filepath.Join("testdata", "nvidia_smi_q", file)) {
		out = append(out, CUDAGPU{BusID: PCIAddress(r.BusID), UUID: r.UUID, Model: r.Name})
	}
	return out
}

func h100Host(t *testing.T) []CUDAGPU {
	gpus := sampleGPUs(t, "thamada_H100SXMx8.nvidia-smi-q.txt")
	for i, g := range gpus {
		if g.BusID != h100Bus[i] || g.UUID != h100UUIDs[i] {
			t.Fatalf("H100 capture GPU %d: %+v", i, g)
		}
	}
	return gpus
}

// The H100 SXM x8 capture's GPUs in PCI order (its nvidia-smi order too).
var (
	h100Bus   = []string{"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0", "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"}
	h100UUIDs = []string{"GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1", "GPU-7c3cadbd-17e5-0913-f69b-c618122ea0cd",
		"GPU-2d50cdf6-dd67-9f2e-855e-0d4d6d395a2f", "GPU-d1838e76-90e6-4408-711d-aeeaa2e1fd14",
		"GPU-72be6e5d-3c1b-0d37-98ac-d3ef159f2589", "GPU-52378fbc-3124-3895-13b6-1dd179563e0f",
		"GPU-83a5aebb-b71c-c570-aa83-185e1233fe97", "GPU-33135771-a848-ece1-b61e-489e221d663c"}
)

func TestCUDAOrdinals(t *testing.T) {
	h100 := h100Host(t)
	// NVML's order is not assumed to be CUDA's: give the GPUs reversed.
	rev := make([]CUDAGPU, len(h100))
	for i, g := range h100 {
		rev[len(h100)-1-i] = g
	}
	noUUID := make([]CUDAGPU, len(h100))
	for i, g := range h100 {
		noUUID[i] = CUDAGPU{BusID: g.BusID, Model: "10de:2330"} // sysfs alone: vendor:device
	}
	// Two captures' GPUs as one host (RTX 4060 Ti at 03 and 09, L4 at 01):
	// no capture has two models, the ordering rule needs them.
	mixed := append(sampleGPUs(t, "thamada_RTX4060Ti.nvidia-smi-q.txt"), sampleGPUs(t, "thamada_L4.nvidia-smi-q.txt")...)
	for _, tc := range []struct {
		name    string
		env     map[string]string
		gpus    []CUDAGPU
		want    []string
		noteHas string
	}{
		{"unset: every GPU, PCI order of one model", map[string]string{}, rev, h100Bus, "PCI bus order assumed"},
		{"PCI_BUS_ID", map[string]string{"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, rev, h100Bus, ""},
		{"a TP worker's single index", map[string]string{"CUDA_VISIBLE_DEVICES": "5"}, h100, []string{h100Bus[5]}, "assumed"},
		{"reordered indices", map[string]string{"CUDA_VISIBLE_DEVICES": "7,0,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, h100, []string{h100Bus[7], h100Bus[0], h100Bus[3]}, ""},
		{"index past the host ends the list", map[string]string{"CUDA_VISIBLE_DEVICES": "1,8,2"}, h100, []string{h100Bus[1]}, "this host has 8 GPUs"},
		{"UUIDs whatever the order", map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-33135771-a848-ece1-b61e-489e221d663c,GPU-b42dd28e"}, rev, []string{h100Bus[7], h100Bus[0]}, ""},
		{"UUID prefix matching two GPUs ends the list", map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-7c3c,GPU-"}, h100, []string{h100Bus[1]}, "matches 8 GPUs"},
		{"unknown UUID", map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-ffffffff"}, h100, nil, "matches no GPU"},
		{"a GPU named twice by two prefixes", map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-b42d,GPU-b42dd28e"}, h100, nil, "twice"},
		{"UUIDs without NVML: unknown", map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-b42dd28e,GPU-7c3c"}, noUUID, []string{"", ""}, "not known"},
		{"sysfs models, one of them", map[string]string{"CUDA_VISIBLE_DEVICES": "2"}, noUUID, []string{h100Bus[2]}, "10de:2330"},
		{"old MIG form names its GPU", map[string]string{"CUDA_VISIBLE_DEVICES": "MIG-GPU-52378fbc-3124-3895-13b6-1dd179563e0f/1/0,MIG-GPU-b42dd28e/2/0"}, h100, []string{h100Bus[5]}, ""},
		{"R470 MIG device: unknown", map[string]string{"CUDA_VISIBLE_DEVICES": "MIG-c6a0bc8e-d4a6-55ab-a4a2-9e8e3a3d2f10"}, h100, []string{""}, "MIG device"},
		{"FASTEST_FIRST over two models: indices unknown", map[string]string{"CUDA_VISIBLE_DEVICES": "0,2"}, mixed, []string{"", ""}, "different models"},
		{"... PCI_BUS_ID says", map[string]string{"CUDA_VISIBLE_DEVICES": "0,2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, mixed, []string{"0000:01:00.0", "0000:09:00.0"}, ""},
		{"... UUIDs say", map[string]string{"CUDA_VISIBLE_DEVICES": mixed[2].UUID}, mixed, []string{mixed[2].BusID}, ""},
		{"an order CUDA does not know", map[string]string{"CUDA_DEVICE_ORDER": "SLOWEST_FIRST", "CUDA_VISIBLE_DEVICES": "0"}, h100, []string{h100Bus[0]}, "not an order CUDA knows"},
		{"no GPU", map[string]string{"CUDA_VISIBLE_DEVICES": "0"}, nil, nil, "has 0 GPUs"},
		{"hidden", map[string]string{"CUDA_VISIBLE_DEVICES": "-1"}, h100, nil, "not a device index"},
	} {
		got, notes := CUDAOrdinals(tc.env, tc.gpus)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: ordinals %q, want %q (notes %q)", tc.name, got, tc.want, notes)
		}
		joined := strings.Join(notes, "; ")
		if tc.noteHas == "" && len(notes) > 0 && !strings.Contains(tc.name, "assumed") {
			t.Errorf("%s: unexpected notes %q", tc.name, notes)
		}
		if tc.noteHas != "" && !strings.Contains(joined, tc.noteHas) {
			t.Errorf("%s: notes %q lack %q", tc.name, notes, tc.noteHas)
		}
	}
}

func TestComparePCI(t *testing.T) {
	in := []string{"0000:db:00.0", "10000:01:00.0", "0000:18:00.0", "0001:00:02.0", "0000:18:00.1", "junk", "0000:9a:00.0"}
	want := []string{"0000:18:00.0", "0000:18:00.1", "0000:9a:00.0", "0000:db:00.0", "0001:00:02.0", "10000:01:00.0", "junk"}
	got := append([]string(nil), in...)
	for i := range got { // insertion sort with the comparator under test
		for j := i; j > 0 && comparePCI(got[j-1], got[j]) > 0; j-- {
			got[j-1], got[j] = got[j], got[j-1]
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("PCI order %q, want %q", got, want)
	}
}

package correlate

import (
	"strings"
	"testing"
)

func TestStorageFarPool(t *testing.T) {
	base := func(devNode int, byNode map[int]uint64) StorageLanding {
		return StorageLanding{PID: 7, Device: "nvme0n1", DeviceBDF: "0000:3d:00.0", DeviceNode: devNode,
			Pool: "registered pool", ByNode: byNode, Reads: 64, Sides: twoSockets.NodeSide}
	}
	sibling := base(5, map[int]uint64{4: 1 << 30})
	sibling.Sides = nps4.NodeSide
	unknown := base(1, map[int]uint64{0: 1 << 30})
	unknown.Sides = nil
	cases := []struct {
		name string
		in   StorageLanding
		want Severity
		says string
	}{
		{"pool on the device's node", base(0, map[int]uint64{0: 1 << 30}), "", ""},
		{"pool on the far node", base(1, map[int]uint64{0: 1 << 30}), SevWarn, "100% of the bytes pid 7 read from nvme0n1 (node 1)"},
		{"interleaved evenly: half crosses, not most", base(0, map[int]uint64{0: 64 << 20, 1: 64 << 20}), "", ""},
		{"far but under 8 MiB", base(1, map[int]uint64{0: 4 << 20}), "", ""},
		{"device node unknown", base(-1, map[int]uint64{0: 1 << 30}), "", ""},
		{"nothing located", StorageLanding{PID: 7, Device: "nvme0n1", DeviceBDF: "0000:3d:00.0", DeviceNode: 1, Unknown: 1 << 30}, "", ""},
		{"no PCI function", StorageLanding{PID: 7, Device: "vda", DeviceNode: 1, ByNode: map[int]uint64{0: 1 << 30}}, "", ""},
		{"NPS4 sibling node", sibling, SevInfo, "on sibling nodes of node 5's socket"},
		{"layout unknown", unknown, SevInfo, "cannot be told"},
	}
	for _, c := range cases {
		f := StorageFarPool(c.in)
		if (f != nil) != (c.want != "") || f != nil && f.Severity != c.want {
			t.Errorf("%s: %+v, want severity %q", c.name, f, c.want)
			continue
		}
		if f == nil {
			continue
		}
		if f.Rule != "storage-far-pool" || !strings.Contains(f.Summary, c.says) || !strings.Contains(strings.Join(f.Evidence, "|"), "GiB") {
			t.Errorf("%s: %+v", c.name, f)
		}
	}
}

func TestStorageSharedUplink(t *testing.T) {
	const gb = 1e9
	up := func(capacity, storage, gpu float64) Uplink {
		return Uplink{Switch: "0000:18:00.0", Direction: "up", CapacityBps: capacity, Capacity: "Gen4 x16",
			Storage: map[string]float64{"nvme0n1": storage}, GPUs: map[string]float64{"0000:1b:00.0": gpu}}
	}
	cases := []struct {
		name string
		in   Uplink
		fire bool
	}{
		{"sum near capacity, both sides", up(25*gb, 6*gb, 16*gb), true},
		{"sum well under", up(25*gb, 3*gb, 10*gb), false},
		{"GPU alone fills it, disk idle", up(25*gb, 0.5*gb, 24*gb), false},
		{"capacity unknown", up(0, 6*gb, 16*gb), false},
	}
	for _, c := range cases {
		f := StorageSharedUplink(c.in)
		if (f != nil) != c.fire {
			t.Errorf("%s: fired %v, want %v (%+v)", c.name, f != nil, c.fire, f)
			continue
		}
		if f != nil && (f.Rule != "storage-shared-uplink" || !strings.Contains(f.Summary, "storage reads and GPU D2H") ||
			!strings.Contains(f.Summary, "88% of its 25.00 GB/s up")) {
			t.Errorf("%s: %+v", c.name, f)
		}
	}
}

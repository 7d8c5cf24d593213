package probes

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/internal/testenv"
)

// The allocator rows (docs/design.md, "Late attach"): one per entry point
// NVIDIA's 535 and 550 drivers export, each reporting at return; the
// runtime forms for the runtime layer.
func TestMemoryRows(t *testing.T) {
	want := map[string]event.Op{
		"cuMemAllocManaged": event.OpManagedAlloc, "cudaMallocManaged": event.OpManagedAlloc,
		"cuMemAllocAsync": event.OpDeviceAlloc, "cuMemAllocAsync_ptsz": event.OpDeviceAlloc,
		"cudaMallocAsync": event.OpDeviceAlloc, "cudaMallocAsync_ptsz": event.OpDeviceAlloc,
		"cuMemAllocFromPoolAsync": event.OpPoolAlloc, "cuMemAllocFromPoolAsync_ptsz": event.OpPoolAlloc,
		"cudaMallocFromPoolAsync": event.OpPoolAlloc, "cudaMallocFromPoolAsync_ptsz": event.OpPoolAlloc,
		"cuMemFreeAsync": event.OpDeviceFree, "cuMemFreeAsync_ptsz": event.OpDeviceFree,
		"cudaFreeAsync": event.OpDeviceFree, "cudaFreeAsync_ptsz": event.OpDeviceFree,
		"cuMemPoolCreate": event.OpPoolCreate, "cudaMemPoolCreate": event.OpPoolCreate,
		"cuMemPoolDestroy": event.OpPoolDestroy, "cudaMemPoolDestroy": event.OpPoolDestroy,
		"cuMemCreate": event.OpMemCreate, "cuMemRelease": event.OpMemRelease,
		"cuMemAddressReserve": event.OpAddressReserve, "cuMemAddressFree": event.OpAddressFree,
		"cuMemMap": event.OpMemMap, "cuMemUnmap": event.OpMemUnmap,
		"cuMemGetHandleForAddressRange": event.OpDmabufExport,
	}
	for sym, op := range want {
		c, ok := Template(sym)
		if !ok || c.Op != op || !c.Returns || (c.Layer == event.LayerDriver) == strings.HasPrefix(sym, "cuda") {
			t.Errorf("%s: %+v, %v", sym, c, ok)
		}
	}
	for _, p := range Table {
		if p.Op.IsMemory() && want[p.Symbol] == 0 {
			t.Errorf("memory row %s not checked here", p.Symbol)
		}
	}
	// The runtime names the driver rows report a copy's allocations under.
	for sym, rt := range map[string]string{"cuMemAllocAsync_ptsz": "cudaMallocAsync_ptsz", "cuMemAllocManaged": "cudaMallocManaged",
		"cuMemFreeAsync": "cudaFreeAsync", "cuMemPoolCreate": "cudaMemPoolCreate", "cuMemCreate": ""} {
		if c, _ := Template(sym); c.RuntimeAPI != rt {
			t.Errorf("%s: runtime %q, want %q", sym, c.RuntimeAPI, rt)
		}
	}
}

// What the allocator rows decode to: out values through the out pointer
// into Ptr or Handle, the location lw_prop_enter read, a dma-buf fd.
func TestDecodeMemoryCalls(t *testing.T) {
	var c event.Call
	dec := func(sym string, args [9]uint64, out uint64) {
		t.Helper()
		if err := Decode(rawEvent(rowOf(t, sym), args, out, 0), &c); err != nil {
			t.Fatal(err)
		}
	}
	loc := func(typ uint32, id int32) uint64 { return uint64(typ) | uint64(uint32(id))<<32 }
	// cuMemCreate(&h, 2 MiB, &prop, 0), prop on host NUMA node 1: the handle comes back through arg 0
	a := [9]uint64{0x7ffd_1000, 2 << 20, 0x7ffd_2000}
	a[lanewatchLwPropArgLW_PROP_LOCATION] = loc(event.LocHostNUMA, 1)
	dec("cuMemCreate", a, 0xabc0)
	if c.Op != event.OpMemCreate || c.Handle != 0xabc0 || c.Size != 2<<20 || c.Ptr != 0 ||
		c.Location != (event.Location{Type: event.LocHostNUMA, ID: 1}) || c.Location.Kind() != event.MemPinned {
		t.Errorf("cuMemCreate: %+v", c)
	}
	// a location that could not be read is invalid: unknown
	a[lanewatchLwPropArgLW_PROP_LOCATION] = 0
	dec("cuMemPoolCreate", a, 0x5000)
	if c.Op != event.OpPoolCreate || c.Handle != 0x5000 || c.Location.Kind() != event.MemUnknown {
		t.Errorf("cuMemPoolCreate: %+v", c)
	}
	// cuMemMap(ptr, size, offset, handle, flags)
	dec("cuMemMap", [9]uint64{0x7d00_0000_0000, 4 << 20, 2 << 20, 0xabc0, 0}, 0)
	if c.Ptr != 0x7d00_0000_0000 || c.Size != 4<<20 || c.Offset != 2<<20 || c.Handle != 0xabc0 {
		t.Errorf("cuMemMap: %+v", c)
	}
	// cuMemAllocFromPoolAsync_ptsz(&p, size, pool, stream)
	dec("cuMemAllocFromPoolAsync_ptsz", [9]uint64{0x7ffd_3000, 1 << 20, 0x5000, 0x77}, 0x7b00_0000_0000)
	if c.Ptr != 0x7b00_0000_0000 || c.Size != 1<<20 || c.Handle != 0x5000 || c.Stream != 0x77 || !c.PerThread {
		t.Errorf("cuMemAllocFromPoolAsync_ptsz: %+v", c)
	}
	// cuMemGetHandleForAddressRange(&fd, dptr, size, DMA_BUF_FD, 0): the int the program read
	dec("cuMemGetHandleForAddressRange", [9]uint64{0x7ffd_4000, 0x7e00_0000_0000, 8 << 20, 1, 0}, 9)
	if c.Op != event.OpDmabufExport || c.Handle != 9 || c.Ptr != 0x7e00_0000_0000 || c.Size != 8<<20 || c.Flags != 1 {
		t.Errorf("cuMemGetHandleForAddressRange: %+v", c)
	}
	// ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access): the MR at return, keys at its +36
	if err := Decode(rawEvent(rowOf(t, "ibv_reg_dmabuf_mr"), [9]uint64{0x1, 2 << 20, 4 << 20, 0x10_0000, 9, 7}, 0x22_0000_0021, 0x4000), &c); err != nil {
		t.Fatal(err)
	}
	if !c.RDMA.Dmabuf || c.Handle != 9 || c.Offset != 2<<20 || c.Size != 4<<20 || c.Ptr != 0x10_0000 || c.Flags != 7 ||
		c.RDMA.MR != 0x4000 || c.RDMA.LKey != 0x21 || c.RDMA.RKey != 0x22 {
		t.Errorf("ibv_reg_dmabuf_mr: %+v", c)
	}
	if err := Decode(rawEvent(rowOf(t, "ibv_reg_mr_iova2"), [9]uint64{0x1, 0x9000, 4096, 0x9000, 7}, 0, 0x4000), &c); err != nil || c.RDMA.Dmabuf {
		t.Errorf("ibv_reg_mr_iova2 is no dma-buf region: %+v %v", c, err)
	}
}

// The cookie: the out pointer of a row whose out value is a handle is its
// Handle argument; only the dma-buf export reads 4 bytes there; the
// properties rows read their last argument (lw_prop_enter).
func TestCookieMemoryRows(t *testing.T) {
	outArg := func(c uint64) int { return int(c>>lanewatchLwCookieShiftLW_COOKIE_OUTARG_SHIFT&0xff) - 1 }
	outInt := uint64(1) << lanewatchLwCookieShiftLW_COOKIE_OUTINT_SHIFT
	for id, p := range Table {
		c := Cookie(id, 0)
		switch {
		case p.OutHandle && outArg(c) != p.Args.Handle, p.Out && outArg(c) != p.Args.Ptr, !p.Out && !p.OutHandle && outArg(c) != -1:
			t.Errorf("row %d %s: out argument %d", id, p.Symbol, outArg(c))
		}
		if got := c&outInt != 0; got != (p.Symbol == "cuMemGetHandleForAddressRange") || got != p.OutInt {
			t.Errorf("row %d %s: OUTINT %v", id, p.Symbol, got)
		}
		if p.Out && p.OutHandle {
			t.Errorf("row %d %s: one out pointer only", id, p.Symbol)
		}
		if p.Program == ProgProp && p.Op != event.OpMemCreate && p.Op != event.OpPoolCreate {
			t.Errorf("row %d %s reads a CUmemLocation", id, p.Symbol)
		}
	}
}

// lw_prop_enter reads CUmemLocation at byte LW_PROP_LOCATION_OFF of
// CUmemAllocationProp and CUmemPoolProps: checked against the reference's
// declarations (refcuda.h), and NVIDIA's cuda.h 12.4 and 11.8 where
// scripts/nvidia/gen-errors.sh cached them.
func TestPropLocationLayout(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	const src = `#include <stddef.h>
#include <stdio.h>
#include HEADER
int main(void) {
	printf("%zu %zu %zu %zu\n", offsetof(CUmemAllocationProp, location), offsetof(CUmemPoolProps, location),
	       offsetof(CUmemLocation, id), sizeof(CUmemLocationType));
	return 0;
}
`
	headers := map[string]string{"refcuda.h": filepath.Join(root, "refpath", "include", "refcuda.h")}
	cached, _ := filepath.Glob(filepath.Join(root, ".cache", "nvidia", "headers", "nvidia-cuda-dev-*", "cuda.h"))
	for _, h := range cached {
		headers[filepath.Base(filepath.Dir(h))] = h
	}
	if len(cached) == 0 {
		t.Log("no NVIDIA cuda.h cached (scripts/nvidia/gen-errors.sh): checked against refcuda.h only")
	}
	off := strconv.Itoa(int(lanewatchLwPropArgLW_PROP_LOCATION_OFF))
	want := []string{off, off, "4", "4"}
	for name, h := range headers {
		dir := t.TempDir()
		c := filepath.Join(dir, "layout.c")
		if err := os.WriteFile(c, []byte(strings.Replace(src, "HEADER", `"`+h+`"`, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		bin := filepath.Join(dir, "layout")
		if out, err := exec.Command("gcc", "-o", bin, c).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, out)
		}
		out, err := exec.Command(bin).Output()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := strings.Fields(string(out)); strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s: location at %v, want %v", name, got, want)
		}
	}
}

// On the reference driver, under the real programs: lw_prop_enter reads
// where cuMemCreate's and cudaMemPoolCreate's memory will live (a device
// and a host NUMA node), and the dma-buf fd cuMemGetHandleForAddressRange
// wrote is read whole, as the int it is (kvpath vmm-pool-managed reports it).
func TestMemoryProbesOnReference(t *testing.T) {
	testenv.RequireRoot(t)
	ref := testenv.RefDir(t)
	p, err := Load(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	lib := filepath.Join(ref, "lib", "libcuda.so.1")
	syms, err := LookupSymbols(lib, []string{"cuMemCreate", "cuMemPoolCreate", "cuMemGetHandleForAddressRange", "cuMemMap", "cuMemAllocManaged"})
	if err != nil || len(syms) != 5 {
		t.Fatalf("%s: %v %v", lib, syms, err)
	}
	if _, err := p.AttachFile(FileID{Inode: 1}, lib, syms, 0); err != nil {
		t.Fatal(err)
	}
	stop := collect(t, p)
	truth := filepath.Join(t.TempDir(), "truth.jsonl")
	cmd := exec.Command(filepath.Join(ref, "bin", "kvpath"), "--scenario", "vmm-pool-managed", "--truth", truth)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kvpath: %v\n%s", err, out)
	}
	got := stop()
	var end struct {
		End      bool `json:"end"`
		DmabufFD *int `json:"dmabuf_fd"`
	}
	f, err := os.Open(truth)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for sc := bufio.NewScanner(f); sc.Scan(); {
		json.Unmarshal(sc.Bytes(), &end)
	}
	if !end.End || end.DmabufFD == nil {
		t.Fatalf("no end line with the fd in %s", truth)
	}
	pid := uint32(cmd.Process.Pid)
	var locs []event.Location
	var fds []uint64
	maps, managed := 0, 0
	for _, c := range got {
		if c.PID != pid || c.Failed() {
			continue
		}
		switch c.Op {
		case event.OpMemCreate, event.OpPoolCreate:
			if c.Handle == 0 {
				t.Errorf("%s: no handle", c.Symbol)
			}
			locs = append(locs, c.Location)
		case event.OpDmabufExport:
			fds = append(fds, c.Handle)
		case event.OpMemMap:
			maps++
		case event.OpManagedAlloc:
			managed++
		}
	}
	want := []event.Location{{Type: event.LocDevice, ID: 0}, {Type: event.LocHostNUMA, ID: 0}, {Type: event.LocHostNUMA, ID: 0}}
	if len(locs) != 3 || locs[0] != want[0] || locs[1] != want[1] || locs[2] != want[2] {
		t.Errorf("locations %+v, want %+v (device and host cuMemCreate, host pool)", locs, want)
	}
	if len(fds) != 1 || fds[0] != uint64(*end.DmabufFD) {
		t.Errorf("dma-buf fds %v, want [%d]", fds, *end.DmabufFD)
	}
	// (Drops are not judged: the probes are on a library other tests'
	// processes may be inside of when they attach.)
	if maps != 2 || managed != 1 {
		t.Errorf("%d maps, %d managed allocations; want 2, 1", maps, managed)
	}
}

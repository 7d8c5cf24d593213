package collectors

import (
	"errors"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lanewatch/lanewatch/probes"
)

// sink keeps a test read from being optimised away.
var sink atomic.Int32

// onlineNodes reads the host's node list; every node move_pages reports must
// be one of them.
func onlineNodes(t *testing.T) map[int]bool {
	t.Helper()
	h, err := ReadHostFacts(HostConfig{SysRoot: "/sys"})
	if err != nil {
		t.Fatal(err)
	}
	m := map[int]bool{}
	for _, n := range h.NodesOnline {
		m[n] = true
	}
	return m
}

// needMovePages skips on a kernel without NUMA outside CI; under CI=true the
// test must run.
func needMovePages(t *testing.T, err error) {
	t.Helper()
	if IsNoNUMA(err) && os.Getenv("CI") != "true" {
		t.Skipf("kernel without move_pages: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func mmapTest(t *testing.T, pages int, flags int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, pages*os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|flags)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

func TestNodesOfPagesSelf(t *testing.T) {
	nodes := onlineNodes(t)
	ps := os.Getpagesize()
	pop := mmapTest(t, 64, unix.MAP_POPULATE)
	lazy := mmapTest(t, 4, 0)
	gone := mmapTest(t, 1, 0)
	goneAddr := uintptr(unsafe.Pointer(&gone[0]))
	if err := unix.Munmap(gone); err != nil {
		t.Fatal(err)
	}
	sink.Store(int32(lazy[ps])) // a read maps the shared zero page

	var addrs []uintptr
	for i := range 64 {
		addrs = append(addrs, uintptr(unsafe.Pointer(&pop[i*ps])))
	}
	addrs = append(addrs, uintptr(unsafe.Pointer(&lazy[0])), uintptr(unsafe.Pointer(&lazy[ps])), goneAddr)
	for _, pid := range []int{0, os.Getpid()} {
		st, err := NodesOfPages(pid, addrs)
		needMovePages(t, err)
		for i := range 64 {
			if st[i] < 0 || !nodes[st[i]] {
				t.Fatalf("pid %d page %d: status %d, want an online node %v", pid, i, st[i], nodes)
			}
		}
		if got := st[64:]; !reflect.DeepEqual(got, []int{PageNotPresent, PageNotMapped, PageNotMapped}) {
			t.Errorf("pid %d untouched, zero page, unmapped: %v, want [%d %d %d]", pid, got, PageNotPresent, PageNotMapped, PageNotMapped)
		}
	}
	if st, err := NodesOfPages(0, nil); err != nil || len(st) != 0 {
		t.Errorf("no pages: %v %v", st, err)
	}
}

func TestNodesOfPagesNoSuchPid(t *testing.T) {
	// Above any pid_max (at most 4M), so it cannot exist.
	_, err := NodesOfPages(1<<30, []uintptr{0x1000})
	if IsNoNUMA(err) && os.Getenv("CI") != "true" {
		t.Skip(err)
	}
	if !errors.Is(err, unix.ESRCH) || !strings.Contains(err.Error(), "move_pages pid 1073741824") {
		t.Errorf("error %v, want ESRCH naming the pid", err)
	}
}

func TestRangeNodesSelf(t *testing.T) {
	nodes := onlineNodes(t)
	ps := uint64(os.Getpagesize())
	b := mmapTest(t, 256, 0)
	for i := 0; i < 128; i++ { // touch the first half
		b[uint64(i)*ps] = 1
	}
	start := uint64(uintptr(unsafe.Pointer(&b[0])))
	p, err := RangeNodes(0, start, start+256*ps, 0)
	needMovePages(t, err)
	var onNodes uint64
	for n, c := range p.ByNode {
		if !nodes[n] {
			t.Errorf("node %d not online", n)
		}
		onNodes += c
	}
	if onNodes != 128 || p.NoNode[unix.ENOENT] != 128 || p.Pages != 256 || p.Queried != 256 || p.Sampled() {
		t.Errorf("got %+v", p)
	}

	// numa_maps agrees: the same VMA, read through procfs, holds 128
	// resident pages on the same nodes (if the kernel did not merge it with
	// a neighbour, which would only make the answer approximate).
	rp := livePagesByNode(t, os.Getpid(), start, start+256*ps)
	if !rp.Approximate && !reflect.DeepEqual(rp.Pages, p.ByNode) {
		t.Errorf("numa_maps %+v, move_pages %v", rp, p.ByNode)
	}

	// A range above the bound is sampled evenly.
	big := mmapTest(t, maxQueryPages*2+3, 0)
	bs := uint64(uintptr(unsafe.Pointer(&big[0])))
	p, err = RangeNodes(0, bs+1, bs+uint64(len(big)), 0)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Sampled() || p.Stride != 3 || p.Pages != maxQueryPages*2+3 || p.Queried != (p.Pages+2)/3 || p.NoNode[unix.ENOENT] != p.Queried {
		t.Errorf("sampled: %+v", p)
	}

	for _, bad := range [][3]uint64{{start, start, 0}, {start + 1, start, 0}, {start, start + 1, 3000}} {
		if _, err := RangeNodes(0, bad[0], bad[1], bad[2]); err == nil {
			t.Errorf("RangeNodes%v: no error", bad)
		}
	}
}

// Another process: the stack of a child, found through its maps.
func TestRangeNodesChild(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep binary: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var stack probes.Mapping
	for range 200 { // wait for exec to replace the forked image
		ms, err := probes.ReadMaps("/proc", cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if m.Path == "[stack]" {
				stack = m
			}
		}
		if exe, _ := os.Readlink("/proc/" + itoa(cmd.Process.Pid) + "/exe"); strings.HasSuffix(exe, "sleep") && stack.End != 0 {
			break
		}
		unix.Nanosleep(&unix.Timespec{Nsec: 5e6}, nil)
	}
	if stack.End == 0 {
		t.Fatal("child has no [stack]")
	}
	p, err := RangeNodes(cmd.Process.Pid, stack.Start, stack.End, 0)
	needMovePages(t, err)
	var resident uint64
	for _, c := range p.ByNode {
		resident += c
	}
	if resident == 0 {
		t.Errorf("child stack has no resident page: %+v", p)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

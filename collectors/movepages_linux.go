package collectors

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Page status values from NodesOfPages that are not node numbers. The kernel
// reports a page without a node as -errno.
const (
	// PageNotPresent (-ENOENT): the address is mapped but no page is resident
	// (never touched, swapped out), or it is device memory (ZONE_DEVICE).
	PageNotPresent = -int(unix.ENOENT)
	// PageNotMapped (-EFAULT): no VMA covers the address, or the address maps
	// the shared zero page (read but never written).
	PageNotMapped = -int(unix.EFAULT)
)

// NodesOfPages returns, for each address, the NUMA node of the page that holds
// it in process pid (0: this process), using move_pages(2) with a NULL node
// list, which only queries and moves nothing. A value ≥ 0 is a node; a
// negative value is -errno for that page (PageNotPresent, PageNotMapped, or
// another errno the kernel may add). Querying another process needs the same
// rights as ptrace read access (root, or same user without Yama).
// The error is for the call as a whole: ESRCH when pid does not exist, EPERM,
// ENOSYS on a kernel built without NUMA or page migration.
func NodesOfPages(pid int, addrs []uintptr) ([]int, error) {
	if len(addrs) == 0 {
		return []int{}, nil
	}
	status := make([]int32, len(addrs))
	_, _, errno := unix.Syscall6(unix.SYS_MOVE_PAGES,
		uintptr(pid), uintptr(len(addrs)),
		uintptr(unsafe.Pointer(&addrs[0])), 0, // nodes == NULL: query only
		uintptr(unsafe.Pointer(&status[0])), 0)
	runtime.KeepAlive(addrs)
	if errno != 0 {
		return nil, fmt.Errorf("move_pages pid %d (%d pages): %w", pid, len(addrs), errno)
	}
	out := make([]int, len(status))
	for i, s := range status {
		out[i] = int(s)
	}
	return out, nil
}

// maxQueryPages bounds one RangeNodes call: 1<<16 pages is 256 MiB of 4 KiB
// pages, a few milliseconds in the kernel. Larger ranges are sampled.
const maxQueryPages = 1 << 16

// PageNodes is the per-page placement of an address range, from move_pages.
type PageNodes struct {
	// ByNode counts queried pages per node.
	ByNode map[int]uint64
	// NoNode counts queried pages without a node, by errno
	// (unix.ENOENT: not resident; unix.EFAULT: not mapped or zero page).
	NoNode map[unix.Errno]uint64
	// Pages is the number of pages in the range, Queried how many were asked.
	Pages, Queried uint64
	// Stride is the distance in pages between queried pages: 1 when every
	// page was queried; above 1 the counts are a sample (every Stride-th page
	// from the first), so compare fractions, or scale by Stride.
	Stride uint64
}

// Sampled reports whether only some pages were queried.
func (p PageNodes) Sampled() bool { return p.Stride > 1 }

// RangeNodes queries the node of the pages of [start, end) in process pid
// (0: this process). pageSize 0 means the base page size; for a hugetlb
// range pass its page size so that each huge page is asked once. At most
// 1<<16 pages are queried, evenly spaced (see PageNodes.Stride).
func RangeNodes(pid int, start, end uint64, pageSize uint64) (PageNodes, error) {
	if pageSize == 0 {
		pageSize = uint64(os.Getpagesize())
	}
	if pageSize&(pageSize-1) != 0 {
		return PageNodes{}, fmt.Errorf("page size %d is not a power of two", pageSize)
	}
	if start >= end {
		return PageNodes{}, fmt.Errorf("empty range %#x-%#x", start, end)
	}
	first := start &^ (pageSize - 1)
	pages := (end-first-1)/pageSize + 1
	stride := (pages + maxQueryPages - 1) / maxQueryPages
	addrs := make([]uintptr, 0, (pages+stride-1)/stride)
	for i := uint64(0); i < pages; i += stride {
		addrs = append(addrs, uintptr(first+i*pageSize))
	}
	st, err := NodesOfPages(pid, addrs)
	if err != nil {
		return PageNodes{}, err
	}
	p := PageNodes{ByNode: map[int]uint64{}, NoNode: map[unix.Errno]uint64{}, Pages: pages, Queried: uint64(len(addrs)), Stride: stride}
	for _, s := range st {
		if s >= 0 {
			p.ByNode[s]++
		} else {
			p.NoNode[unix.Errno(-s)]++
		}
	}
	return p, nil
}

// IsNoNUMA reports whether err from NodesOfPages means the kernel has no
// NUMA support (every page is then on node 0).
func IsNoNUMA(err error) bool { return errors.Is(err, unix.ENOSYS) }

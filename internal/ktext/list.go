package ktext

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// maxListID bounds the ids a CPU or node list may name. The kernel's NR_CPUS
// tops out at 8192 and MAX_NUMNODES at 1024; the margin keeps future hosts
// parseable while a hostile "0-4294967295" cannot make us allocate gigabytes.
const maxListID = 1<<16 - 1

// ParseList parses the kernel's list format ("0-3,8-11", "0", ""), as in
// Cpus_allowed_list, Mems_allowed_list, the nodelist of a numa_maps policy
// and sysfs files such as devices/system/cpu/online. It returns the ids
// sorted and without duplicates; the empty list (an offline mask is often
// empty) gives an empty, non-nil slice. Surrounding white space, including
// the trailing newline of a sysfs file, is ignored. Ids above 65535 are an
// error.
func ParseList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	ids := []int{}
	if s == "" {
		return ids, nil
	}
	var set [(maxListID + 1) / 64]uint64
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := parseListID(lo)
		if err != nil {
			return nil, fmt.Errorf("list %q: %w", s, err)
		}
		b := a
		if isRange {
			if b, err = parseListID(hi); err != nil {
				return nil, fmt.Errorf("list %q: %w", s, err)
			}
			if b < a {
				return nil, fmt.Errorf("list %q: range %q runs backwards", s, part)
			}
		}
		for i := a; i <= b; i++ {
			set[i/64] |= 1 << (i % 64)
		}
	}
	for w, word := range set {
		for word != 0 {
			ids = append(ids, w*64+bits.TrailingZeros64(word))
			word &= word - 1
		}
	}
	return ids, nil
}

// parseListID accepts decimal digits only: strconv.Atoi would also take a
// sign, and "+1" or "-0" are not ids the kernel writes.
func parseListID(s string) (int, error) {
	if s == "" {
		return 0, fmt.Errorf("empty id")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("id %q is not a decimal number", s)
		}
	}
	v, err := strconv.Atoi(s)
	if err != nil || v > maxListID {
		return 0, fmt.Errorf("id %q out of range 0-%d", s, maxListID)
	}
	return v, nil
}

// FormatList writes ids (sorted, unique) back in the kernel's list format;
// evidence strings quote lists this way so they read like the files.
func FormatList(ids []int) string {
	var b strings.Builder
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(ids[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(ids[j]))
		}
		i = j + 1
	}
	return b.String()
}

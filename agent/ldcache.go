package agent

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime"
)

// The dynamic linker's cache (/etc/ld.so.cache, written by ldconfig): how
// ld.so resolves a library name such as libcuda.so.1 when no
// LD_LIBRARY_PATH or RUNPATH names it. glibc's format (elf/cache.c,
// sysdeps/generic/dl-cache.h): since 2.32 only the "new" format, before
// it the old one followed by the new one, which is the one read here.
const (
	ldCacheMagicNew = "glibc-ld.so.cache1.1"
	ldCacheMagicOld = "ld.so-1.7.0"
	ldCacheHeader   = 48 // magic, nlibs, len_strings, flags (+3), extension_offset, unused[3]
	ldCacheEntry    = 24 // flags, key, value, osversion, hwcap
	ldCacheOldEntry = 12 // flags, key, value

	ldFlagTypeMask   = 0x00ff
	ldFlagELFLibc6   = 0x0003
	ldFlagArchMask   = 0xff00
	ldFlagX8664Lib64 = 0x0300
	ldFlagAArch64    = 0x0a00

	ldEndianLittle = 2 // cache_file_new_flags_endian_little; 0: unset (little, written before 2.33)
	ldEndianMask   = 3
)

// LDCacheEntry is one library of the cache: the name a program asks for
// and the path ld.so opens for it.
type LDCacheEntry struct {
	Name  string
	Path  string
	Flags int32  // ELF class and architecture (FLAG_* of dl-cache.h)
	HWCap uint64 // hardware capabilities subdirectory, 0 for none
}

// nativeLibc6 says whether an entry is a library this machine's ld.so
// (64-bit glibc of the agent's architecture) would load.
func (e LDCacheEntry) nativeLibc6() bool {
	want := map[string]int32{"amd64": ldFlagX8664Lib64, "arm64": ldFlagAArch64}[runtime.GOARCH]
	return e.Flags&ldFlagTypeMask == ldFlagELFLibc6 && want != 0 && e.Flags&ldFlagArchMask == want
}

// ParseLDCache reads an ld.so.cache; file names it in errors.
func ParseLDCache(data []byte, file string) ([]LDCacheEntry, error) {
	base := 0
	if bytes.HasPrefix(data, []byte(ldCacheMagicOld)) {
		// Old entries, then the new format at the next 8-byte boundary.
		if len(data) < 16 {
			return nil, fmt.Errorf("%s: old-format header cut at byte %d", file, len(data))
		}
		n := uint64(binary.LittleEndian.Uint32(data[12:16]))
		end := 16 + n*ldCacheOldEntry
		if end > uint64(len(data)) {
			return nil, fmt.Errorf("%s: old format: %d entries need %d bytes, the file has %d", file, n, end, len(data))
		}
		base = int((end + 7) &^ 7)
		if !bytes.HasPrefix(data[base:], []byte(ldCacheMagicNew)) {
			return nil, fmt.Errorf("%s: old format only (no %q section at byte %d): not read", file, ldCacheMagicNew, base)
		}
	}
	d := data[base:]
	if !bytes.HasPrefix(d, []byte(ldCacheMagicNew)) {
		return nil, fmt.Errorf("%s: not an ld.so cache (no %q at byte %d)", file, ldCacheMagicNew, base)
	}
	if len(d) < ldCacheHeader {
		return nil, fmt.Errorf("%s: header cut at byte %d", file, len(data))
	}
	if e := d[28] & ldEndianMask; e != 0 && e != ldEndianLittle {
		return nil, fmt.Errorf("%s: byte %d: endianness flag %d, not little-endian: not this machine's cache", file, base+28, e)
	}
	n := uint64(binary.LittleEndian.Uint32(d[20:24]))
	if end := ldCacheHeader + n*ldCacheEntry; end > uint64(len(d)) {
		return nil, fmt.Errorf("%s: %d entries need %d bytes from byte %d, the file has %d", file, n, end, base, len(data))
	}
	out := make([]LDCacheEntry, 0, n)
	for i := range int(n) {
		at := ldCacheHeader + i*ldCacheEntry
		e := d[at : at+ldCacheEntry]
		// Strings are offsets from the new format's header.
		name, err := cString(d, binary.LittleEndian.Uint32(e[4:8]))
		if err != nil {
			return nil, fmt.Errorf("%s: entry %d (byte %d): name: %w", file, i, base+at, err)
		}
		path, err := cString(d, binary.LittleEndian.Uint32(e[8:12]))
		if err != nil {
			return nil, fmt.Errorf("%s: entry %d (byte %d): path: %w", file, i, base+at, err)
		}
		out = append(out, LDCacheEntry{Name: name, Path: path, Flags: int32(binary.LittleEndian.Uint32(e[0:4])),
			HWCap: binary.LittleEndian.Uint64(e[16:24])})
	}
	return out, nil
}

// cString is the NUL-terminated string at off in d.
func cString(d []byte, off uint32) (string, error) {
	if uint64(off) >= uint64(len(d)) {
		return "", fmt.Errorf("offset %d past the end (%d bytes)", off, len(d))
	}
	end := bytes.IndexByte(d[off:], 0)
	if end < 0 {
		return "", fmt.Errorf("string at %d has no end", off)
	}
	if end == 0 {
		return "", fmt.Errorf("empty string at %d", off)
	}
	return string(d[off : int(off)+end]), nil
}

// resolveLDCache lists the paths ld.so would open for name from entries:
// those of this machine's kind, in cache order (a glibc-hwcaps
// subdirectory's copy is another file, probed too).
func resolveLDCache(entries []LDCacheEntry, name string) []string {
	var out []string
	for _, e := range entries {
		if e.Name == name && e.nativeLibc6() {
			out = append(out, e.Path)
		}
	}
	return out
}

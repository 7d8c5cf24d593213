package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
)

// driverLibName is the name programs load the CUDA driver by (the
// runtime's dlopen, a link against -lcuda).
const driverLibName = "libcuda.so.1"

// gpuOperatorDriverRoot is where NVIDIA's GPU operator mounts its driver
// container's root filesystem on the host: its libcuda lives under it,
// with its own ld.so.cache, and the container toolkit bind-mounts it from
// there into every GPU container.
const gpuOperatorDriverRoot = "/run/nvidia/driver"

// driverDirs are where driver packages put libcuda.so.1 (Debian/Ubuntu
// multiarch and Debian's nvidia/current alternative, RPM distributions'
// lib64, NVIDIA's .run installer, the device plugin's /usr/local/nvidia).
func driverDirs() []string {
	triplet := map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}[runtime.GOARCH]
	return []string{"/usr/lib/" + triplet, "/usr/lib/" + triplet + "/nvidia/current", "/lib/" + triplet,
		"/usr/lib64", "/lib64", "/usr/lib", "/usr/local/nvidia/lib64", "/usr/local/cuda/compat"}
}

// DriverLibraries lists the CUDA driver files of the host whose root
// filesystem is at root ("/" on the host, the host's root as the agent's
// container mounts it): what ld.so resolves libcuda.so.1 to through the
// host's /etc/ld.so.cache, libcuda.so.1 in the driver's usual
// directories, and the same under the GPU operator's driver root. Each
// file once (by device and inode), as a path under root. problems says
// what could not be read (a cache that is not one), never fatal.
func DriverLibraries(root string) (paths []string, problems []error) {
	seen := map[[2]uint64]bool{}
	add := func(base, p string) {
		real, err := resolveUnder(base, p)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				problems = append(problems, err)
			}
			return
		}
		st, err := os.Stat(real)
		if err != nil || !st.Mode().IsRegular() {
			return
		}
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			key := [2]uint64{uint64(sys.Dev), sys.Ino}
			if seen[key] {
				return
			}
			seen[key] = true
		}
		paths = append(paths, real)
	}
	for _, base := range []string{root, filepath.Join(root, gpuOperatorDriverRoot)} {
		cache := filepath.Join(base, "etc/ld.so.cache")
		data, err := os.ReadFile(cache)
		switch {
		case err == nil:
			entries, err := ParseLDCache(data, cache)
			if err != nil {
				problems = append(problems, err)
			}
			for _, p := range resolveLDCache(entries, driverLibName) {
				add(base, p)
			}
		case !errors.Is(err, fs.ErrNotExist):
			problems = append(problems, err)
		}
		for _, dir := range driverDirs() {
			add(base, path.Join(dir, driverLibName))
		}
	}
	return paths, problems
}

// resolveUnder follows the symbolic links of p (an absolute path as the
// host sees it) inside the filesystem rooted at base: an absolute link
// target is the host's, so it is looked up under base too.
func resolveUnder(base, p string) (string, error) {
	const maxLinks = 16
	p = path.Clean("/" + p)
	for range maxLinks {
		// Resolve the directories first: a link among them is the host's too.
		dir, err := resolveDirUnder(base, path.Dir(p))
		if err != nil {
			return "", err
		}
		p = path.Join(dir, path.Base(p))
		full := filepath.Join(base, p)
		st, err := os.Lstat(full)
		if err != nil {
			return "", err
		}
		if st.Mode()&fs.ModeSymlink == 0 {
			return full, nil
		}
		target, err := os.Readlink(full)
		if err != nil {
			return "", err
		}
		if !path.IsAbs(target) {
			target = path.Join(path.Dir(p), target)
		}
		p = path.Clean(target)
	}
	return "", fmt.Errorf("%s: more than %d symbolic links under %s", p, maxLinks, base)
}

// resolveDirUnder resolves the links of each component of dir under base.
func resolveDirUnder(base, dir string) (string, error) {
	out := "/"
	for _, c := range strings.Split(strings.Trim(dir, "/"), "/") {
		if c == "" {
			continue
		}
		next := path.Join(out, c)
		for range 16 {
			st, err := os.Lstat(filepath.Join(base, next))
			if err != nil {
				return "", err
			}
			if st.Mode()&fs.ModeSymlink == 0 {
				break
			}
			target, err := os.Readlink(filepath.Join(base, next))
			if err != nil {
				return "", err
			}
			if !path.IsAbs(target) {
				target = path.Join(path.Dir(next), target)
			}
			next = path.Clean(target)
		}
		out = next
	}
	return out, nil
}

package collectors

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// RDMADevicesOf lists the RDMA devices a process has open, sorted, each
// once: libibverbs opens /dev/infiniband/uverbsN for every ibv_open_device,
// so each /proc/PID/fd link to one names a device, whose RDMA name is
// SYSROOT/class/infiniband_verbs/uverbsN/ibdev (Linux
// Documentation/ABI/stable/sysfs-class-infiniband). A process with none
// open gives an empty list; one that is gone, an error.
func RDMADevicesOf(procRoot, sysRoot string, pid int) ([]string, error) {
	fdDir := filepath.Join(procRoot, strconv.Itoa(pid), "fd")
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", fdDir, err)
	}
	var out []string
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err != nil {
			continue // closed since the directory was read
		}
		node, ok := UverbsNode(target)
		if !ok {
			continue
		}
		p := filepath.Join(sysRoot, "class", "infiniband_verbs", node, "ibdev")
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue // the device went away
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		if dev := strings.TrimSpace(string(b)); dev != "" && !slices.Contains(out, dev) {
			out = append(out, dev)
		}
	}
	slices.Sort(out)
	return out, nil
}

// UverbsNode gives the uverbs node ("uverbs0") an fd link points at when it
// is a verbs device ("/dev/infiniband/uverbs0"); rdma_cm, umad and other
// files are not.
func UverbsNode(target string) (string, bool) {
	dir, name := filepath.Split(target)
	n, ok := strings.CutPrefix(name, "uverbs")
	if dir != "/dev/infiniband/" || !ok || n == "" {
		return "", false
	}
	if _, err := strconv.ParseUint(n, 10, 16); err != nil {
		return "", false
	}
	return name, true
}

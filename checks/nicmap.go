package checks

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// IBDevices is the RDMA device map a server was given, in the forms of
// SGLang's --disaggregation-ib-device (seed 000, PD 分离: "单个设备、逗号分隔
// 的共享列表、按 GPU 编号的 JSON 映射……或者指向映射文件的路径"): one device
// or a comma-separated list every GPU shares, or a JSON object mapping a
// GPU index to its device or list, given inline or in a file.
type IBDevices struct {
	Shared []string         // devices every GPU may use
	PerGPU map[int][]string // GPU index → devices; wins over Shared for that GPU
}

// Empty reports whether no device was given.
func (m IBDevices) Empty() bool { return len(m.Shared) == 0 && len(m.PerGPU) == 0 }

// For is the devices GPU i may use: its own entry, else the shared list.
func (m IBDevices) For(i int) []string {
	if d, ok := m.PerGPU[i]; ok {
		return d
	}
	return m.Shared
}

// GPUs lists the GPU indices the map names, sorted: the per-GPU entries,
// or with a shared list every one of the n GPUs.
func (m IBDevices) GPUs(n int) []int {
	set := map[int]bool{}
	for i := range m.PerGPU {
		set[i] = true
	}
	if len(m.Shared) > 0 {
		for i := range n {
			set[i] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// Devices lists every device the map names, sorted, each once.
func (m IBDevices) Devices() []string {
	all := slices.Clone(m.Shared)
	for _, d := range m.PerGPU {
		all = append(all, d...)
	}
	slices.Sort(all)
	return slices.Compact(all)
}

// maxIBDevice is the longest RDMA device name the kernel accepts
// (IB_DEVICE_NAME_MAX is 64 with the terminating NUL).
const maxIBDevice = 63

// ParseIBDevices reads the values of a repeatable --ib-devices flag, each
// in one of SGLang's forms: "mlx5_0", "mlx5_0,mlx5_1" (the comma form
// servers print), `{"0": "mlx5_0,mlx5_1", "1": "mlx5_2"}`, or the path of a
// file holding such an object (a value with a '/' or ending in ".json";
// readFile reads it). Repeated values add up: lists join the shared list,
// objects merge, a GPU named twice gets both lists.
func ParseIBDevices(values []string, readFile func(string) ([]byte, error)) (IBDevices, error) {
	var m IBDevices
	for _, v := range values {
		v = strings.TrimSpace(v)
		switch {
		case strings.HasPrefix(v, "{"):
			if err := m.addJSON([]byte(v), "--ib-devices"); err != nil {
				return IBDevices{}, err
			}
		case strings.Contains(v, "/") || strings.HasSuffix(v, ".json"):
			b, err := readFile(v)
			if err != nil {
				return IBDevices{}, fmt.Errorf("--ib-devices: %w", err)
			}
			if err := m.addJSON(b, v); err != nil {
				return IBDevices{}, err
			}
		default:
			devs, err := deviceList(v)
			if err != nil {
				return IBDevices{}, fmt.Errorf("--ib-devices %q: %w", v, err)
			}
			m.Shared = appendNew(m.Shared, devs...)
		}
	}
	return m, nil
}

// addJSON merges a GPU index → device(s) object; a value is a string
// (one device or a comma-separated list) or an array of device names.
func (m *IBDevices) addJSON(b []byte, where string) error {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil {
		return fmt.Errorf("%s: not a GPU → device JSON object: %w", where, err)
	}
	if m.PerGPU == nil {
		m.PerGPU = map[int][]string{}
	}
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		i, err := strconv.Atoi(strings.TrimSpace(k))
		if err != nil || i < 0 {
			return fmt.Errorf("%s: key %q is not a GPU index", where, k)
		}
		var devs []string
		var s string
		var list []string
		switch {
		case json.Unmarshal(obj[k], &s) == nil:
			devs, err = deviceList(s)
		case json.Unmarshal(obj[k], &list) == nil:
			devs, err = deviceList(strings.Join(list, ","))
		default:
			err = fmt.Errorf("value %s is neither a device string nor a list of them", obj[k])
		}
		if err != nil {
			return fmt.Errorf("%s: GPU %s: %w", where, k, err)
		}
		m.PerGPU[i] = appendNew(m.PerGPU[i], devs...)
	}
	return nil
}

// deviceList splits "mlx5_0, mlx5_1" into device names.
func deviceList(s string) ([]string, error) {
	var out []string
	for _, d := range strings.Split(s, ",") {
		d = strings.TrimSpace(d)
		if err := validDevice(d); err != nil {
			return nil, err
		}
		out = appendNew(out, d)
	}
	return out, nil
}

// validDevice accepts an RDMA device name as the kernel names them
// (mlx5_0, rocep65s0f0, irdma-ens1, ionic_3, rxe0).
func validDevice(d string) error {
	if d == "" {
		return fmt.Errorf("empty device name")
	}
	if len(d) > maxIBDevice {
		return fmt.Errorf("device name %.16q… longer than %d bytes", d, maxIBDevice)
	}
	for _, r := range d {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
			return fmt.Errorf("device name %q has %q: not an RDMA device name", d, r)
		}
	}
	return nil
}

func appendNew(list []string, items ...string) []string {
	for _, it := range items {
		if !slices.Contains(list, it) {
			list = append(list, it)
		}
	}
	return list
}

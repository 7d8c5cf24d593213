package topology

import (
	"fmt"
	"sort"
	"strconv"
)

// Compare reports every GPU–NIC and GPU–GPU relation on which this
// host's sysfs and a saved topo -m disagree (NVLink cells are not PCIe
// relations and are left out). GPUs are matched by index, NICs by RDMA name.
func Compare(host *Host, smi *SMIMatrix) []string {
	var diffs []string
	gpus := host.BDFs(KindGPU)
	if n := len(smi.GPUs()); n != len(gpus) {
		diffs = append(diffs, fmt.Sprintf("sysfs has %d GPUs, the file %d", len(gpus), n))
	}
	var nics []string
	for name := range host.RDMA {
		nics = append(nics, name)
	}
	sort.Strings(nics)
	for i, bdf := range gpus {
		gpu := "GPU" + strconv.Itoa(i)
		for j, other := range gpus {
			if j <= i {
				continue
			}
			if want, ok := smi.Relation(gpu, "GPU"+strconv.Itoa(j)); ok {
				if got := host.Relation(bdf, other); got != want {
					diffs = append(diffs, fmt.Sprintf("%s–GPU%d: sysfs %s, file %s", gpu, j, got, want))
				}
			}
		}
		for _, nic := range nics {
			want, ok := smi.Relation(gpu, nic)
			if !ok {
				diffs = append(diffs, fmt.Sprintf("%s–%s: not in the file", gpu, nic))
				continue
			}
			if got := host.Relation(bdf, host.RDMA[nic]); got != want {
				diffs = append(diffs, fmt.Sprintf("%s–%s: sysfs %s, file %s", gpu, nic, got, want))
			}
		}
	}
	return diffs
}

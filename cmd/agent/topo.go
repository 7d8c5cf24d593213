package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/lanewatch/lanewatch/topology"
)

// topoOutput is `agent topo --json`.
type topoOutput struct {
	Source      string            `json:"source"` // "sysfs" or the nvidia-smi file
	Matrix      *topology.Matrix  `json:"matrix,omitempty"`
	IBDeviceMap map[string]string `json:"ib_device_map"` // SGLang --disaggregation-ib-device
	// NearestNIC is each GPU's nearest NIC by column name, given when the
	// file's NICs have no RDMA names (a paste without its NIC Legend).
	NearestNIC  map[string]string `json:"nearest_nic,omitempty"`
	Differences []string          `json:"differences,omitempty"`
	Notes       []string          `json:"notes,omitempty"`
}

func cmdTopo(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("topo", "warn", stderr, `Prints how every GPU, NIC and NVMe connects to every other, with nvidia-smi topo -m's
meanings (PIX, PXB, PHB, NODE, SYS), each GPU's CPU and NUMA affinity, and for each GPU
its nearest RDMA device as the JSON SGLang takes for --disaggregation-ib-device.
--nvidia-smi reads a saved 'nvidia-smi topo -m' output instead; when this host's sysfs
has GPUs too, the two are compared and differences reported.`)
	sysRoot := fs.String("path.sysfs", "/sys", "sysfs mount point (or a captured tree)")
	smiFile := fs.String("nvidia-smi", "", "a saved `nvidia-smi topo -m` output to read")
	asJSON := fs.Bool("json", false, "print JSON for machines")
	log, code := parse(fs, args, stderr)
	if log == nil {
		return code
	}
	if code := usageErrors(stderr, "topo", checkRoot("path.sysfs", *sysRoot)); code != 0 {
		return code
	}
	host, err := topology.Read(*sysRoot)
	if err != nil {
		fmt.Fprintln(stderr, "topo:", err)
		return exitCannotRun
	}
	out := topoOutput{Source: "sysfs"}
	m := host.Matrix()
	if len(m.Devices) > 0 {
		out.Matrix = &m
	}
	out.IBDeviceMap = host.NearestRDMA()
	gpus, rdma := host.BDFs(topology.KindGPU), len(host.RDMA)
	if len(gpus) == 0 {
		out.Notes = append(out.Notes, fmt.Sprintf("no GPU in %s (%d PCI functions): no GPU relations", *sysRoot, len(host.Functions)))
	}
	if rdma == 0 {
		out.Notes = append(out.Notes, fmt.Sprintf("no RDMA device in %s/class/infiniband: no NIC map", *sysRoot))
	}
	if *smiFile != "" {
		f, err := os.Open(*smiFile)
		if err != nil {
			fmt.Fprintln(stderr, "topo:", err)
			return exitCannotRun
		}
		smi, err := topology.ParseNvidiaSMI(f, *smiFile)
		f.Close()
		if err != nil {
			fmt.Fprintln(stderr, "topo:", err)
			return exitCannotRun
		}
		if len(gpus) > 0 {
			out.Differences = topology.Compare(host, smi)
		} else {
			out.Notes = append(out.Notes, "this host's sysfs has no GPU: nothing to compare the file with")
		}
		out.Source, out.Matrix = *smiFile, nil
		out.IBDeviceMap = smi.NearestRDMA()
		out.Notes = append(out.Notes, smi.Notes...)
		if len(smi.UnnamedNICs()) > 0 {
			out.NearestNIC = smi.NearestNIC()
		}
		if *asJSON {
			return writeJSON(stdout, stderr, out)
		}
		fmt.Fprintf(stdout, "%s: %d GPU, %d NIC\n", *smiFile, len(smi.GPUs()), len(smi.NICs()))
	} else if *asJSON {
		return writeJSON(stdout, stderr, out)
	} else if out.Matrix != nil {
		if err := m.WriteText(stdout); err != nil {
			fmt.Fprintln(stderr, "topo:", err)
			return exitCannotRun
		}
	}
	for _, n := range out.Notes {
		fmt.Fprintln(stdout, n)
	}
	js, _ := json.Marshal(out.IBDeviceMap)
	fmt.Fprintf(stdout, "GPU → nearest RDMA device (SGLang --disaggregation-ib-device): %s\n", js)
	if out.NearestNIC != nil {
		js, _ := json.Marshal(out.NearestNIC)
		fmt.Fprintf(stdout, "GPU → nearest NIC column (the file names no RDMA device): %s\n", js)
	}
	for _, d := range out.Differences {
		fmt.Fprintln(stdout, "difference:", d)
	}
	return exitOK
}

func writeJSON(stdout, stderr io.Writer, v any) int {
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintln(stderr, "topo:", err)
		return exitCannotRun
	}
	return exitOK
}

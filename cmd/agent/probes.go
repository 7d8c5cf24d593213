package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/lanewatch/lanewatch/event"
	"github.com/lanewatch/lanewatch/probes"
)

// layerNames says what each layer of the probe table is, for agent probes.
var layerNames = map[event.Layer]string{
	event.LayerRuntime: "CUDA runtime (probed for a process only when its driver fails to initialise)",
	event.LayerDriver:  "CUDA driver",
	event.LayerLinker:  "dynamic linker (dlopen notifications)",
	event.LayerVerbs:   "RDMA verbs",
	event.LayerUCP:     "UCX transfers as posted (libucp)",
	event.LayerUCT:     "UCX transports: the lane of each transfer (libuct, libuct_ib)",
	event.LayerFabric:  "libfabric",
}

func cmdProbes(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("probes", "warn", stderr, `Lists, for each library named, every probe-table symbol of the layers it exports:
absent, or where the agent probes it — the instruction, its cost (emulated, nop,
single-step) and, for NVIDIA's driver dispatch thunks, the implementation the thunk's
slot names; and "not traced" with why for a library that moves data past every probe
(mlx5 direct verbs, GPU-initiated RDMA, …). Nothing is attached: no root needed.
Exits 1 if a library cannot be read or exports no table symbol.

  agent probes /usr/lib/x86_64-linux-gnu/libcuda.so.1 /path/to/libcudart.so.12

(ldconfig -p | grep -E 'libcuda|libcudart|libibverbs' finds them.)`)
	var libs stringList
	fs.Var(&libs, "lib", "a library to list (repeatable; libraries may also be given as arguments)")
	if log, code := parse(fs, args, stderr); log == nil {
		return code
	}
	libs = append(libs, fs.Args()...)
	if len(libs) == 0 {
		fmt.Fprintln(stderr, "agent probes: name at least one library")
		fs.Usage()
		return 2
	}
	code := 0
	for i, lib := range libs {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		cov, err := probes.Coverage(lib)
		if err == nil && len(cov) == 0 {
			err = fmt.Errorf("%s exports no symbol of the probe table", lib)
		}
		if err == nil {
			writeCoverage(stdout, lib, cov)
		}
		// Whatever it exports, a library that moves data past every probe
		// says so (docs/design.md, "Transfer libraries").
		if u, ok, uerr := probes.UntracedObject(lib, lib); uerr == nil && ok {
			if err != nil {
				fmt.Fprintln(stdout, lib)
			}
			fmt.Fprintf(stdout, "  not traced (%s): %s\n", u.Sign, u.Reason())
		}
		if err != nil {
			fmt.Fprintf(stderr, "agent probes: %v\n", err)
			code = 1
		}
	}
	return code
}

// writeCoverage prints one library's coverage, a header per layer.
func writeCoverage(w io.Writer, lib string, cov []probes.SymbolCoverage) {
	fmt.Fprintln(w, lib)
	for i := 0; i < len(cov); {
		layer := cov[i].Layer
		j := i
		present, thunks, costs := 0, 0, map[string]int{}
		for ; j < len(cov) && cov[j].Layer == layer; j++ {
			c := cov[j]
			if !c.Present {
				continue
			}
			present++
			if c.Err == nil {
				costs[c.Site.Cost.String()]++
			}
			if c.Site.Thunk != nil {
				thunks++
			}
		}
		var sum []string
		for _, k := range []string{"emulated", "nop", "single-step"} {
			if costs[k] > 0 {
				sum = append(sum, fmt.Sprintf("%s %d", k, costs[k]))
			}
		}
		if thunks > 0 {
			sum = append(sum, fmt.Sprintf("through a thunk %d", thunks))
		}
		fmt.Fprintf(w, "  %s: %d of %d table symbols exported; sites: %s\n", layerNames[layer], present, j-i, strings.Join(sum, ", "))
		for _, c := range cov[i:j] {
			switch {
			case !c.Present:
				fmt.Fprintf(w, "    %-34s absent\n", c.Symbol)
			case c.Err != nil:
				fmt.Fprintf(w, "    %-34s NOT PROBED: %v\n", c.Symbol, c.Err)
			default:
				line := c.Site.String()
				if c.Site.NotResolved != "" {
					line += "; a dispatch thunk probed at itself: " + c.Site.NotResolved
				}
				fmt.Fprintf(w, "    %-34s %s\n", c.Symbol, line)
			}
		}
		i = j
	}
}

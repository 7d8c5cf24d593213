// Command generate writes the deploy module's generated files: the chart's
// copies of dashboards/ and the plain manifests rendered from the chart. Run
// from the deploy directory (go generate does).
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/lanewatch/lanewatch/deploy"
)

func main() {
	files, err := deploy.Generate(".")
	if err != nil {
		fmt.Fprintln(os.Stderr, "generate:", err)
		os.Exit(1)
	}
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "generate:", err)
			os.Exit(1)
		}
		if err := os.WriteFile(p, files[p], 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "generate:", err)
			os.Exit(1)
		}
		fmt.Println("wrote", p)
	}
}

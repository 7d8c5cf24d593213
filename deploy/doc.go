// Package deploy holds lanewatch's Kubernetes deployment: the Helm chart
// (helm/lanewatch, DaemonSet or sidecar mode), the plain manifests rendered
// from it (kubernetes/), and the OpenTelemetry Collector example
// (collector/). It is its own Go module so that Helm and the Kubernetes API
// stay out of the agent's dependencies.
//
// The chart's copies of the alerting rules and the Grafana dashboard
// (helm/lanewatch/files) and the plain manifests are generated: `go generate`
// here, or `make deploy-generate` at the root. The tests render the chart in
// both modes, decode every object strictly into its Kubernetes or
// prometheus-operator type, and fail when a generated file is stale.
package deploy

//go:generate go run ./cmd/generate

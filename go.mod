module github.com/lanewatch/lanewatch

go 1.26.8

tool github.com/cilium/ebpf/cmd/bpf2go

require (
	github.com/cilium/ebpf v0.22.0
	github.com/prometheus/procfs v0.23.0
	github.com/safchain/ethtool v0.7.0
	golang.org/x/arch v0.33.0
	golang.org/x/sys v0.49.0
)

require golang.org/x/sync v0.24.0 // indirect

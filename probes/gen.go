package probes

// bpf2go compiles bpf/*.bpf.c with clang and writes the Go bindings next to
// this file. -target amd64 because the programs read x86-64 argument registers;
// -type lw_event generates the Go mirror of the one event struct in
// bpf/lanewatch.h; -Wpadded makes any implicit padding a build error.
//go:generate go tool bpf2go -tags linux -target amd64 -type lw_event lanewatch ../bpf/lanewatch.bpf.c -- -I../bpf -I/usr/include/x86_64-linux-gnu -O2 -g -Wall -Werror -Wpadded
//go:generate go tool bpf2go -tags linux -target amd64 empty ../bpf/empty.bpf.c -- -I/usr/include/x86_64-linux-gnu -O2 -g -Wall -Werror

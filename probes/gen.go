package probes

// bpf2go compiles bpf/*.bpf.c with clang and writes the Go bindings next to
// this file. -target amd64,arm64: one object per architecture, each reading
// its own argument registers (bpf/x86_types.h, bpf/arm64_types.h);
// -type lw_event generates the Go mirror of the one event struct in
// bpf/lanewatch.h, and the other -type flags its enums (event kinds, drop
// reasons, the cookie layout, the work-request and completion argument
// slots, where a string read at return goes, the pieces of a name, a
// launch config's slots, a UCX call's), so no C constant is copied into Go by hand; -Wpadded makes any
// implicit padding a build error.
//go:generate go tool bpf2go -tags linux -target amd64,arm64 -type lw_event -type lw_event_kind -type lw_drop_reason -type lw_cookie_shift -type lw_wr_arg -type lw_wc_arg -type lw_copy2d_arg -type lw_event_flag -type lw_outstr -type lw_prop_arg -type lw_name -type lw_launch_arg -type lw_qp_arg -type lw_ucp_arg -type lw_uct_iface_arg -type lw_ucp_mem_map_arg -type lw_slot -type lw_fabric_msg_arg -type lw_flow -type lw_flow_total -type lw_count_row -type lw_count lanewatch ../bpf/lanewatch.bpf.c -- -I../bpf -I/usr/include/x86_64-linux-gnu -O2 -g -Wall -Werror -Wpadded
//go:generate go tool bpf2go -tags linux -target amd64,arm64 empty ../bpf/empty.bpf.c -- -I../bpf -I/usr/include/x86_64-linux-gnu -O2 -g -Wall -Werror
//go:generate go tool bpf2go -tags linux -target amd64,arm64 -type lw_storage_read storage ../bpf/storage.bpf.c -- -I../bpf -I/usr/include/x86_64-linux-gnu -O2 -g -Wall -Werror -Wpadded
//go:generate go tool bpf2go -tags linux -target amd64,arm64 -type lw_file -type lw_verified hold ../bpf/hold.bpf.c -- -I../bpf -I/usr/include/x86_64-linux-gnu -O2 -g -Wall -Werror -Wpadded

// SPDX-License-Identifier: GPL-2.0
/* The baseline for `make bench`: a program that does nothing, attached where a
 * naive tool (or bpftrace) would attach, at the symbol address. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

SEC("uprobe")
int lw_empty(void *ctx)
{
	return 0;
}

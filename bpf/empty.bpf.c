// SPDX-License-Identifier: GPL-2.0
/* The baselines for `make bench`, attached where a naive tool attaches: at the
 * symbol address.
 *
 * lw_empty does nothing: the bare cost of a probe hit at that site.
 * lw_naive_entry/lw_naive_return are what the bpftrace one-liner timing a
 * call compiles to (@s[tid] = nsecs at entry; at return a lookup, @ns =
 * hist(nsecs - @s[tid]) and a delete): the entry+return pair the agent's one
 * pair per call is measured against, side by side with the real bpftrace. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "x86_types.h"

char LICENSE[] SEC("license") = "GPL";

SEC("uprobe")
int lw_empty(void *ctx)
{
	return 0;
}

struct naive_start {
	__u64 ts, bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 10240);
	__type(key, __u32);
	__type(value, struct naive_start);
} naive_starts SEC(".maps");

/* @ns = hist(...): power-of-two buckets, per CPU as bpftrace keeps them */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u64);
} naive_hist SEC(".maps");

SEC("uprobe")
int lw_naive_entry(struct pt_regs *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct naive_start s = {bpf_ktime_get_ns(), ctx->dx};
	bpf_map_update_elem(&naive_starts, &tid, &s, BPF_ANY);
	return 0;
}

SEC("uretprobe")
int lw_naive_return(struct pt_regs *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct naive_start *s = bpf_map_lookup_elem(&naive_starts, &tid);
	if (!s)
		return 0;
	__u64 ns = bpf_ktime_get_ns() - s->ts;
	__u32 bucket = 0;
	for (int i = 0; i < 63 && ns > 1; i++, ns >>= 1)
		bucket++;
	__u64 *n = bpf_map_lookup_elem(&naive_hist, &bucket);
	if (n)
		*n += 1;
	bpf_map_delete_elem(&naive_starts, &tid);
	return 0;
}

// SPDX-License-Identifier: GPL-2.0
/* lanewatch probes: one generic entry program for every probed call, an
 * entry/return pair for calls whose result matters (allocations, registrations,
 * synchronisations), a batch walker, and process exec/exit tracepoints.
 * What a call means is decided in Go from the probe table; BPF only captures.
 * Programs attach as uprobe_multi links, one link per file and program: the
 * kernel then detaches a whole file in one RCU grace period instead of one
 * per probe (~100 ms each here). */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "x86_types.h"
#include "lanewatch.h"

char LICENSE[] SEC("license") = "GPL";

/* The reader drains on its own timer and is woken only when the ring holds
 * wakeup_bytes unread. A wakeup costs microseconds on a VM, and asking the
 * ring how full it is (bpf_ringbuf_query) ~45 ns as it touches the reader's
 * cache line, so each CPU asks only once every 64 events. */
volatile const __u64 wakeup_bytes = 1 << 20;
#define LW_QUERY_EVERY 64

/* Per-CPU event counts, one cache line each so CPUs do not share lines. */
#define LW_COUNT_SLOTS 1024
struct cpu_count {
	__u64 n;
	__u64 pad[7];
};
struct cpu_count cpu_counts[LW_COUNT_SLOTS];

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LW_DROP_NREASONS);
	__type(key, __u32);
	__type(value, __u64);
} drops SEC(".maps");

struct saved_key {
	__u32 tid;
	__u16 probe;
	__u16 pad;
};

/* Arguments of calls in flight, keyed by thread and probe (a runtime call
 * nests its driver call on the same thread). LRU: a thread that dies inside a
 * call cannot leak an entry. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct saved_key);
	__type(value, struct lw_event);
} saved SEC(".maps");

/* Scratch for building an entry event off the 512-byte BPF stack. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lw_event);
} scratch SEC(".maps");

static __always_inline void count_drop(__u32 reason, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&drops, &reason);
	if (v)
		*v += n;
}

static __always_inline __u64 submit_flags(void)
{
	struct cpu_count *c = &cpu_counts[bpf_get_smp_processor_id() & (LW_COUNT_SLOTS - 1)];
	if (++c->n % LW_QUERY_EVERY)
		return BPF_RB_NO_WAKEUP;
	return bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes ? BPF_RB_FORCE_WAKEUP
									     : BPF_RB_NO_WAKEUP;
}

/* Fill the header and arguments. Arguments 7..9 live on the caller's stack
 * above the return address; the cookie says how far the stack pointer has
 * moved if the probe site is past a push. */
static __always_inline void capture(struct lw_event *e, struct pt_regs *ctx, __u64 cookie, __u8 kind)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u8 n = LW_COOKIE_NARGS(cookie);

	e->kind = kind;
	e->nargs = n;
	e->probe = LW_COOKIE_PROBE(cookie);
	e->pid = id >> 32;
	e->tid = (__u32)id;
	e->batch_index = 0;
	e->ts_ns = bpf_ktime_get_ns();
	e->ret_ts_ns = 0;
	e->ret = 0;
	e->out = 0;
	e->args[0] = ctx->di;
	e->args[1] = ctx->si;
	e->args[2] = ctx->dx;
	e->args[3] = ctx->cx;
	e->args[4] = ctx->r8;
	e->args[5] = ctx->r9;
	e->args[6] = 0;
	e->args[7] = 0;
	e->args[8] = 0;
	if (n > 6) {
		__u32 size = (n - 6) * 8;
		__u64 sp = ctx->sp + LW_COOKIE_SPDELTA(cookie) + 8;
		if (size > 24)
			size = 24;
		if (bpf_probe_read_user(&e->args[6], size, (void *)sp))
			count_drop(LW_DROP_READ_FAULT, 1);
	}
}

SEC("uprobe.multi")
int lw_call(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	struct lw_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_drop(LW_DROP_RING_FULL, 1);
		return 0;
	}
	capture(e, ctx, cookie, LW_EV_CALL);
	bpf_ringbuf_submit(e, submit_flags());
	return 0;
}

SEC("uprobe.multi")
int lw_call_enter(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 zero = 0;
	struct lw_event *e = bpf_map_lookup_elem(&scratch, &zero);
	if (!e)
		return 0;
	capture(e, ctx, cookie, LW_EV_CALL);
	struct saved_key key = { .tid = e->tid, .probe = e->probe };
	bpf_map_update_elem(&saved, &key, e, BPF_ANY);
	return 0;
}

SEC("uretprobe.multi")
int lw_call_return(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	struct saved_key key = {
		.tid = (__u32)bpf_get_current_pid_tgid(),
		.probe = LW_COOKIE_PROBE(cookie),
	};
	struct lw_event *in = bpf_map_lookup_elem(&saved, &key);
	if (!in) {
		count_drop(LW_DROP_NO_ENTRY, 1);
		return 0;
	}
	struct lw_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_drop(LW_DROP_RING_FULL, 1);
		bpf_map_delete_elem(&saved, &key);
		return 0;
	}
	__builtin_memcpy(e, in, sizeof(*e));
	e->ret_ts_ns = bpf_ktime_get_ns();
	e->ret = ctx->ax;
	__u32 out = LW_COOKIE_OUTARG(cookie);
	__u64 ptr = 0;
	/* Constant indexes: the verifier cannot bound args[out - 1]. */
	for (__u32 i = 0; i < LW_MAX_ARGS; i++)
		if (i + 1 == out)
			ptr = e->args[i];
	if (ptr && bpf_probe_read_user(&e->out, sizeof(e->out), (void *)ptr))
		count_drop(LW_DROP_READ_FAULT, 1);
	bpf_map_delete_elem(&saved, &key);
	bpf_ringbuf_submit(e, submit_flags());
	return 0;
}

/* cudaMemcpyBatchAsync(dsts, srcs, sizes, count, ...): one event per entry,
 * args[0..2] replaced by that entry's dst, src and size. */
SEC("uprobe.multi")
int lw_batch(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 zero = 0;
	struct lw_event *call = bpf_map_lookup_elem(&scratch, &zero);
	if (!call)
		return 0;
	capture(call, ctx, cookie, LW_EV_BATCH_ENTRY);
	__u64 dsts = call->args[0], srcs = call->args[1], sizes = call->args[2];
	__u64 count = call->args[3];

	for (__u32 i = 0; i < LW_MAX_BATCH; i++) {
		if (i >= count)
			break;
		struct lw_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
		if (!e) {
			count_drop(LW_DROP_RING_FULL, 1);
			continue;
		}
		__builtin_memcpy(e, call, sizeof(*e));
		e->batch_index = i;
		if (bpf_probe_read_user(&e->args[0], 8, (void *)(dsts + i * 8)) ||
		    bpf_probe_read_user(&e->args[1], 8, (void *)(srcs + i * 8)) ||
		    bpf_probe_read_user(&e->args[2], 8, (void *)(sizes + i * 8)))
			count_drop(LW_DROP_READ_FAULT, 1);
		bpf_ringbuf_submit(e, submit_flags());
	}
	if (count > LW_MAX_BATCH)
		count_drop(LW_DROP_BATCH_TRUNC, count - LW_MAX_BATCH);
	return 0;
}

static __always_inline void emit_process(__u8 kind, __u32 pid, __u32 tid)
{
	struct lw_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_drop(LW_DROP_RING_FULL, 1);
		return;
	}
	__builtin_memset(e, 0, sizeof(*e));
	e->kind = kind;
	e->pid = pid;
	e->tid = tid;
	e->ts_ns = bpf_ktime_get_ns();
	/* Process events are rare and the reader wants them promptly. */
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(lw_exec, struct task_struct *p)
{
	emit_process(LW_EV_EXEC, p->tgid, p->pid);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(lw_exit, struct task_struct *p)
{
	int pid = p->pid, tgid = p->tgid;
	if (pid != tgid)
		return 0;
	emit_process(LW_EV_EXIT, tgid, pid);
	return 0;
}

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

/* The enums of lanewatch.h reach Go through bpf2go -type, which needs them in
 * the object's BTF: these unused declarations put them there. */
const enum lw_event_kind *unused_event_kind __attribute__((unused));
const enum lw_drop_reason *unused_drop_reason __attribute__((unused));
const enum lw_cookie_shift *unused_cookie_shift __attribute__((unused));
const enum lw_wr_arg *unused_wr_arg __attribute__((unused));
const enum lw_wc_arg *unused_wc_arg __attribute__((unused));

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

/* saved_entry finds the arguments lw_call_enter saved for this thread and
 * probe; a return without them (evicted, or entered before the attach) is
 * counted, never silent. */
static __always_inline struct lw_event *saved_entry(__u64 cookie, struct saved_key *key)
{
	key->tid = (__u32)bpf_get_current_pid_tgid();
	key->probe = LW_COOKIE_PROBE(cookie);
	key->pad = 0;
	struct lw_event *in = bpf_map_lookup_elem(&saved, key);
	if (!in)
		count_drop(LW_DROP_NO_ENTRY, 1);
	return in;
}

SEC("uretprobe.multi")
int lw_call_return(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	struct saved_key key;
	struct lw_event *in = saved_entry(cookie, &key);
	if (!in)
		return 0;
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
	/* Or a field of the returned object (ibv_mr keys, a QP's context). */
	if (LW_COOKIE_OUTRET(cookie) && e->ret)
		ptr = e->ret + LW_COOKIE_OUTOFF(cookie);
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

/* Layouts of /usr/include/infiniband/verbs.h (rdma-core), checked by a Go
 * test that compiles offsetof() against the header. */
#define IBV_QP_QP_NUM 52       /* struct ibv_qp.qp_num */
#define IBV_WR_NEXT 8          /* struct ibv_send_wr/ibv_recv_wr.next */
#define IBV_WR_SG_LIST 16
#define IBV_WR_NUM_SGE 24
#define IBV_SWR_OPCODE 28      /* struct ibv_send_wr.opcode */
#define IBV_SWR_SEND_FLAGS 32
#define IBV_SWR_IMM 36
#define IBV_SWR_REMOTE_ADDR 40 /* wr.rdma.remote_addr */
#define IBV_SWR_RKEY 48        /* wr.rdma.rkey */
#define IBV_SGE_SIZE 16        /* struct ibv_sge: addr u64, length u32, lkey u32 */
#define IBV_WC_SIZE 48         /* struct ibv_wc */

struct lw_sge {
	__u64 addr;
	__u32 length;
	__u32 lkey;
};

/* Walks a post_send/post_recv chain: one event per work request. The
 * provider function is reached only through the context's ops table, so it
 * is attached by file offset (see probes.ResolveProviderOps). */
static __always_inline int walk_wrs(struct pt_regs *ctx, int send)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u64 id = bpf_get_current_pid_tgid();
	__u64 qp = ctx->di, wr = ctx->si, ts = bpf_ktime_get_ns();
	__u32 qp_num = 0;
	bpf_probe_read_user(&qp_num, sizeof(qp_num), (void *)(qp + IBV_QP_QP_NUM));

	for (__u32 i = 0; i < LW_MAX_WR; i++) {
		if (!wr)
			return 0;
		struct lw_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
		if (!e) {
			count_drop(LW_DROP_RING_FULL, 1);
			return 0;
		}
		__builtin_memset(e, 0, sizeof(*e));
		e->kind = LW_EV_WR;
		e->nargs = LW_MAX_ARGS;
		e->probe = LW_COOKIE_PROBE(cookie);
		e->pid = id >> 32;
		e->tid = (__u32)id;
		e->batch_index = i;
		e->ts_ns = ts;
		e->args[LW_WR_QP] = qp;
		e->args[LW_WR_QPNUM] = qp_num;

		__u64 hdr[7] = {}; /* wr_id, next, sg_list, num_sge|opcode, send_flags|imm, remote_addr, rkey */
		if (bpf_probe_read_user(hdr, send ? sizeof(hdr) : 4 * sizeof(__u64), (void *)wr)) {
			count_drop(LW_DROP_READ_FAULT, 1);
			bpf_ringbuf_discard(e, 0);
			return 0;
		}
		e->args[LW_WR_ID] = hdr[0];
		__u32 nsge = (__u32)hdr[3];
		if (send) {
			e->args[LW_WR_OPCODE] = (hdr[3] >> 32) | ((hdr[4] & 0xffffffff) << 32);
			e->args[LW_WR_REMOTE] = hdr[5];
			e->args[LW_WR_RKEY_IMM] = (hdr[6] & 0xffffffff) | (hdr[4] & 0xffffffff00000000ULL);
		}
		__u64 bytes = 0;
		for (__u32 j = 0; j < LW_MAX_SGE; j++) {
			struct lw_sge sge = {};
			if (j >= nsge)
				break;
			if (bpf_probe_read_user(&sge, sizeof(sge), (void *)(hdr[2] + j * IBV_SGE_SIZE))) {
				count_drop(LW_DROP_READ_FAULT, 1);
				break;
			}
			bytes += sge.length;
			if (j == 0) {
				e->args[LW_WR_LOCAL] = sge.addr;
				e->args[LW_WR_LKEY_NSGE] = sge.lkey | ((__u64)nsge << 32);
			}
		}
		e->args[LW_WR_BYTES] = bytes;
		bpf_ringbuf_submit(e, submit_flags());
		wr = hdr[1];
	}
	if (wr)
		count_drop(LW_DROP_WR_TRUNC, 1);
	return 0;
}

SEC("uprobe.multi")
int lw_post_send(struct pt_regs *ctx)
{
	return walk_wrs(ctx, 1);
}

SEC("uprobe.multi")
int lw_post_recv(struct pt_regs *ctx)
{
	return walk_wrs(ctx, 0);
}

/* poll_cq(cq, num_entries, wc): the entry half is lw_call_enter; at return
 * one event per completion the call wrote. Empty polls emit nothing. */
SEC("uretprobe.multi")
int lw_poll_cq_return(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	struct saved_key key;
	struct lw_event *in = saved_entry(cookie, &key);
	if (!in)
		return 0;
	__s64 n = (__s64)ctx->ax;
	__u64 cq = in->args[0], wcs = in->args[2], ts = bpf_ktime_get_ns();
	for (__u32 i = 0; i < LW_MAX_WC; i++) {
		if ((__s64)i >= n)
			break;
		struct lw_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
		if (!e) {
			count_drop(LW_DROP_RING_FULL, 1);
			break;
		}
		__builtin_memcpy(e, in, sizeof(*e));
		e->kind = LW_EV_WC;
		e->batch_index = i;
		e->ret_ts_ns = ts;
		e->ret = n;
		__u64 wc[5] = {}; /* wr_id, status|opcode, vendor_err|byte_len, imm|qp_num, src_qp|wc_flags */
		if (bpf_probe_read_user(wc, sizeof(wc), (void *)(wcs + i * IBV_WC_SIZE)))
			count_drop(LW_DROP_READ_FAULT, 1);
		e->args[LW_WC_CQ] = cq;
		e->args[LW_WC_ID] = wc[0];
		e->args[LW_WC_STATUS_OP] = wc[1];
		e->args[LW_WC_LEN_IMM] = (wc[2] >> 32) | (wc[3] << 32);
		e->args[LW_WC_QPNUM_FLAGS] = (wc[3] >> 32) | (wc[4] & 0xffffffff00000000ULL);
		e->args[5] = 0;
		e->args[6] = 0;
		e->args[7] = 0;
		e->args[8] = 0;
		bpf_ringbuf_submit(e, submit_flags());
	}
	if (n > LW_MAX_WC)
		count_drop(LW_DROP_WR_TRUNC, n - LW_MAX_WC);
	bpf_map_delete_elem(&saved, &key);
	return 0;
}

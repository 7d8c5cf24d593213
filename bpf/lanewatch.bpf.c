// SPDX-License-Identifier: GPL-2.0
/* lanewatch probes: an entry/return pair for every CUDA call (the entry keeps
 * the arguments in the thread's slot, the return emits one event with the
 * result), one entry-only program for the rest, a batch walker, a 2D-copy
 * reader, the RDMA work-request and completion walkers, and process exec/exit
 * tracepoints. What a call means is decided in Go from the probe table; BPF
 * only captures.
 * Programs attach as uprobe_multi links, one link per file and program: the
 * kernel then detaches a whole file in one RCU grace period instead of one
 * per probe (~100 ms each here). */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#if defined(__TARGET_ARCH_arm64)
#include "arm64_types.h"
#else
#include "x86_types.h"
#endif
#include "lanewatch.h"

#define LW_EBUSY 16  /* errno EBUSY */
#define LW_EEXIST 17 /* errno EEXIST */

char LICENSE[] SEC("license") = "GPL";

/* The enums of lanewatch.h reach Go through bpf2go -type, which needs them in
 * the object's BTF: these unused declarations put them there. */
const enum lw_event_kind *unused_event_kind __attribute__((unused));
const enum lw_drop_reason *unused_drop_reason __attribute__((unused));
const enum lw_cookie_shift *unused_cookie_shift __attribute__((unused));
const enum lw_wr_arg *unused_wr_arg __attribute__((unused));
const enum lw_wc_arg *unused_wc_arg __attribute__((unused));
const enum lw_copy2d_arg *unused_copy2d_arg __attribute__((unused));
const enum lw_event_flag *unused_event_flag __attribute__((unused));
const enum lw_outstr *unused_outstr __attribute__((unused));
const enum lw_prop_arg *unused_prop_arg __attribute__((unused));
const enum lw_name *unused_name __attribute__((unused));
const enum lw_launch_arg *unused_launch_arg __attribute__((unused));
const enum lw_qp_arg *unused_qp_arg __attribute__((unused));
const enum lw_ucp_arg *unused_ucp_arg __attribute__((unused));
const enum lw_uct_iface_arg *unused_uct_iface_arg __attribute__((unused));
const enum lw_ucp_mem_map_arg *unused_ucp_mem_map_arg __attribute__((unused));
const enum lw_slot *unused_slot __attribute__((unused));
const enum lw_fabric_msg_arg *unused_fabric_msg_arg __attribute__((unused));
const enum lw_count *unused_count __attribute__((unused));

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
	__u64 overflow_seen; /* lost_overflow when this CPU last said LW_F_LOST_ANY */
	__u64 shed;          /* copies this CPU shed */
	__u64 pad[5];
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

/* The calls in flight of each thread (struct lw_slots, lanewatch.h). */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct lw_slots);
} inflight SEC(".maps");

/* Processes that lost events not yet said (docs/design.md, "Ring buffer,
 * wakeups, drops"): a lost registration must never turn pinned memory into
 * pageable, so the next event of such a process carries LW_F_LOST_BEFORE,
 * in ring order, and user space stops trusting its registry from there.
 * lost_waiting counts the entries, so a process's events cost one load
 * while nothing waits; lost_overflow counts losses the table could not hold
 * (then every CPU's next event says LW_F_LOST_ANY). */
#define LW_LOST_TGIDS 4096
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LW_LOST_TGIDS);
	__type(key, __u32);
	__type(value, __u32);
} lost SEC(".maps");
__u64 lost_waiting;
__u64 lost_overflow;

#include "pidns.h" /* pidns_dev, pidns_ino, current_id, foreign */

/* Copy totals per flow (struct lw_flow, lanewatch.h) and what each row
 * counts. Hash updates are atomic adds: a flow's threads may run on
 * several CPUs, and a per-CPU hash would cost LW_FLOWS entries per CPU.
 * flows_full counts the copies no flow had room for. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LW_COUNT_ROWS);
	__type(key, __u32);
	__type(value, struct lw_count_row);
} count_rows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LW_FLOWS);
	__type(key, struct lw_flow);
	__type(value, struct lw_flow_total);
} flows SEC(".maps");
__u64 flows_full;

/* note_lost remembers that the current process lost an event. */
static __always_inline void note_lost(void)
{
	__u32 tgid = current_id() >> 32, one = 1;
	long err = bpf_map_update_elem(&lost, &tgid, &one, BPF_NOEXIST);
	if (!err)
		__sync_fetch_and_add(&lost_waiting, 1);
	else if (err != -LW_EEXIST)
		__sync_fetch_and_add(&lost_overflow, 1);
}

/* lost_flags is what an event of tgid about to be submitted must say of
 * earlier losses; it takes the process out of the table. */
static __always_inline __u8 lost_flags(__u32 tgid)
{
	__u8 f = 0;
	struct cpu_count *c = &cpu_counts[bpf_get_smp_processor_id() & (LW_COUNT_SLOTS - 1)];
	__u64 overflow = *(volatile __u64 *)&lost_overflow;
	if (overflow != c->overflow_seen) {
		c->overflow_seen = overflow;
		f |= LW_F_LOST_ANY;
	}
	if (*(volatile __u64 *)&lost_waiting && bpf_map_delete_elem(&lost, &tgid) == 0) {
		__sync_fetch_and_add(&lost_waiting, -1);
		f |= LW_F_LOST_BEFORE;
	}
	return f;
}

/* Shedding (docs/design.md 3.3, "Shedding"): once a fill check finds
 * shed_on_bytes unread, the return programs stop emitting the successful
 * copies their flows count (count_copy: calls, bytes and shed), until a
 * check finds shed_off_bytes or less. A full ring takes whatever comes
 * next, a registration or a sync with it; a shed copy is counted in its
 * flow and carries nothing the engine must know of the process. */
volatile const __u64 shed_on_bytes = ~0ull;
volatile const __u64 shed_off_bytes = 0;
__u32 shedding;

/* count_drop counts lost or damaged events by reason. A full ring and a
 * read fault may take a registration (or its address) with them: the
 * process is noted. A return without its entry is not: its call was entered
 * before the attach (memory mapped before it, unknown anyway, 3.6), or its
 * loss was noted at the entry that overwrote it (enter). */
static __always_inline void count_drop(__u32 reason, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&drops, &reason);
	if (v)
		*v += n;
	if (reason == LW_DROP_RING_FULL || reason == LW_DROP_READ_FAULT)
		note_lost();
	/* A ring that filled between two fill checks (a small one): shed now. */
	if (reason == LW_DROP_RING_FULL && shed_on_bytes != ~0ull)
		shedding = 1;
}

/* fill_check updates shedding from how much the ring holds unread. */
static __always_inline __u64 fill_check(void)
{
	__u64 avail = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
	if (avail >= shed_on_bytes)
		shedding = 1;
	else if (avail <= shed_off_bytes && *(volatile __u32 *)&shedding)
		shedding = 0;
	return avail;
}

static __always_inline __u64 submit_flags(void)
{
	struct cpu_count *c = &cpu_counts[bpf_get_smp_processor_id() & (LW_COUNT_SLOTS - 1)];
	if (++c->n % LW_QUERY_EVERY)
		return BPF_RB_NO_WAKEUP;
	return fill_check() >= wakeup_bytes ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
}

/* shed_now says whether a counted copy's event is shed. While shedding,
 * few events are submitted, so the copies shed check the fill too. */
static __always_inline int shed_now(void)
{
	if (!*(volatile __u32 *)&shedding)
		return 0;
	struct cpu_count *c = &cpu_counts[bpf_get_smp_processor_id() & (LW_COUNT_SLOTS - 1)];
	if (++c->shed % LW_QUERY_EVERY == 0)
		fill_check();
	return *(volatile __u32 *)&shedding;
}

/* Fill the header and arguments. Arguments past the registers live on the
 * caller's stack (arch header); the cookie says how far the stack pointer
 * has moved if the probe site is past a push. */
static __always_inline void capture(struct lw_event *e, struct pt_regs *ctx, __u64 cookie, __u8 kind)
{
	__u64 id = current_id();
	__u8 n = LW_COOKIE_NARGS(cookie);
	__u64 sp = LW_SP(ctx) + LW_COOKIE_SPDELTA(cookie);

	e->kind = kind;
	e->flags = 0;
	e->probe = LW_COOKIE_PROBE(cookie);
	e->pid = id >> 32;
	e->tid = (__u32)id;
	e->batch_index = 0;
	e->ts_ns = bpf_ktime_get_ns();
	e->ret_ts_ns = 0;
	e->ret = 0;
	e->out = 0;
	e->caller = 0;
	LW_CAPTURE_REGS(e, ctx);
	if (n > LW_REG_ARGS) {
		__u32 size = (n - LW_REG_ARGS) * 8;
		if (size > (LW_MAX_ARGS - LW_REG_ARGS) * 8)
			size = (LW_MAX_ARGS - LW_REG_ARGS) * 8;
		if (bpf_probe_read_user(&e->args[LW_REG_ARGS], size, (void *)LW_STACK_ARGS(sp)))
			count_drop(LW_DROP_READ_FAULT, 1);
	}
}

#include "vmtypes.h" /* struct file, struct vm_area_struct, ... (CO-RE) */

/* find_code fills a range from the mapping that holds the caller: the
 * mapping's bounds, and whether its file is a CUDA runtime (libcudart*). */
static long find_code(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
	struct lw_code_range *r = data;
	r->start = vma->vm_start;
	r->end = vma->vm_end;
	char name[16] = {};
	const unsigned char *p = BPF_CORE_READ(vma, vm_file, f_path.dentry, d_name.name);
	if (p && bpf_probe_read_kernel_str(name, sizeof(name), p) > 0) {
		const char want[] = "libcudart";
		r->runtime = 1;
		for (int i = 0; i < sizeof(want) - 1; i++)
			if (name[i] != want[i])
				r->runtime = 0;
	}
	return 0;
}

/* caller_flags says whether the caller lies in a CUDA runtime library: a
 * driver call the runtime made is reported under the runtime call
 * (docs/design.md, "One pair per call"). Decided here, while the process
 * lives, from the thread's cache of ranges, or once per range from the
 * process's mappings. */
static __always_inline __u8 caller_flags(struct lw_slots *s, __u64 caller)
{
	for (int i = 0; i < LW_NRANGES; i++)
		if (caller >= s->code[i].start && caller < s->code[i].end)
			return s->code[i].runtime ? LW_F_VIA_RUNTIME : 0;
	struct lw_code_range r = {};
	long err = bpf_find_vma(bpf_get_current_task_btf(), caller, find_code, &r, 0);
	/* bpf_find_vma only try-locks the mmap lock: a thread of the process
	 * mapping or unmapping memory makes it answer -EBUSY. Nothing cached;
	 * the agent reads the process's maps instead. */
	if (err == -LW_EBUSY)
		return LW_F_CALLER_UNRESOLVED;
	if (err || r.end <= r.start)
		return 0;
	__u32 i = s->next_code++ & (LW_NRANGES - 1);
	s->code[i] = r;
	return r.runtime ? LW_F_VIA_RUNTIME : 0;
}

/* slots_of is the thread's in-flight calls, created on a thread's first
 * probed call when create is set. */
static __always_inline struct lw_slots *slots_of(__u64 create)
{
	return bpf_task_storage_get(&inflight, bpf_get_current_task_btf(), 0, create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
}

/* classify notes who called (rows with LW_COOKIE_CALLER): the runtime, or
 * the application (or a static runtime) calling the driver directly. */
static __always_inline void classify(struct lw_slots *s, struct lw_event *e, __u64 caller)
{
	e->caller = caller;
	if (caller)
		e->flags |= caller_flags(s, caller);
}

/* enter keeps a call's arguments in the thread's slot for its return. The
 * caller is classified at return, where the uretprobe's ip is the return
 * address for free; a program that emits at entry (lw_batch) asks for it
 * now, from the stack. */
static __always_inline struct lw_event *enter(struct pt_regs *ctx, __u64 cookie, int caller_now)
{
	struct lw_slots *s = slots_of(1);
	if (!s) {
		note_lost(); /* no slot memory: this call will not be reported */
		return NULL;
	}
	struct lw_event *e = &s->slot[LW_COOKIE_SLOT(cookie)];
	if (e->kind && LW_COOKIE_SLOT(cookie) == LW_SLOT_NESTS && LW_SP(ctx) < s->nest_sp) {
		s->nested++; /* the library's own call (enum lw_slot): its return is skipped */
		return NULL;
	}
	/* A call still in the slot never returned through its probe (a nested
	 * call of its layer, a lost return): it will not be reported. */
	if (e->kind)
		note_lost();
	capture(e, ctx, cookie, LW_EV_CALL);
	if (LW_COOKIE_SLOT(cookie) == LW_SLOT_NESTS) {
		s->nest_sp = LW_SP(ctx);
		s->nested = 0; /* left by returns that never came */
	}
	if (caller_now && LW_COOKIE_CALLER(cookie)) {
		__u64 ret = 0;
#if defined(__TARGET_ARCH_arm64)
		ret = LW_LINK(ctx); /* the probe sits at the entry, before x30 is saved */
#else
		if (bpf_probe_read_user(&ret, sizeof(ret), (void *)(LW_SP(ctx) + LW_COOKIE_SPDELTA(cookie))))
			count_drop(LW_DROP_READ_FAULT, 1);
#endif
		classify(s, e, ret);
	}
	return e;
}

/* saved_entry is the call lw_call_enter (or lw_batch, lw_copy2d_enter) kept
 * for this thread and probe, and *sp the thread's slots; a return without
 * it (entered before the attach, a nested call of the same layer, no slot
 * memory) is counted, never silent. */
static __always_inline struct lw_event *saved_entry(__u64 cookie, struct lw_slots **sp)
{
	struct lw_slots *s = slots_of(0);
	if (s && s->nested && LW_COOKIE_SLOT(cookie) == LW_SLOT_NESTS) {
		s->nested--; /* a nested call's return (enum lw_slot), innermost first */
		return NULL;
	}
	struct lw_event *in = s ? &s->slot[LW_COOKIE_SLOT(cookie)] : NULL;
	if (!in || in->kind == 0 || in->probe != LW_COOKIE_PROBE(cookie)) {
		count_drop(LW_DROP_NO_ENTRY, 1);
		return NULL;
	}
	*sp = s;
	return in;
}

SEC("uprobe.multi")
int lw_call(struct pt_regs *ctx)
{
	if (foreign())
		return 0;
	__u64 cookie = bpf_get_attach_cookie(ctx);
	struct lw_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_drop(LW_DROP_RING_FULL, 1);
		return 0;
	}
	capture(e, ctx, cookie, LW_EV_CALL);
	e->flags |= lost_flags(e->pid);
	/* A library was just loaded: wake the reader, so the agent probes it
	 * before the process's first calls into it where it can. */
	bpf_ringbuf_submit(e, LW_COOKIE_WAKE(cookie) ? BPF_RB_FORCE_WAKEUP : submit_flags());
	return 0;
}

SEC("uprobe.multi")
int lw_call_enter(struct pt_regs *ctx)
{
	if (foreign())
		return 0;
	enter(ctx, bpf_get_attach_cookie(ctx), 0);
	return 0;
}

/* emit_name sends the name a call was given, in LW_EV_NAME pieces headed
 * like the call (enum lw_name), before the call's own event: user space
 * joins them to it by thread. A piece that cannot be read ends the name
 * (counted); the call then names nothing. */
static __always_inline void emit_name(struct lw_event *in)
{
	__u64 name = in->args[LW_NAME_ARG];
	if (!name)
		return;
	__u64 ts = bpf_ktime_get_ns();
	for (__u32 i = 0; i < LW_NAME_PIECES; i++) {
		struct lw_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
		if (!e) {
			count_drop(LW_DROP_RING_FULL, 1);
			return;
		}
		__builtin_memcpy(e, in, sizeof(*e));
		e->kind = LW_EV_NAME;
		e->batch_index = i;
		e->ret_ts_ns = ts;
		long n = bpf_probe_read_user_str(e->args, LW_NAME_PIECE, (void *)(name + i * (LW_NAME_PIECE - 1)));
		if (n <= 0) {
			count_drop(LW_DROP_READ_FAULT, 1);
			bpf_ringbuf_discard(e, 0);
			return;
		}
		e->ret = n;
		e->flags |= lost_flags(e->pid);
		bpf_ringbuf_submit(e, submit_flags());
		if (n < LW_NAME_PIECE)
			return;
	}
}

/* arg_at is argument slot i - 1 of e, 0 for i = 0 (struct lw_count_row).
 * Constant indexes: the verifier cannot bound args[i - 1]. */
static __always_inline __u64 arg_at(const struct lw_event *e, __u8 i)
{
	__u64 v = 0;
	for (__u32 j = 0; j < LW_MAX_ARGS; j++)
		if (j + 1 == i)
			v = e->args[j];
	return v;
}

/* count_copy adds a call kept at entry to its flow's totals when its row
 * is a counted copy and it returned success (CUresult and cudaError_t: 0).
 * Called before the call's event is reserved: a full ring loses no count.
 * It returns the flow's totals, or NULL: not counted, or counted as the
 * flow's first call (whose event is never shed). */
static __always_inline struct lw_flow_total *count_copy(const struct lw_event *in, __u64 rc)
{
	__u32 row = in->probe;
	const struct lw_count_row *r = bpf_map_lookup_elem(&count_rows, &row);
	if (!r || !r->bytes || (__u32)rc)
		return NULL;
	struct lw_flow k = {.pid = in->pid, .probe = in->probe, .stream = arg_at(in, r->stream), .kind = arg_at(in, r->kind)};
	__u64 bytes = arg_at(in, r->bytes);
	if (r->height)
		bytes *= arg_at(in, r->height);
	struct lw_flow_total *t = bpf_map_lookup_elem(&flows, &k);
	if (!t) {
		struct lw_flow_total first = {.calls = 1, .bytes = bytes};
		long err = bpf_map_update_elem(&flows, &k, &first, BPF_NOEXIST);
		if (!err)
			return NULL;
		/* Another CPU made it first, or no room. */
		if (err != -LW_EEXIST || !(t = bpf_map_lookup_elem(&flows, &k))) {
			__sync_fetch_and_add(&flows_full, 1);
			return NULL;
		}
	}
	__sync_fetch_and_add(&t->calls, 1);
	__sync_fetch_and_add(&t->bytes, bytes);
	return t;
}

/* call_return emits a call kept at entry with its result; with_name, the
 * name it was given first (enum lw_name), when it succeeded. */
static __always_inline int call_return(struct pt_regs *ctx, int with_name)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	struct lw_slots *s;
	struct lw_event *in = saved_entry(cookie, &s);
	if (!in)
		return 0;
	struct lw_flow_total *flow = count_copy(in, LW_RC(ctx));
	if (flow && shed_now()) {
		__sync_fetch_and_add(&flow->shed, 1);
		in->kind = 0;
		return 0;
	}
	if (with_name && (__u32)LW_RC(ctx) == 0)
		emit_name(in);
	struct lw_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_drop(LW_DROP_RING_FULL, 1);
		in->kind = 0;
		return 0;
	}
	__builtin_memcpy(e, in, sizeof(*e));
	in->kind = 0;
	e->kind = LW_EV_CALL;
	e->ret_ts_ns = bpf_ktime_get_ns();
	e->ret = LW_RC(ctx);
	/* At a uretprobe the kernel has put the return address back in ip. */
	if (LW_COOKIE_CALLER(cookie) && !e->caller)
		classify(s, e, LW_IP(ctx));
	__u32 out = LW_COOKIE_OUTARG(cookie);
	__u64 ptr = 0;
	/* Constant indexes: the verifier cannot bound args[out - 1]. */
	for (__u32 i = 0; i < LW_MAX_ARGS; i++)
		if (i + 1 == out)
			ptr = e->args[i];
	/* Or a field of the returned object (ibv_mr keys, a QP's context). */
	if (LW_COOKIE_OUTRET(cookie) && e->ret)
		ptr = e->ret + LW_COOKIE_OUTOFF(cookie);
	/* An int (a dma-buf fd) is read as 4 bytes: 8 could fault at a page end. */
	if (ptr && bpf_probe_read_user(&e->out, LW_COOKIE_OUTINT(cookie) ? 4 : sizeof(e->out), (void *)ptr))
		count_drop(LW_DROP_READ_FAULT, 1);
	/* And a string it wrote there (rows with LW_COOKIE_OUTSTR read at most
	 * LW_OUTSTR_ARG arguments, so these slots are free). */
	if (LW_COOKIE_OUTSTR(cookie) && ptr &&
	    bpf_probe_read_user(&e->args[LW_OUTSTR_ARG], LW_OUTSTR_BYTES, (void *)ptr))
		count_drop(LW_DROP_READ_FAULT, 1);
	e->flags |= lost_flags(e->pid);
	bpf_ringbuf_submit(e, submit_flags());
	return 0;
}

SEC("uretprobe.multi")
int lw_call_return(struct pt_regs *ctx)
{
	if (foreign())
		return 0;
	return call_return(ctx, 0);
}

/* cuModuleGetFunction and cuLibraryGetKernel (handle out, parent, const
 * char *name): the handle's name, read here at return (the driver has just
 * read it, so its pages are in), goes out ahead of the call. */
SEC("uretprobe.multi")
int lw_name_return(struct pt_regs *ctx)
{
	if (foreign())
		return 0;
	return call_return(ctx, 1);
}

/* cuLaunchKernelEx(config, f, ...) and cudaLaunchKernelExC(config, func,
 * ...): the grid, block, shared memory and stream are in the config (enum
 * lw_launch_arg), read at entry; the result at return. */
SEC("uprobe.multi")
int lw_launch_ex_enter(struct pt_regs *ctx)
{
	if (foreign())
		return 0;
	struct lw_event *e = enter(ctx, bpf_get_attach_cookie(ctx), 0);
	if (!e)
		return 0;
	__u64 w[LW_LAUNCH_CONFIG_BYTES / 8] = {};
	if (bpf_probe_read_user(w, sizeof(w), (void *)e->args[0]))
		count_drop(LW_DROP_READ_FAULT, 1);
	e->args[LW_LAUNCH_DIMS] = w[0];
	e->args[LW_LAUNCH_DIMS + 1] = w[1];
	e->args[LW_LAUNCH_DIMS + 2] = w[2];
	e->args[LW_LAUNCH_SHMEM] = w[3];
	e->args[LW_LAUNCH_STREAM] = w[LW_LAUNCH_STREAM_OFF / 8];
	return 0;
}

/* cuMemCreate(handle, size, const CUmemAllocationProp *prop) and
 * cuMemPoolCreate(pool, const CUmemPoolProps *props): where the memory will
 * live is in the struct, the last argument the row reads; its location goes
 * to args[LW_PROP_LOCATION] at entry (0, an invalid location, if unread). */
SEC("uprobe.multi")
int lw_prop_enter(struct pt_regs *ctx)
{
	if (foreign())
		return 0;
	__u64 cookie = bpf_get_attach_cookie(ctx);
	struct lw_event *e = enter(ctx, cookie, 0);
	if (!e)
		return 0;
	__u8 n = LW_COOKIE_NARGS(cookie);
	__u64 ptr = 0;
	/* Constant indexes: the verifier cannot bound args[n - 1]. */
	for (__u32 i = 0; i < 6; i++)
		if (i + 1 == n)
			ptr = e->args[i];
	__u32 loc[2] = {};
	if (ptr && bpf_probe_read_user(loc, sizeof(loc), (void *)(ptr + LW_PROP_LOCATION_OFF))) {
		count_drop(LW_DROP_READ_FAULT, 1);
		loc[0] = loc[1] = 0;
	}
	e->args[LW_PROP_LOCATION] = loc[0] | (__u64)loc[1] << 32;
	return 0;
}

/* cuMemcpy2D*(const CUDA_MEMCPY2D *p[, stream]): the copy is described by a
 * struct, read whole at entry; its addresses, row bytes, rows and memory
 * types go to the argument slots of enum lw_copy2d_arg. */
SEC("uprobe.multi")
int lw_copy2d_enter(struct pt_regs *ctx)
{
	if (foreign())
		return 0;
	struct lw_event *e = enter(ctx, bpf_get_attach_cookie(ctx), 0);
	if (!e)
		return 0;
	__u64 m[LW_M2D_WORDS] = {};
	if (bpf_probe_read_user(m, sizeof(m), (void *)e->args[0])) {
		count_drop(LW_DROP_READ_FAULT, 1);
		return 0;
	}
	__u64 src = (__u32)m[LW_M2D_SRC_TYPE] == LW_CU_MEMORYTYPE_HOST ? m[LW_M2D_SRC_HOST] : m[LW_M2D_SRC_DEVICE];
	__u64 dst = (__u32)m[LW_M2D_DST_TYPE] == LW_CU_MEMORYTYPE_HOST ? m[LW_M2D_DST_HOST] : m[LW_M2D_DST_DEVICE];
	e->args[LW_C2D_SRC] = src + m[LW_M2D_SRC_Y] * m[LW_M2D_SRC_PITCH] + m[LW_M2D_SRC_X];
	e->args[LW_C2D_DST] = dst + m[LW_M2D_DST_Y] * m[LW_M2D_DST_PITCH] + m[LW_M2D_DST_X];
	e->args[LW_C2D_WIDTH] = m[LW_M2D_WIDTH];
	e->args[LW_C2D_HEIGHT] = m[LW_M2D_HEIGHT];
	e->args[LW_C2D_TYPES] = (__u32)m[LW_M2D_SRC_TYPE] | (__u64)(__u32)m[LW_M2D_DST_TYPE] << 32;
	return 0;
}

/* cu/cudaMemcpyBatchAsync(dsts, srcs, sizes, count, ...): one event per
 * entry, args[0..2] replaced by that entry's dst, src and size; the call
 * itself stays in the slot for lw_call_return to report its result. */
SEC("uprobe.multi")
int lw_batch(struct pt_regs *ctx)
{
	if (foreign())
		return 0;
	struct lw_event *call = enter(ctx, bpf_get_attach_cookie(ctx), 1);
	if (!call)
		return 0;
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
		e->kind = LW_EV_BATCH_ENTRY;
		e->batch_index = i;
		if (bpf_probe_read_user(&e->args[0], 8, (void *)(dsts + i * 8)) ||
		    bpf_probe_read_user(&e->args[1], 8, (void *)(srcs + i * 8)) ||
		    bpf_probe_read_user(&e->args[2], 8, (void *)(sizes + i * 8)))
			count_drop(LW_DROP_READ_FAULT, 1);
		e->flags |= lost_flags(e->pid);
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
	e->flags = lost_flags(pid);
	/* Process events are rare and the reader wants them promptly. */
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(lw_exec, struct task_struct *p)
{
	/* p is the current task, execing: its ids as the agent sees them. */
	__u64 id = current_id();
	if (!id)
		return 0;
	emit_process(LW_EV_EXEC, id >> 32, (__u32)id);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(lw_exit, struct task_struct *p)
{
	/* p is the current task, exiting: its ids as the agent sees them. */
	__u64 id = current_id();
	__u32 pid = (__u32)id, tgid = id >> 32;
	if (!id || pid != tgid)
		return 0;
	emit_process(LW_EV_EXIT, tgid, pid);
	/* Its losses die with it, said or not (a lost exit event included). */
	__u32 key = tgid;
	if (*(volatile __u64 *)&lost_waiting && bpf_map_delete_elem(&lost, &key) == 0)
		__sync_fetch_and_add(&lost_waiting, -1);
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
	__u64 id = current_id();
	__u64 qp = LW_ARG0(ctx), wr = LW_ARG1(ctx), ts = bpf_ktime_get_ns();
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
		e->flags |= lost_flags(e->pid);
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
	if (foreign())
		return 0;
	return walk_wrs(ctx, 1);
}

SEC("uprobe.multi")
int lw_post_recv(struct pt_regs *ctx)
{
	if (foreign())
		return 0;
	return walk_wrs(ctx, 0);
}

/* ibv_modify_qp(qp, attr, attr_mask): the QP's number, its destination QP
 * and address vector (enum lw_qp_arg) at entry; the result at return. */
SEC("uprobe.multi")
int lw_modify_qp_enter(struct pt_regs *ctx)
{
	if (foreign())
		return 0;
	struct lw_event *e = enter(ctx, bpf_get_attach_cookie(ctx), 0);
	if (!e)
		return 0;
	__u64 qp = e->args[0], attr = e->args[1], ah[4] = {};
	__u32 qp_num = 0, dest = 0;
	if (bpf_probe_read_user(&qp_num, sizeof(qp_num), (void *)(qp + IBV_QP_QP_NUM)) ||
	    bpf_probe_read_user(&dest, sizeof(dest), (void *)(attr + LW_QP_DEST_QPN_OFF)) ||
	    bpf_probe_read_user(ah, sizeof(ah), (void *)(attr + LW_QP_AH_ATTR_OFF)))
		count_drop(LW_DROP_READ_FAULT, 1);
	e->args[LW_QP_NUMS] = qp_num | (__u64)dest << 32;
	e->args[LW_QP_DGID] = ah[0];
	e->args[LW_QP_DGID + 1] = ah[1];
	e->args[LW_QP_AV] = ah[3];
	return 0;
}

/* poll_cq(cq, num_entries, wc): the entry half is lw_call_enter; at return
 * one event per completion the call wrote. Empty polls emit nothing. */
SEC("uretprobe.multi")
int lw_poll_cq_return(struct pt_regs *ctx)
{
	if (foreign())
		return 0;
	__u64 cookie = bpf_get_attach_cookie(ctx);
	struct lw_slots *s;
	struct lw_event *in = saved_entry(cookie, &s);
	if (!in)
		return 0;
	__s64 n = (__s64)LW_RC(ctx);
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
		e->flags |= lost_flags(e->pid);
		bpf_ringbuf_submit(e, submit_flags());
	}
	if (n > LW_MAX_WC)
		count_drop(LW_DROP_WR_TRUNC, n - LW_MAX_WC);
	in->kind = 0;
	return 0;
}

/* ucp_put_nbx, ucp_get_nbx, ucp_tag_send_nbx, ucp_am_send_nbx: one shape
 * (enum lw_ucp_arg) whatever the row, told apart by how many arguments it
 * reads (6, 5, 7), and the request parameters; the result at return. */
SEC("uprobe.multi")
int lw_ucp_enter(struct pt_regs *ctx)
{
	if (foreign())
		return 0;
	__u64 cookie = bpf_get_attach_cookie(ctx);
	struct lw_event *e = enter(ctx, cookie, 0);
	if (!e)
		return 0;
	switch (LW_COOKIE_NARGS(cookie)) {
	case 5: /* tag send: (ep, buffer, count, tag, param) */
		e->args[LW_UCP_PARAM] = e->args[4];
		break;
	case 7: { /* am send: (ep, id, header, header_length, buffer, count, param) */
		__u64 id = e->args[1];
		e->args[LW_UCP_BUFFER] = e->args[4];
		e->args[LW_UCP_COUNT] = e->args[5];
		e->args[LW_UCP_REMOTE] = id;
		e->args[LW_UCP_PARAM] = e->args[6];
		break;
	}
	}
	__u64 param = e->args[LW_UCP_PARAM];
	__u32 mask = 0, memtype = 0;
	__u64 memh = 0, datatype = 0;
	if (param && (bpf_probe_read_user(&mask, sizeof(mask), (void *)param) ||
		      bpf_probe_read_user(&datatype, sizeof(datatype), (void *)(param + LW_UCP_PARAM_DATATYPE_OFF)) ||
		      bpf_probe_read_user(&memtype, sizeof(memtype), (void *)(param + LW_UCP_PARAM_MEMTYPE_OFF)) ||
		      bpf_probe_read_user(&memh, sizeof(memh), (void *)(param + LW_UCP_PARAM_MEMH_OFF))))
		count_drop(LW_DROP_READ_FAULT, 1);
	e->args[LW_UCP_DATATYPE] = mask & LW_UCP_FIELD_DATATYPE ? datatype : LW_UCP_CONTIG_BYTES;
	e->args[LW_UCP_PARAM_MASK] = mask | (__u64)memtype << 32;
	e->args[LW_UCP_PARAM_MEMH] = memh;
	e->args[LW_UCP_LANE] = 0;
	return 0;
}

/* A UCT endpoint operation (put, get, am: the transports' data path).
 * Nested in a UCP call on this thread, the first one notes its interface
 * (struct uct_ep's first word, uct/api/tl.h) and row in that call's slot,
 * and every one counts; outside one (a fragment sent from the worker's
 * progress) it does nothing. It never emits: a TCP put makes ~130 of these. */
SEC("uprobe.multi")
int lw_uct_lane(struct pt_regs *ctx)
{
	if (foreign())
		return 0;
	__u64 cookie = bpf_get_attach_cookie(ctx);
	struct lw_slots *s = slots_of(0);
	if (!s)
		return 0;
	struct lw_event *e = &s->slot[LW_COOKIE_SLOT(cookie)];
	if (!e->kind)
		return 0;
	__u64 lane = e->args[LW_UCP_LANE];
	if (!e->out) {
		__u64 iface = 0;
		if (bpf_probe_read_user(&iface, sizeof(iface), (void *)LW_ARG0(ctx)))
			count_drop(LW_DROP_READ_FAULT, 1);
		e->out = iface;
		lane = LW_COOKIE_PROBE(cookie);
	}
	e->args[LW_UCP_LANE] = lane + (1 << 16);
	return 0;
}

/* uct_iface_open(md, worker, params, config, iface_p): the transport and
 * device names (enum lw_uct_iface_arg) at entry; *iface_p at return. */
SEC("uprobe.multi")
int lw_uct_iface_enter(struct pt_regs *ctx)
{
	if (foreign())
		return 0;
	struct lw_event *e = enter(ctx, bpf_get_attach_cookie(ctx), 0);
	if (!e)
		return 0;
	__u64 params = e->args[2], mask = 0, mode = 0, names[2] = {};
	e->args[LW_UCT_IFACE_TL] = e->args[LW_UCT_IFACE_TL + 1] = 0;
	e->args[LW_UCT_IFACE_DEV] = e->args[LW_UCT_IFACE_DEV + 1] = 0;
	if (!params || bpf_probe_read_user(&mask, sizeof(mask), (void *)params) ||
	    bpf_probe_read_user(&mode, sizeof(mode), (void *)(params + LW_UCT_IFACE_MODE_OFF)) ||
	    bpf_probe_read_user(names, sizeof(names), (void *)(params + LW_UCT_IFACE_TL_OFF))) {
		count_drop(LW_DROP_READ_FAULT, 1);
		return 0;
	}
	/* Other open modes (a socket address, a server) name no device. */
	if (!(mask & LW_UCT_FIELD_OPEN_MODE) || !(mode & LW_UCT_OPEN_MODE_DEVICE))
		return 0;
	if ((names[0] && bpf_probe_read_user_str(&e->args[LW_UCT_IFACE_TL], LW_UCT_IFACE_NAME_BYTES, (void *)names[0]) < 0) ||
	    (names[1] && bpf_probe_read_user_str(&e->args[LW_UCT_IFACE_DEV], LW_UCT_IFACE_NAME_BYTES, (void *)names[1]) < 0))
		count_drop(LW_DROP_READ_FAULT, 1);
	return 0;
}

/* ucp_mem_map(context, params, memh_p): the range and memory type (enum
 * lw_ucp_mem_map_arg) at entry; *memh_p at return. */
SEC("uprobe.multi")
int lw_ucp_mem_map_enter(struct pt_regs *ctx)
{
	if (foreign())
		return 0;
	struct lw_event *e = enter(ctx, bpf_get_attach_cookie(ctx), 0);
	if (!e)
		return 0;
	__u64 p = e->args[1], w[5] = {}; /* field_mask, address, length, flags|prot, memory_type */
	if (p && bpf_probe_read_user(w, sizeof(w), (void *)p))
		count_drop(LW_DROP_READ_FAULT, 1);
	e->args[LW_UMM_ADDRESS] = w[LW_UMM_ADDRESS_OFF / 8];
	e->args[LW_UMM_LENGTH] = w[LW_UMM_LENGTH_OFF / 8];
	e->args[LW_UMM_MASK] = (__u32)w[0] | (__u64)(__u32)w[LW_UMM_MEMTYPE_OFF / 8] << 32;
	e->args[LW_UMM_FLAGS] = (__u32)w[LW_UMM_FLAGS_OFF / 8];
	return 0;
}

/* libfabric's sendmsg, tsendmsg (rma 0) and writemsg, readmsg (rma 1):
 * the message's bytes, first local buffer, context and, for RMA, first
 * remote address (enum lw_fabric_msg_arg) at entry; the result at return. */
static __always_inline int fabric_msg_enter(struct pt_regs *ctx, int rma)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	struct lw_event *e = enter(ctx, cookie, 0);
	if (!e)
		return 0;
	__u64 msg = e->args[1], m[3] = {}; /* msg_iov, desc, iov_count */
	e->args[LW_FMSG_BYTES] = 0;
	e->args[LW_FMSG_LOCAL] = 0;
	e->args[LW_FMSG_CONTEXT] = 0;
	e->args[LW_FMSG_REMOTE] = 0;
	if (!msg || bpf_probe_read_user(m, sizeof(m), (void *)msg)) {
		count_drop(LW_DROP_READ_FAULT, 1);
		e->args[LW_FMSG_BYTES] = LW_FMSG_MANY;
		return 0;
	}
	if (m[LW_FMSG_IOV_COUNT_OFF / 8] > LW_FMSG_IOVS)
		e->args[LW_FMSG_BYTES] = LW_FMSG_MANY;
	for (__u32 i = 0; i < LW_FMSG_IOVS; i++) {
		__u64 iov[2]; /* struct iovec: base, len */
		if (i >= m[LW_FMSG_IOV_COUNT_OFF / 8] || (i > 0 && e->args[LW_FMSG_BYTES] == LW_FMSG_MANY))
			break;
		if (bpf_probe_read_user(iov, sizeof(iov), (void *)(m[0] + i * sizeof(iov)))) {
			count_drop(LW_DROP_READ_FAULT, 1);
			e->args[LW_FMSG_BYTES] = LW_FMSG_MANY;
			break;
		}
		if (i == 0)
			e->args[LW_FMSG_LOCAL] = iov[0];
		if (e->args[LW_FMSG_BYTES] != LW_FMSG_MANY)
			e->args[LW_FMSG_BYTES] += iov[1];
	}
	if (bpf_probe_read_user(&e->args[LW_FMSG_CONTEXT], sizeof(__u64), (void *)(msg + LW_COOKIE_OUTOFF(cookie))))
		count_drop(LW_DROP_READ_FAULT, 1);
	__u64 rma_iov = 0;
	if (rma && (bpf_probe_read_user(&rma_iov, sizeof(rma_iov), (void *)(msg + LW_FMSG_RMA_IOV_OFF)) ||
		    (rma_iov && bpf_probe_read_user(&e->args[LW_FMSG_REMOTE], sizeof(__u64), (void *)rma_iov))))
		count_drop(LW_DROP_READ_FAULT, 1);
	return 0;
}

SEC("uprobe.multi")
int lw_fabric_msg_enter(struct pt_regs *ctx)
{
	if (foreign())
		return 0;
	return fabric_msg_enter(ctx, 0);
}

SEC("uprobe.multi")
int lw_fabric_rma_msg_enter(struct pt_regs *ctx)
{
	if (foreign())
		return 0;
	return fabric_msg_enter(ctx, 1);
}

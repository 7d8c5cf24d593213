// SPDX-License-Identifier: GPL-2.0
/* The dynamic linker's notification, with a hold (docs/design.md, "Attach
 * and discovery": "Held at the loader's notification").
 *
 * ld.so calls _dl_debug_state after it mapped a program's libraries or a
 * dlopen's, before it runs any of their code (constructors, then main or
 * the dlopen's return). When the process now maps a CUDA library
 * (libcuda.so*, libcudart.so*) whose file the agent has not inspected yet
 * (not in `known`), the thread waits here until the agent has probed it and
 * put it in `known`: its first CUDA call is then traced. The wait is a
 * bounded poll, in a sleepable program (no RCU read lock held: the
 * agent's attach needs a grace period), and ends when the file is known,
 * when the agent stopped beating (agent_beat_ns, so an agent that died
 * frees it), or after hold_max_ns; such an end is counted and the file put
 * in `known` so the next process does not wait for it too. A process that
 * maps nothing new pays a walk of its mappings at each notification.
 *
 * A separate object from lanewatch.bpf.c: kernels without sleepable
 * uprobes or the task VMA iterator refuse it, and the agent then attaches
 * lw_call here as before, without the hold. It shares the event ring. */
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

char LICENSE[] SEC("license") = "GPL";

const struct lw_file *unused_file __attribute__((unused));
const struct lw_verified *unused_verified __attribute__((unused));

#include "pidns.h"

/* The event ring of lanewatch.bpf.c (replaced at load). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} events SEC(".maps");

/* Files the agent has inspected (struct lw_file: its FileID), with what
 * came of it (LW_KNOWN_*). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LW_KNOWN_FILES);
	__type(key, struct lw_file);
	__type(value, __u8);
} known SEC(".maps");

/* What each process's notifications proved (struct lw_verified), by tgid:
 * the agent's late-attach decision reads it (agent.lateAttach). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LW_KNOWN_FILES);
	__type(key, __u32);
	__type(value, struct lw_verified);
} verified SEC(".maps");

volatile const __u64 hold_max_ns = 0;   /* the bound of one hold (probes.HoldBound) */
volatile const __u64 beat_stale_ns = 0; /* the agent is gone past this without a beat (probes.BeatStale) */
volatile __u64 agent_beat_ns;                        /* CLOCK_MONOTONIC, written by the agent */

/* Counters, read by the agent (lanewatch_linker_holds_total ...). */
__u64 holds;          /* holds begun */
__u64 hold_bound;     /* holds ended by hold_max_ns */
__u64 hold_agent_gone;/* holds ended because the agent stopped beating */
__u64 hold_ns;        /* total time held */
__u64 hold_ns_max;    /* the longest hold */
__u64 ring_full;      /* notifications not sent (ring full): their holds are not begun */
__u64 hold_unwalked;  /* walks that could not look (a writer held the mmap lock): held, and retried */

#include "vmtypes.h" /* struct file, struct vm_area_struct, ... (CO-RE) */
struct mm_struct;

struct bpf_iter_task_vma {
	__u64 __opaque[1];
} __attribute__((aligned(8)));
extern int bpf_iter_task_vma_new(struct bpf_iter_task_vma *it, struct task_struct *task, __u64 addr) __ksym;
extern struct vm_area_struct *bpf_iter_task_vma_next(struct bpf_iter_task_vma *it) __ksym;
extern void bpf_iter_task_vma_destroy(struct bpf_iter_task_vma *it) __ksym;

/* cuda_named says whether a file name starts libcuda.so or libcudart.so
 * (the agent's looksLikeCUDA). */
static __always_inline int cuda_named(const char *n)
{
	const char a[] = "libcuda";
	for (int i = 0; i < sizeof(a) - 1; i++)
		if (n[i] != a[i])
			return 0;
	if (n[7] == '.' && n[8] == 's' && n[9] == 'o')
		return 1;
	return n[7] == 'r' && n[8] == 't' && n[9] == '.' && n[10] == 's' && n[11] == 'o';
}

/* What unknown_cuda found (bits): a CUDA file not in `known` (its file in
 * *want), a CUDA file the agent inspected but could not probe. */
enum { LW_NEW_FILE = 1, LW_UNPROBED_FILE = 2 };

/* unknown_cuda walks the process's mappings of CUDA files; -1 when they
 * could not be walked (the iterator only try-locks the mmap lock: another
 * thread of the process was mapping memory, or the agent was installing
 * breakpoints in it): the process is then held, walking again every
 * LW_WALK_RETRY_NS. */
static __noinline int unknown_cuda(struct lw_file *want)
{
	struct bpf_iter_task_vma it;
	struct vm_area_struct *vma;
	int found = 0, walked = 0;
	__u64 prev = 0;
	if (bpf_iter_task_vma_new(&it, bpf_get_current_task_btf(), 0)) {
		bpf_iter_task_vma_destroy(&it);
		return -1;
	}
	while ((vma = bpf_iter_task_vma_next(&it))) {
		walked = 1;
		struct file *f = BPF_CORE_READ(vma, vm_file);
		if (!f || (__u64)f == prev)
			continue; /* anonymous, or the same file's next segment */
		prev = (__u64)f;
		struct lw_file k = {};
		unsigned int dev = BPF_CORE_READ(f, f_inode, i_sb, s_dev);
		k.dev = (__u64)(dev >> 20) << 32 | (dev & 0xfffff); /* probes.FileID: major<<32 | minor */
		k.ino = BPF_CORE_READ(f, f_inode, i_ino);
		__u8 *v = bpf_map_lookup_elem(&known, &k);
		if (v) {
			if (*v != LW_KNOWN_PROBED)
				found |= LW_UNPROBED_FILE;
			continue;
		}
		char name[16] = {};
		const unsigned char *p = BPF_CORE_READ(f, f_path.dentry, d_name.name);
		if (!p || bpf_probe_read_kernel_str(name, sizeof(name), p) <= 0 || !cuda_named(name))
			continue;
		*want = k; /* the first: each round waits for one, then looks again */
		found |= LW_NEW_FILE;
		break;
	}
	bpf_iter_task_vma_destroy(&it);
	return walked ? found : -1;
}

struct hold_state {
	struct lw_file want; /* the file polled for */
	__u64 start;
	__u32 end;      /* 0 polls ran out, 1 known, 2 bound, 3 agent gone */
	__u32 unprobed; /* a CUDA file it maps has no probes */
	__u32 clean;    /* went on with every CUDA file it maps probed */
	__u32 walk;     /* the last walk could not look: wait a little, walk again */
	__u64 wait_from;
};

/* wait_step spins LW_WALK_RETRY_NS between walks that could not look (a
 * writer held the process's mmap lock: the agent installing breakpoints
 * in it, or another of its threads mapping memory). */
static long wait_step(__u64 i, void *data)
{
	struct hold_state *h = data;
	__u64 now = bpf_ktime_get_ns();
	if (now - h->start > hold_max_ns) {
		h->end = 2;
		return 1;
	}
	if (now - agent_beat_ns > beat_stale_ns) {
		h->end = 3;
		return 1;
	}
	return now - h->wait_from > LW_WALK_RETRY_NS;
}

/* hold_step polls for the file in `known`; every 256 polls it checks the
 * bound and the agent's beat. */
static long hold_step(__u64 i, void *data)
{
	struct hold_state *h = data;
	if (bpf_map_lookup_elem(&known, &h->want)) {
		h->end = 1;
		return 1;
	}
	if (i & 255)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	if (now - h->start > hold_max_ns) {
		h->end = 2;
		return 1;
	}
	if (now - agent_beat_ns > beat_stale_ns) {
		h->end = 3;
		return 1;
	}
	return 0;
}

/* note_verified records that the process goes on at now with every CUDA
 * file it maps probed (ok), or without that proven (a hold that gave up,
 * mappings not walked, a notification the agent missed). */
static __always_inline void note_verified(__u32 tgid, __u64 now, int ok)
{
	struct lw_verified *v = bpf_map_lookup_elem(&verified, &tgid);
	if (!v) {
		struct lw_verified nv = {};
		bpf_map_update_elem(&verified, &tgid, &nv, BPF_NOEXIST);
		v = bpf_map_lookup_elem(&verified, &tgid);
		if (!v)
			return;
	}
	if (ok)
		v->ok = now;
	else
		v->broken = now;
}

/* linker_event tells the agent that the process's libraries changed (a
 * rescan of it); held, the file it waits for in args[0..1] (zero when its
 * mappings could not be walked): an agent that cannot read the process
 * releases it by that. 1 when the ring was full. */
static __always_inline int linker_event(__u64 cookie, __u64 id, __u64 now, __u8 flags, struct lw_file *held)
{
	struct lw_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		__sync_fetch_and_add(&ring_full, 1);
		return 1;
	}
	__builtin_memset(e, 0, sizeof(*e));
	e->kind = LW_EV_CALL;
	e->probe = LW_COOKIE_PROBE(cookie);
	e->pid = id >> 32;
	e->tid = (__u32)id;
	e->ts_ns = now;
	e->flags = flags;
	if (held) {
		e->args[0] = held->dev;
		e->args[1] = held->ino;
	}
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
	return 0;
}

/* hold_round polls for one new file (at most 2^23 polls, bpf_loop's
 * limit), or, when the last walk could not look, waits LW_WALK_RETRY_NS;
 * then walks again. The time bound ends a hold long before the rounds run
 * out. */
static long hold_round(__u64 i, void *data)
{
	struct hold_state *h = data;
	h->end = 0;
	if (h->walk) {
		h->wait_from = bpf_ktime_get_ns();
		bpf_loop(1 << 23, wait_step, h, 0);
	} else {
		bpf_loop(1 << 23, hold_step, h, 0);
		if (!h->end)
			return 0; /* the polls ran out before the bound: poll on */
	}
	if (h->end > 1)
		return 1;
	int more = unknown_cuda(&h->want);
	h->walk = more < 0;
	if (more < 0) {
		__sync_fetch_and_add(&hold_unwalked, 1);
		return 0;
	}
	if (more & LW_UNPROBED_FILE)
		h->unprobed = 1;
	if (more & LW_NEW_FILE)
		return 0;
	h->end = 1;
	h->clean = !h->unprobed;
	return 1;
}

SEC("uprobe.multi.s")
int lw_linker_hold(struct pt_regs *ctx)
{
	if (foreign())
		return 0;
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u64 id = current_id();
	struct hold_state h = {};
	/* Hold only while an agent beats: none, nothing would release it. */
	__u64 now = bpf_ktime_get_ns();
	if (now - agent_beat_ns > beat_stale_ns)
		return linker_event(cookie, id, now, 0, NULL);
	__u32 tgid = id >> 32;
	int n = unknown_cuda(&h.want);
	if (n >= 0 && !(n & LW_NEW_FILE)) {
		/* Nothing new: proven when every CUDA file it maps is probed. */
		note_verified(tgid, now, n == 0);
		return linker_event(cookie, id, now, 0, NULL);
	}
	/* A new CUDA file, or mappings that could not be walked (a writer
	 * held the mmap lock: maybe the agent installing breakpoints here):
	 * held until a walk sees every CUDA file known. */
	if (n < 0)
		__sync_fetch_and_add(&hold_unwalked, 1);
	if (linker_event(cookie, id, now, LW_F_HELD, &h.want)) {
		note_verified(tgid, now, 0);
		return 0; /* the agent would not hear of it: no hold */
	}

	__sync_fetch_and_add(&holds, 1);
	h.start = now;
	h.walk = n < 0;
	h.unprobed = n > 0 && (n & LW_UNPROBED_FILE);
	bpf_loop(LW_HOLD_ROUNDS, hold_round, &h, 0);
	__u64 end = bpf_ktime_get_ns(), took = end - h.start;
	__sync_fetch_and_add(&hold_ns, took);
	if (took > hold_ns_max)
		hold_ns_max = took; /* racy between CPUs: a maximum, good enough */
	note_verified(tgid, end, h.clean);
	if (h.end == 1)
		return 0; /* released: every CUDA file known (clean: all probed) */
	__sync_fetch_and_add(h.end == 3 ? &hold_agent_gone : &hold_bound, 1);
	/* Given up: the next process mapping the file does not wait too. */
	__u8 given_up = LW_KNOWN_UNPROBED;
	if (!h.walk)
		bpf_map_update_elem(&known, &h.want, &given_up, BPF_NOEXIST);
	return 0;
}

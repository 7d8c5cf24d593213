// SPDX-License-Identifier: GPL-2.0
/* Storage reads of the watched processes (docs/design.md, "The storage
 * leg"): at the return of read, pread64, preadv and preadv2 that read
 * something, the fd, the buffer (the first iovec's for the vector forms) and
 * the byte count. The fd's file and the buffer's pages are resolved in Go.
 *
 * One raw BTF tracepoint at syscall exit (tp_btf/sys_exit: no tracefs
 * needed): it runs at the exit of every system call on the host while
 * attached, so it is off unless asked for (--trace-storage-reads), and it
 * leaves after two compares for any other call and after one hash lookup for
 * any other process. io_uring and GPUDirect Storage (cuFile) reads make none
 * of these calls and are not seen. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

#if defined(__TARGET_ARCH_arm64)
/* The kernel's arm64 pt_regs: user registers, then orig_x0 (x0 is the
 * result by now) and the syscall number. */
struct lw_kregs {
	unsigned long regs[31];
	unsigned long sp, pc, pstate;
	unsigned long orig_x0;
	int syscallno;
	int pad; /* -Wpadded: the kernel's next field */
};
#define LW_NR_READ 63
#define LW_NR_PREAD64 67
#define LW_NR_PREADV 69
#define LW_NR_PREADV2 286
#define LW_SYSNO(r) ((long)(r).syscallno)
#define LW_FD(r) ((r).orig_x0)
#define LW_BUF(r) ((r).regs[1])
#else
/* x86-64: the entry's registers stay in the frame; ax holds the result. */
struct lw_kregs {
	unsigned long r15, r14, r13, r12, bp, bx, r11, r10, r9, r8;
	unsigned long ax, cx, dx, si, di, orig_ax;
};
#define LW_NR_READ 0
#define LW_NR_PREAD64 17
#define LW_NR_PREADV 295
#define LW_NR_PREADV2 327
#define LW_SYSNO(r) ((long)(r).orig_ax)
#define LW_FD(r) ((r).di)
#define LW_BUF(r) ((r).si)
#endif

struct lw_storage_read {
	__u64 time_ns;
	__u64 buf;   /* the buffer, or the first iovec's base */
	__s64 bytes; /* what the call returned (> 0) */
	__u32 pid, tid;
	__s32 fd;
	__u32 nr; /* the system call */
};
const struct lw_storage_read *unused_storage_read __attribute__((unused));

/* The watched processes (tgid as the agent sees them), set from Go. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u8);
} storage_pids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} storage_reads SEC(".maps");

/* Reads lost to a full ring, counted. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} storage_drops SEC(".maps");

#include "pidns.h" /* pidns_dev, pidns_ino, current_id: the same namespace as lanewatch.bpf.c's */

struct lw_iovec {
	__u64 base, len;
};

SEC("tp_btf/sys_exit")
int BPF_PROG(lw_storage_exit, void *regs, long ret)
{
	if (ret <= 0)
		return 0;
	struct lw_kregs r;
	if (bpf_probe_read_kernel(&r, sizeof(r), regs))
		return 0;
	long nr = LW_SYSNO(r);
	if (nr != LW_NR_READ && nr != LW_NR_PREAD64 && nr != LW_NR_PREADV && nr != LW_NR_PREADV2)
		return 0;
	__u64 id = current_id();
	__u32 tgid = id >> 32;
	if (!id || !bpf_map_lookup_elem(&storage_pids, &tgid))
		return 0;
	__u64 buf = LW_BUF(r);
	if (nr == LW_NR_PREADV || nr == LW_NR_PREADV2) {
		struct lw_iovec iov = {};
		bpf_probe_read_user(&iov, sizeof(iov), (void *)buf);
		buf = iov.base;
	}
	struct lw_storage_read *e = bpf_ringbuf_reserve(&storage_reads, sizeof(*e), 0);
	if (!e) {
		__u32 k = 0;
		__u64 *n = bpf_map_lookup_elem(&storage_drops, &k);
		if (n)
			*n += 1;
		return 0;
	}
	e->time_ns = bpf_ktime_get_ns();
	e->buf = buf;
	e->bytes = ret;
	e->pid = tgid;
	e->tid = (__u32)id;
	e->fd = (__s32)LW_FD(r);
	e->nr = (__u32)nr;
	bpf_ringbuf_submit(e, 0);
	return 0;
}

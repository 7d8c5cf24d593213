/*
 * rdmapath --scenario NAME --truth-dir DIR [--pages N] [--page-bytes B] [--timeout-s S] [--settle-ms MS]
 *          [--settle-file PATH]
 *
 * The PD-disaggregation scenarios of the reference data path. The launcher
 * re-executes itself twice (/proc/self/exe --role prefill|decode), so an observer
 * sees each role start with an exec; the roles talk verbs to the reference
 * provider (build/rdma/libibverbs.so.1, through RUNPATH), CUDA to the plain
 * reference runtime, and meet in the wire's rendezvous area (no sockets). Each
 * role writes DIR/<scenario>-<role>.jsonl: its CUDA calls (kvpath's truth
 * writer), its verbs registrations, every WR it posted and every completion it
 * polled, then an end line with its measured rates.
 *
 * Scenarios:
 *   pd-transfer     prefill WRITE_WITH_IMMs N pages from its GPU into decode's GPU
 *   pd-overlap      the same from pinned host memory, alone, then while decode runs
 *                   the hicache-load pattern (both inbound on gpu-decode), the two in
 *                   lockstep (LOCKSTEP_AHEAD): in flight together by construction
 *   pd-send-duplex  decode RDMA_WRITEs out of its GPU (outbound) while loading (inbound)
 *   rdma-read       decode READs pages from prefill's GPU into its own (inbound), then
 *                   one READ with a bad rkey (IBV_WC_REM_ACCESS_ERR)
 *   rdma-write-serial, rdma-write-pipelined
 *                   prefill RDMA_WRITEs 256 pages of 16 KiB from pinned host memory
 *                   into decode's GPU, one WR in flight at a time or all posted ahead
 *   kv-notify-early, kv-notify-imm, kv-notify-polled, kv-notify-concurrent, mr-dereg-early,
 *   mr-dereg-polled: completed is not consumable (seed 002 §4.1, §5), see "ordering" below
 */
#include "calls.h"
#include "truth.h"
#include "wire.h"
#include <arpa/inet.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#define MiB (1024ull * 1024ull)
#define CHAIN 4
#define POST_DEPTH 256

enum { PREFILL = 0, DECODE = 1 };
static const char *role_names[2] = {"prefill", "decode"};

/* ---------------- options ---------------- */

static struct {
	const char *scenario, *dir;
	int role; /* -1: launcher */
	size_t pages, page_bytes;
	unsigned timeout_s;
	unsigned settle_ms; /* pause after opening the device, before connecting: a server sets up long before data flows */
	const char *settle_file; /* or wait until this file exists: an observer says it probed the provider */
} O = {.role = -1, .pages = 64, .page_bytes = 1 * MiB, .timeout_s = 60};

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* ---------------- rendezvous (in the wire's app area) ---------------- */

#define MAX_PHASE 4
#define KVC_THREADS 4 /* kv-notify-concurrent's prefill threads */
#define KVC_ROUNDS 2  /* and the requests each sends */
struct rdv {
	uint32_t failed;
	int32_t pid[2];
	uint32_t stage[2];
	uint32_t qpn[2];
	uint32_t rkey[2];
	uint32_t is_device[2]; /* enum mr_mem of each side's target region */
	uint64_t addr[2], len[2];
	char gpu[2][WIRE_GPU_MAX];
	uint64_t t_first_post[MAX_PHASE];
	double gbps[MAX_PHASE];
	/* pd-overlap's concurrent phase, in lockstep: decode's H2D copies submitted and
	 * prefill's WRITE_WITH_IMMs posted so far */
	uint64_t h2d_submitted, rdma_posted;
	/* the ordering scenarios: each role's control QP and port GID (ibv_query_gid) */
	uint32_t qpn2[2];
	uint8_t gid[2][16];
	/* kv-notify-concurrent: each role's per-thread data and control QPs */
	uint32_t tqpn[2][KVC_THREADS][2];
};
_Static_assert(sizeof(struct rdv) <= WIRE_APP_BYTES, "rendezvous too big");

static struct rdv *R;
static int me, other;

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "rdmapath %s: ", O.role >= 0 ? role_names[O.role] : "launcher");
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	if (R)
		__atomic_store_n(&R->failed, 1, __ATOMIC_RELEASE);
	exit(3);
}

static void nap_us(long us)
{
	struct timespec ts = {0, us * 1000};
	nanosleep(&ts, NULL);
}

/* Both roles reach stage k (or one fails, or the timeout passes: exit non-zero). */
static void barrier(uint32_t k, const char *what)
{
	__atomic_store_n(&R->stage[me], k, __ATOMIC_RELEASE);
	uint64_t deadline = truth_now_ns() + (uint64_t)O.timeout_s * 1000000000ull;
	while (__atomic_load_n(&R->stage[other], __ATOMIC_ACQUIRE) < k) {
		if (__atomic_load_n(&R->failed, __ATOMIC_ACQUIRE))
			die("the %s role failed (waiting for %s)", role_names[other], what);
		if (truth_now_ns() > deadline)
			die("timed out after %us waiting for the %s role (%s)", O.timeout_s, role_names[other], what);
		nap_us(100);
	}
}

/*
 * Lockstep of pd-overlap's concurrent phase: neither flow is submitted more than
 * LOCKSTEP_AHEAD pages ahead of the other, so the two are in flight together by
 * construction (the NIC and the copy engines are movers that no CPU load delays,
 * refpath/driver/mover.c), however late either role is scheduled.
 */
#define LOCKSTEP_AHEAD 6

/*
 * The lockstep bounds how far either flow runs ahead, not how long both wait for a
 * submitter the CPU scheduler left out: on a machine whose CPUs are all busy, a role
 * descheduled for longer than LOCKSTEP_AHEAD pages take lets both lanes drain, and
 * the two flows stop saturating the lane. So for the concurrent phase each role's
 * submitting thread runs SCHED_FIFO at priority 1, below the NIC thread's 2, where it
 * has the privilege (submit_as_mover, kvpath/calls.c). It waits in short naps, never
 * holding a CPU; the kernel's RT throttling bounds it anyway.
 */

/* Waits until *c >= want (the other role's progress), or fails like barrier(). */
static void wait_count(const uint64_t *c, uint64_t want, const char *what)
{
	uint64_t deadline = truth_now_ns() + (uint64_t)O.timeout_s * 1000000000ull;
	while (__atomic_load_n(c, __ATOMIC_ACQUIRE) < want) {
		if (__atomic_load_n(&R->failed, __ATOMIC_ACQUIRE))
			die("the %s role failed (waiting for %s)", role_names[other], what);
		if (truth_now_ns() > deadline)
			die("timed out after %us waiting for the %s role (%s)", O.timeout_s, role_names[other], what);
		nap_us(20);
	}
}

/* ---------------- verbs truth records ---------------- */

/* Verbs records are kept as JSON members by seq; CUDA records stay in the truth writer. */
static char **vjson;
static size_t vcap;

static void vrec(const char *api, const char *op, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static pthread_mutex_t vmu = PTHREAD_MUTEX_INITIALIZER; /* kv-notify-concurrent's threads record too */

static void vrec(const char *api, const char *op, const char *fmt, ...)
{
	pthread_mutex_lock(&vmu);
	struct truth_rec *r = truth_new(api, op);
	if (r->seq >= vcap) {
		size_t nc = vcap ? vcap * 2 : 1024;
		while (nc <= r->seq)
			nc *= 2;
		vjson = realloc(vjson, nc * sizeof *vjson);
		if (!vjson)
			die("out of memory");
		memset(vjson + vcap, 0, (nc - vcap) * sizeof *vjson);
		vcap = nc;
	}
	va_list ap;
	va_start(ap, fmt);
	if (vasprintf(&vjson[r->seq], fmt, ap) < 0)
		die("out of memory");
	va_end(ap);
	pthread_mutex_unlock(&vmu);
}

/* The scenario's own MR table: what it registered, and the memory behind it: device
 * memory, host memory CUDA pinned (cudaHostRegister), or host memory only the NIC
 * registered — which an observer cannot tell from device memory it never saw made
 * (nvidia-peermem), so it must report that one unknown (selftest/rdma.go). */
enum mr_mem { MR_HOST, MR_DEVICE, MR_PINNED };
struct lmr {
	struct ibv_mr *mr;
	int is_device; /* enum mr_mem */
};
static struct lmr mrs[16];
static int nmrs;

static const struct lmr *mr_by_lkey(uint32_t lkey)
{
	for (int i = 0; i < nmrs; i++)
		if (mrs[i].mr && mrs[i].mr->lkey == lkey)
			return &mrs[i];
	return NULL;
}

static const char *memkind(int m)
{
	return m == MR_DEVICE ? "device" : m == MR_PINNED ? "pinned" : "host";
}

static struct ibv_mr *reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	uint64_t t0 = truth_now_ns();
	struct ibv_mr *mr = ibv_reg_mr(pd, addr, len, access); /* macro -> ibv_reg_mr -> ibv_reg_mr_iova2 */
	uint64_t t1 = truth_now_ns();
	if (!mr)
		die("ibv_reg_mr: %s", strerror(errno));
	int dev = truth_is_device(addr) ? MR_DEVICE : truth_is_pinned(addr) ? MR_PINNED : MR_HOST;
	mrs[nmrs++] = (struct lmr){mr, dev};
	vrec("ibv_reg_mr_iova2", "reg_mr",
	     "\"addr\":%llu,\"length\":%zu,\"iova\":%llu,\"access\":%d,\"lkey\":%u,\"rkey\":%u,\"mem\":\"%s\","
	     "\"via\":\"ibv_reg_mr\",\"t_call_ns\":%llu,\"t_return_ns\":%llu",
	     (unsigned long long)(uintptr_t)addr, len, (unsigned long long)(uintptr_t)addr, access, mr->lkey, mr->rkey,
	     memkind(dev), (unsigned long long)t0, (unsigned long long)t1);
	return mr;
}

static void dereg_mr(struct ibv_mr *mr)
{
	uint32_t lkey = mr->lkey, rkey = mr->rkey;
	uint64_t addr = (uintptr_t)mr->addr, len = mr->length;
	uint64_t t0 = truth_now_ns();
	int rc = ibv_dereg_mr(mr);
	uint64_t t1 = truth_now_ns();
	if (rc)
		die("ibv_dereg_mr: %d", rc);
	for (int i = 0; i < nmrs; i++)
		if (mrs[i].mr == mr)
			mrs[i].mr = NULL;
	vrec("ibv_dereg_mr", "dereg_mr",
	     "\"addr\":%llu,\"length\":%llu,\"lkey\":%u,\"rkey\":%u,\"t_call_ns\":%llu,\"t_return_ns\":%llu",
	     (unsigned long long)addr, (unsigned long long)len, lkey, rkey, (unsigned long long)t0,
	     (unsigned long long)t1);
}

static const char *wr_opcode_name(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE: return "RDMA_WRITE";
	case IBV_WR_RDMA_WRITE_WITH_IMM: return "RDMA_WRITE_WITH_IMM";
	case IBV_WR_SEND: return "SEND";
	case IBV_WR_SEND_WITH_IMM: return "SEND_WITH_IMM";
	case IBV_WR_RDMA_READ: return "RDMA_READ";
	default: return "OTHER";
	}
}

static const char *wc_opcode_name(enum ibv_wc_opcode op)
{
	switch (op) {
	case IBV_WC_SEND: return "SEND";
	case IBV_WC_RDMA_WRITE: return "RDMA_WRITE";
	case IBV_WC_RDMA_READ: return "RDMA_READ";
	case IBV_WC_RECV: return "RECV";
	case IBV_WC_RECV_RDMA_WITH_IMM: return "RECV_RDMA_WITH_IMM";
	default: return "OTHER";
	}
}

/* Stats of the posts and completions, for the end line and the checks. */
static struct {
	unsigned posted_send, signaled, posted_recv, completions, errors;
} S;

static struct ibv_qp *QP;
static struct ibv_qp *QP2; /* the ordering scenarios' control QP: same peer, same CQs */
static struct ibv_cq *SCQ, *RCQ;

/* kv-notify-concurrent: each thread's data [0] and control [1] QP; prefill's threads
 * each have their own send CQ, so each polls only its own completions. */
static struct ibv_qp *TQP[KVC_THREADS][2];
static struct ibv_cq *TCQ[KVC_THREADS];

static int concurrent(void)
{
	return !strcmp(O.scenario, "kv-notify-concurrent");
}

/* Each connected QP's remote QP (connect_one), for the WR records. */
static struct {
	struct ibv_qp *qp;
	uint32_t dest;
} dests[2 + 2 * KVC_THREADS];
static int ndests;

static uint32_t dest_of(const struct ibv_qp *qp)
{
	for (int i = 0; i < ndests; i++)
		if (dests[i].qp == qp)
			return dests[i].dest;
	return 0;
}

static void post_send_on(struct ibv_qp *qp, struct ibv_send_wr *chain, int phase);

/* Posts a chain of WRs in one ibv_post_send call and records each WR. */
static void post_send(struct ibv_send_wr *chain, int phase)
{
	post_send_on(QP, chain, phase);
}

static void post_send_on(struct ibv_qp *qp, struct ibv_send_wr *chain, int phase)
{
	struct ibv_send_wr *bad = NULL;
	uint64_t t = truth_now_ns();
	if (phase >= 0 && !R->t_first_post[phase])
		R->t_first_post[phase] = t;
	int rc;
	/* a full send queue answers ENOMEM: retry briefly (the NIC drains it) */
	for (int tries = 0; (rc = ibv_post_send(qp, chain, &bad)) == ENOMEM && tries < 100000; tries++) {
		if (bad != chain)
			die("ibv_post_send: partial post on ENOMEM");
		nap_us(50);
		t = truth_now_ns();
	}
	if (rc)
		die("ibv_post_send: %s", strerror(rc));
	uint64_t t_end = truth_now_ns(); /* the agent's post time lies in [t, t_end] */
	int i = 0;
	for (struct ibv_send_wr *w = chain; w; w = w->next, i++) {
		uint64_t bytes = 0;
		for (int k = 0; k < w->num_sge; k++)
			bytes += w->sg_list[k].length;
		const struct lmr *l = w->num_sge ? mr_by_lkey(w->sg_list[0].lkey) : NULL;
		int ldev = l ? l->is_device : MR_HOST;
		int remote = w->opcode == IBV_WR_RDMA_WRITE || w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ||
			     w->opcode == IBV_WR_RDMA_READ;
		int known = remote && w->wr.rdma.rkey == R->rkey[other];
		const char *rmem = !remote ? "recv_buffer" : !known ? "unknown" : memkind(R->is_device[other]);
		int has_imm = w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM || w->opcode == IBV_WR_SEND_WITH_IMM;
		int sig = (w->send_flags & IBV_SEND_SIGNALED) != 0;
		char sges[256] = "";
		size_t off = 0;
		for (int k = 0; k < w->num_sge; k++)
			off += (size_t)snprintf(sges + off, sizeof sges - off, "%s{\"addr\":%llu,\"length\":%u,\"lkey\":%u}",
						k ? "," : "", (unsigned long long)w->sg_list[k].addr, w->sg_list[k].length,
						w->sg_list[k].lkey);
		vrec("ibv_post_send", "post_send",
		     "\"opcode\":\"%s\",\"opcode_num\":%d,\"wr_id\":%llu,\"bytes\":%llu,\"num_sge\":%d,\"addr\":%llu,"
		     "\"lkey\":%u,\"local_mem\":\"%s\",\"remote_addr\":%llu,\"rkey\":%u,\"remote_mem\":\"%s\","
		     "\"data_flow\":\"%s\",\"signaled\":%s,\"qp_num\":%u,\"dest_qp_num\":%u,\"imm\":%u,\"imm_host\":%u,"
		     "\"chain_index\":%d,\"sges\":[%s],\"t_post_ns\":%llu,\"t_post_end_ns\":%llu",
		     wr_opcode_name(w->opcode), (int)w->opcode, (unsigned long long)w->wr_id, (unsigned long long)bytes,
		     w->num_sge, (unsigned long long)(w->num_sge ? w->sg_list[0].addr : 0),
		     w->num_sge ? w->sg_list[0].lkey : 0, memkind(ldev),
		     (unsigned long long)(remote ? w->wr.rdma.remote_addr : 0), remote ? w->wr.rdma.rkey : 0,
		     rmem, w->opcode == IBV_WR_RDMA_READ ? "remote_to_local" : "local_to_remote",
		     sig ? "true" : "false", qp->qp_num, dest_of(qp), has_imm ? w->imm_data : 0,
		     has_imm ? ntohl(w->imm_data) : 0, i, sges, (unsigned long long)t, (unsigned long long)t_end);
		__atomic_add_fetch(&S.posted_send, 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&S.signaled, (unsigned)sig, __ATOMIC_RELAXED);
	}
}

static void post_recvs_on(struct ibv_qp *qp, int n, uint64_t wr_id0, struct ibv_mr *mr, uint32_t len);

static void post_recvs(int n, uint64_t wr_id0, struct ibv_mr *mr, uint32_t len)
{
	post_recvs_on(QP, n, wr_id0, mr, len);
}

static void post_recvs_on(struct ibv_qp *qp, int n, uint64_t wr_id0, struct ibv_mr *mr, uint32_t len)
{
	for (int i = 0; i < n; i++) {
		struct ibv_sge sge = {mr ? (uintptr_t)mr->addr : 0, len, mr ? mr->lkey : 0};
		struct ibv_recv_wr wr = {.wr_id = wr_id0 + (uint64_t)i, .sg_list = mr ? &sge : NULL, .num_sge = mr ? 1 : 0};
		struct ibv_recv_wr *bad;
		uint64_t t = truth_now_ns();
		int rc = ibv_post_recv(qp, &wr, &bad);
		uint64_t t_end = truth_now_ns();
		if (rc)
			die("ibv_post_recv: %s", strerror(rc));
		vrec("ibv_post_recv", "post_recv",
		     "\"wr_id\":%llu,\"bytes\":%u,\"num_sge\":%d,\"addr\":%llu,\"lkey\":%u,\"local_mem\":\"%s\","
		     "\"qp_num\":%u,\"t_post_ns\":%llu,\"t_post_end_ns\":%llu",
		     (unsigned long long)wr.wr_id, mr ? len : 0, wr.num_sge, (unsigned long long)sge.addr, sge.lkey,
		     mr ? memkind(mr_by_lkey(mr->lkey)->is_device) : "none", qp->qp_num, (unsigned long long)t,
		     (unsigned long long)t_end);
		S.posted_recv++;
	}
}

/*
 * Polls cq until `want` completions arrived; records each (t_poll_ns right after
 * the poll_cq call that returned it). Returns the time of the last one. wcs gets
 * them if non-NULL.
 */
static uint64_t poll_n(struct ibv_cq *cq, int want, struct ibv_wc *wcs, const char *what)
{
	int got = 0;
	uint64_t last = 0, deadline = truth_now_ns() + (uint64_t)O.timeout_s * 1000000000ull;
	struct ibv_wc wc[16];
	while (got < want) {
		uint64_t t_start = truth_now_ns(); /* the agent's completion time lies in [t_start, t] */
		int n = ibv_poll_cq(cq, want - got < 16 ? want - got : 16, wc);
		uint64_t t = truth_now_ns();
		if (n < 0)
			die("ibv_poll_cq: %d", n);
		for (int i = 0; i < n; i++) {
			const struct ibv_wc *c = &wc[i];
			int imm = (c->wc_flags & IBV_WC_WITH_IMM) != 0;
			vrec("ibv_poll_cq", "completion",
			     "\"wr_id\":%llu,\"status\":%d,\"status_name\":\"%s\",\"wc_opcode\":\"%s\",\"wc_opcode_num\":%d,"
			     "\"byte_len\":%u,\"imm\":%u,\"imm_host\":%u,\"with_imm\":%s,\"qp_num\":%u,\"src_qp\":%u,"
			     "\"cq\":\"%s\",\"t_poll_start_ns\":%llu,\"t_poll_ns\":%llu",
			     (unsigned long long)c->wr_id, (int)c->status, ibv_wc_status_str(c->status),
			     wc_opcode_name(c->opcode), (int)c->opcode, c->byte_len, imm ? c->imm_data : 0,
			     imm ? ntohl(c->imm_data) : 0, imm ? "true" : "false", c->qp_num, c->src_qp,
			     cq == RCQ ? "recv" : "send", (unsigned long long)t_start, (unsigned long long)t);
			__atomic_add_fetch(&S.completions, 1, __ATOMIC_RELAXED);
			if (c->status != IBV_WC_SUCCESS)
				__atomic_add_fetch(&S.errors, 1, __ATOMIC_RELAXED);
			if (wcs)
				wcs[got] = *c;
			got++;
			last = t;
		}
		if (n == 0) {
			if (__atomic_load_n(&R->failed, __ATOMIC_ACQUIRE))
				die("the %s role failed (waiting for %s)", role_names[other], what);
			if (truth_now_ns() > deadline)
				die("timed out after %us waiting for %s (%d of %d completions)", O.timeout_s, what, got,
				    want);
			nap_us(20);
		}
	}
	return last;
}

/* ---------------- CUDA side (recorded like kvpath) ---------------- */






static void copy_async(void *dst, const void *src, size_t n, cudaStream_t s, int layer, const char *phase)
{
	struct truth_rec *r = truth_copy("cudaMemcpyAsync", "copy", dst, src, n, cudaMemcpyHostToDevice, s, layer);
	r->phase = phase;
	TCALL(r, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s));
}

static double h2d_gbps(const char *phase)
{
	uint64_t lo = UINT64_MAX, hi = 0, bytes = 0;
	for (size_t i = 0; i < truth_count(); i++) {
		const struct truth_rec *r = truth_at(i);
		if (!r->phase || strcmp(r->phase, phase) || strcmp(r->op, "copy") || !r->eng || !r->eng->end_ns)
			continue;
		lo = r->eng->start_ns < lo ? r->eng->start_ns : lo;
		hi = r->eng->end_ns > hi ? r->eng->end_ns : hi;
		bytes += r->bytes;
	}
	return hi > lo ? (double)bytes / (double)(hi - lo) : 0;
}

/* The hicache-load pattern: layer by layer H2D from a registered pool into device buffers. */
struct hicache {
	char *pool, *dev;
	size_t layers, lb;
	cudaStream_t s;
};

static void hicache_setup(struct hicache *h, size_t layers, size_t lb)
{
	h->layers = layers;
	h->lb = lb;
	h->pool = pool_mmap(layers * lb, 0);
	memset(h->pool, 0x5a, layers * lb);
	host_register(h->pool, layers * lb, 0);
	h->dev = dev_alloc(layers * lb);
	CHECK(cudaStreamCreateWithFlags(&h->s, cudaStreamNonBlocking));
}

static void hicache_reset(struct hicache *h)
{
	memset(h->dev, 0, h->layers * h->lb);
}

static void hicache_enqueue(struct hicache *h, const char *phase)
{
	for (size_t i = 0; i < h->layers; i++)
		copy_async(h->dev + i * h->lb, h->pool + i * h->lb, h->lb, h->s, (int)i, phase);
}

static void hicache_finish(struct hicache *h, const char *phase)
{
	stream_sync(h->s, phase);
	if (memcmp(h->dev, h->pool, h->layers * h->lb))
		die("hicache-load data mismatch (%s)", phase);
}

static void hicache_teardown(struct hicache *h)
{
	CHECK(cudaStreamDestroy(h->s));
	dev_free(h->dev);
	host_unregister(h->pool);
	munmap(h->pool, h->layers * h->lb);
}

/* ---------------- data pattern ---------------- */

static void fill(char *p, size_t pages, size_t pb, int seed)
{
	for (size_t pg = 0; pg < pages; pg++)
		for (size_t off = 0; off < pb; off += 4096) {
			size_t n = pb - off < 4096 ? pb - off : 4096;
			memset(p + pg * pb + off, (int)((pg * 131 + off / 4096 * 7 + (size_t)seed) & 0xff), n);
		}
}

static void verify(const char *p, size_t pages, size_t pb, int seed, const char *what)
{
	char *want = malloc(pb);
	if (!want)
		die("out of memory");
	for (size_t pg = 0; pg < pages; pg++) {
		for (size_t off = 0; off < pb; off += 4096) {
			size_t n = pb - off < 4096 ? pb - off : 4096;
			memset(want + off, (int)((pg * 131 + off / 4096 * 7 + (size_t)seed) & 0xff), n);
		}
		if (memcmp(p + pg * pb, want, pb))
			die("data mismatch in page %zu after %s", pg, what);
	}
	free(want);
}

/* ---------------- connection ---------------- */

static struct ibv_context *CTX;
static struct ibv_pd *PD;

/* An RC QP on the send CQ scq and the shared receive CQ, in INIT. */
static struct ibv_qp *make_qp_on(struct ibv_cq *scq)
{
	struct ibv_qp_init_attr qa = {.send_cq = scq, .recv_cq = RCQ, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = POST_DEPTH, .max_recv_wr = 512, .max_send_sge = 2,
					      .max_recv_sge = 1}};
	struct ibv_qp *qp = ibv_create_qp(PD, &qa);
	if (!qp)
		die("ibv_create_qp: %s", strerror(errno));
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
				.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("modify_qp INIT");
	return qp;
}

/* An RC QP on the shared CQs. */
static struct ibv_qp *make_qp(void)
{
	return make_qp_on(SCQ);
}

/* The ordering scenarios connect a second QP to the same peer. */
static int uses_control_qp(void)
{
	return !strncmp(O.scenario, "kv-notify-", 10) && strcmp(O.scenario, "kv-notify-concurrent");
}

static void verbs_open(void)
{
	int n = 0;
	struct ibv_device **l = ibv_get_device_list(&n);
	if (!l || n < 1)
		die("no RDMA device");
	CTX = ibv_open_device(l[0]);
	if (!CTX)
		die("ibv_open_device(%s): %s", ibv_get_device_name(l[0]), strerror(errno));
	ibv_free_device_list(l);
	PD = ibv_alloc_pd(CTX);
	SCQ = ibv_create_cq(CTX, 1024, NULL, NULL, 0);
	RCQ = ibv_create_cq(CTX, 1024, NULL, NULL, 0);
	if (!PD || !SCQ || !RCQ)
		die("pd/cq: %s", strerror(errno));
	QP = make_qp();
	if (uses_control_qp())
		QP2 = make_qp();
	for (int i = 0; concurrent() && i < KVC_THREADS; i++) {
		if (O.role == PREFILL && !(TCQ[i] = ibv_create_cq(CTX, 256, NULL, NULL, 0)))
			die("thread cq: %s", strerror(errno));
		TQP[i][0] = make_qp_on(TCQ[i] ? TCQ[i] : SCQ);
		TQP[i][1] = make_qp_on(TCQ[i] ? TCQ[i] : SCQ);
	}
}

/* Publishes this role's QP and target buffer, waits for the peer's, connects (RTR, RTS). */
/* RTR then RTS toward the peer's QP dest, with a global address vector naming the peer's
 * port by its GID, as RoCE applications connect; recorded with the GID. */
static void connect_one(struct ibv_qp *qp, uint32_t dest)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_4096, .dest_qp_num = dest,
				.rq_psn = 0, .max_dest_rd_atomic = 16, .min_rnr_timer = 12};
	a.ah_attr.port_num = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.hop_limit = 1;
	memcpy(a.ah_attr.grh.dgid.raw, R->gid[other], 16);
	uint64_t t0 = truth_now_ns();
	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("modify_qp RTR");
	struct ibv_qp_attr b = {.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .sq_psn = 0,
				.max_rd_atomic = 16};
	if (ibv_modify_qp(qp, &b,
			  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				  IBV_QP_MAX_QP_RD_ATOMIC))
		die("modify_qp RTS");
	uint64_t t1 = truth_now_ns();
	if (ndests == (int)(sizeof dests / sizeof dests[0]))
		die("too many QPs");
	dests[ndests].qp = qp;
	dests[ndests++].dest = dest;
	char dgid[64];
	inet_ntop(AF_INET6, R->gid[other], dgid, sizeof dgid);
	vrec("ibv_modify_qp", "connect",
	     "\"qp_num\":%u,\"dest_qp_num\":%u,\"dgid\":\"%s\",\"peer_pid\":%d,\"state\":\"RTS\",\"t_call_ns\":%llu,"
	     "\"t_return_ns\":%llu",
	     qp->qp_num, dest, dgid, R->pid[other], (unsigned long long)t0, (unsigned long long)t1);
}

static void connect_qp(struct ibv_mr *target)
{
	R->pid[me] = getpid();
	R->qpn[me] = QP->qp_num;
	if (QP2)
		R->qpn2[me] = QP2->qp_num;
	for (int i = 0; concurrent() && i < KVC_THREADS; i++)
		for (int j = 0; j < 2; j++)
			R->tqpn[me][i][j] = TQP[i][j]->qp_num;
	union ibv_gid gid;
	if (ibv_query_gid(CTX, 1, 0, &gid))
		die("ibv_query_gid");
	memcpy(R->gid[me], gid.raw, 16);
	if (target) {
		R->addr[me] = (uintptr_t)target->addr;
		R->len[me] = target->length;
		R->rkey[me] = target->rkey;
		R->is_device[me] = mr_by_lkey(target->lkey)->is_device;
		const char *g = getenv("LW_REF_GPU");
		snprintf(R->gpu[me], WIRE_GPU_MAX, "%s", R->is_device[me] == MR_DEVICE && g ? g : "");
	}
	barrier(1, "QP exchange");
	connect_one(QP, R->qpn[other]);
	if (QP2)
		connect_one(QP2, R->qpn2[other]);
	for (int i = 0; concurrent() && i < KVC_THREADS; i++)
		for (int j = 0; j < 2; j++)
			connect_one(TQP[i][j], R->tqpn[other][i][j]);
	barrier(2, "connect");
}

static void verbs_close(void)
{
	for (int i = 0; i < KVC_THREADS; i++) {
		if ((TQP[i][0] && (ibv_destroy_qp(TQP[i][0]) || ibv_destroy_qp(TQP[i][1]))) || (TCQ[i] && ibv_destroy_cq(TCQ[i])))
			die("teardown failed");
	}
	if ((QP2 && ibv_destroy_qp(QP2)) || ibv_destroy_qp(QP) || ibv_destroy_cq(SCQ) || ibv_destroy_cq(RCQ) || ibv_dealloc_pd(PD) ||
	    ibv_close_device(CTX))
		die("teardown failed");
}

/* ---------------- the transfers ---------------- */

/*
 * Moves `pages` pages between local buffer `loc` (MR lm) and the peer's target
 * (R->addr/rkey of the other role) in chains of CHAIN WRs per ibv_post_send call;
 * odd WRs of a chain carry their page in 2 SGEs; WRs 1 and 3 of each chain (and the
 * last WR) are signaled. Returns the number of signaled WRs.
 */
static int post_pages_on(struct ibv_qp *qp, enum ibv_wr_opcode op, char *loc, struct ibv_mr *lm, size_t pages, size_t pb,
			 int phase, uint64_t wr_id0, int lockstep, size_t rpage0);

static int post_pages(enum ibv_wr_opcode op, char *loc, struct ibv_mr *lm, size_t pages, size_t pb, int phase,
		      uint64_t wr_id0, int lockstep)
{
	return post_pages_on(QP, op, loc, lm, pages, pb, phase, wr_id0, lockstep, 0);
}

/* post_pages on qp, into the peer's target from its page rpage0 on. */
static int post_pages_on(struct ibv_qp *qp, enum ibv_wr_opcode op, char *loc, struct ibv_mr *lm, size_t pages, size_t pb,
			 int phase, uint64_t wr_id0, int lockstep, size_t rpage0)
{
	struct ibv_send_wr wr[CHAIN];
	struct ibv_sge sge[CHAIN][2];
	int sig = 0;
	for (size_t p0 = 0; p0 < pages; p0 += CHAIN) {
		int n = (int)(pages - p0 < CHAIN ? pages - p0 : CHAIN);
		for (int k = 0; k < n; k++) {
			size_t p = p0 + (size_t)k;
			uint64_t a = (uintptr_t)loc + p * pb;
			memset(&wr[k], 0, sizeof wr[k]);
			if (k % 2 == 1 && pb >= 8192) {
				uint32_t h = (uint32_t)(pb / 2);
				sge[k][0] = (struct ibv_sge){a, h, lm->lkey};
				sge[k][1] = (struct ibv_sge){a + h, (uint32_t)pb - h, lm->lkey};
				wr[k].num_sge = 2;
			} else {
				sge[k][0] = (struct ibv_sge){a, (uint32_t)pb, lm->lkey};
				wr[k].num_sge = 1;
			}
			wr[k].wr_id = wr_id0 + p;
			wr[k].sg_list = sge[k];
			wr[k].opcode = op;
			wr[k].next = k + 1 < n ? &wr[k + 1] : NULL;
			if (k % 2 == 1 || p + 1 == pages) {
				wr[k].send_flags = IBV_SEND_SIGNALED;
				sig++;
			}
			if (op == IBV_WR_RDMA_WRITE_WITH_IMM)
				wr[k].imm_data = htonl((uint32_t)p);
			wr[k].wr.rdma.remote_addr = R->addr[other] + (rpage0 + p) * pb;
			wr[k].wr.rdma.rkey = R->rkey[other];
		}
		if (lockstep && p0 + (size_t)n > LOCKSTEP_AHEAD)
			wait_count(&R->h2d_submitted, p0 + (size_t)n - LOCKSTEP_AHEAD, "decode's H2D copies");
		post_send_on(qp, wr, phase);
		if (lockstep)
			__atomic_store_n(&R->rdma_posted, p0 + (size_t)n, __ATOMIC_RELEASE);
	}
	return sig;
}

/* Waits for the signaled send completions of post_pages; returns the last one's time. */
static uint64_t reap_sends_on(struct ibv_cq *cq, int sig, const char *what);

static uint64_t reap_sends(int sig, const char *what)
{
	return reap_sends_on(SCQ, sig, what);
}

/* reap_sends on the send CQ cq. */
static uint64_t reap_sends_on(struct ibv_cq *cq, int sig, const char *what)
{
	struct ibv_wc *w = calloc((size_t)sig, sizeof *w);
	uint64_t t = poll_n(cq, sig, w, what);
	for (int i = 0; i < sig; i++)
		if (w[i].status != IBV_WC_SUCCESS)
			die("%s: send completion of wr_id %llu: %s", what, (unsigned long long)w[i].wr_id,
			    ibv_wc_status_str(w[i].status));
	free(w);
	return t;
}

/* Decode's side of WRITE_WITH_IMM pages: the RECV completions, checked. Returns the last one's time. */
static uint64_t reap_imm_pages(size_t pages, size_t pb, const char *what)
{
	struct ibv_wc *w = calloc(pages, sizeof *w);
	uint64_t t = poll_n(RCQ, (int)pages, w, what);
	for (size_t i = 0; i < pages; i++) {
		if (w[i].status != IBV_WC_SUCCESS || w[i].opcode != IBV_WC_RECV_RDMA_WITH_IMM ||
		    !(w[i].wc_flags & IBV_WC_WITH_IMM) || w[i].byte_len != pb || ntohl(w[i].imm_data) != i)
			die("%s: completion %zu: status %d opcode %d byte_len %u imm %u", what, i, w[i].status,
			    w[i].opcode, w[i].byte_len, ntohl(w[i].imm_data));
	}
	free(w);
	return t;
}

static double rate(size_t bytes, uint64_t t0, uint64_t t1)
{
	return t1 > t0 ? (double)bytes / (double)(t1 - t0) : 0;
}

/* ---------------- scenarios ---------------- */

static char extra[1024];

/* pd-transfer and pd-overlap: prefill WRITE_WITH_IMMs pages into decode's GPU. */
static int sc_pd_write(int overlap)
{
	size_t N = O.pages, B = O.page_bytes, total = N * B;
	int nphase = overlap ? 2 : 1;
	double rd[2] = {0}, h2d[2] = {0};
	if (me == PREFILL) {
		/* pd-transfer: GPU memory (GPUDirect); pd-overlap: pinned host memory */
		char *src = overlap ? pool_mmap(total, 0) : dev_alloc(total);
		if (overlap)
			host_register(src, total, 0);
		fill(src, N, B, 1);
		struct ibv_mr *mr = reg_mr(PD, src, total, IBV_ACCESS_LOCAL_WRITE);
		connect_qp(NULL);
		for (int ph = 0; ph < nphase; ph++) {
			barrier(10 + (uint32_t)ph * 10, "recvs posted");
			if (overlap && ph == 1)
				barrier(25, "decode's H2D alone"); /* decode ran its loads alone meanwhile */
			uint64_t t0 = truth_now_ns();
			R->t_first_post[ph] = 0;
			if (overlap && ph == 1)
				submit_as_mover(1);
			int sig = post_pages(IBV_WR_RDMA_WRITE_WITH_IMM, src, mr, N, B, ph, 0x10000 + (uint64_t)ph * 0x1000,
					     overlap && ph == 1);
			uint64_t t1 = reap_sends(sig, "WRITE_WITH_IMM send completions");
			submit_as_mover(0);
			rd[ph] = rate(total, t0, t1);
			barrier(11 + (uint32_t)ph * 10, "decode verified");
		}
		dereg_mr(mr);
		if (overlap) {
			host_unregister(src);
			munmap(src, total);
		} else {
			dev_free(src);
		}
		fprintf(stderr, "%s prefill: WRITE_WITH_IMM send %.2f GB/s%s", O.scenario, rd[0], overlap ? "" : "\n");
		if (overlap)
			fprintf(stderr, " alone, %.2f GB/s with decode's H2D\n", rd[1]);
		snprintf(extra, sizeof extra, "\"gbps\":{\"rdma_send_alone\":%.3f%s", rd[0], overlap ? "" : "}");
		if (overlap)
			snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ",\"rdma_send_concurrent\":%.3f}", rd[1]);
		return 0;
	}
	/* decode */
	char *dst = dev_alloc(total);
	struct ibv_mr *mr = reg_mr(PD, dst, total, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct hicache h;
	if (overlap)
		hicache_setup(&h, N, B);
	connect_qp(mr);
	for (int ph = 0; ph < nphase; ph++) {
		memset(dst, 0, total);
		post_recvs((int)N, 0x20000 + (uint64_t)ph * 0x1000, NULL, 0);
		barrier(10 + (uint32_t)ph * 10, "recvs posted");
		if (overlap && ph == 1) {
			/* the loads alone first, then both at once */
			hicache_reset(&h);
			hicache_enqueue(&h, "alone");
			hicache_finish(&h, "alone");
			h2d[0] = h2d_gbps("alone");
			hicache_reset(&h);
			barrier(25, "decode's H2D alone");
			/* both at once, in lockstep with prefill's posts */
			submit_as_mover(1);
			for (size_t i = 0; i < h.layers; i++) {
				if (i >= LOCKSTEP_AHEAD)
					wait_count(&R->rdma_posted, i + 1 - LOCKSTEP_AHEAD, "prefill's WRITE_WITH_IMMs");
				copy_async(h.dev + i * h.lb, h.pool + i * h.lb, h.lb, h.s, (int)i, "concurrent");
				__atomic_store_n(&R->h2d_submitted, i + 1, __ATOMIC_RELEASE);
			}
		}
		uint64_t t1 = reap_imm_pages(N, B, "RECV_RDMA_WITH_IMM completions");
		if (overlap && ph == 1) {
			/* the copies' completion is proven as soon as the receives are: a sync
			 * delayed by the checks below would stretch their time in flight */
			hicache_finish(&h, "concurrent");
			submit_as_mover(0);
			h2d[1] = h2d_gbps("concurrent");
		}
		/* consumable only now: the completion is the publish point */
		verify(dst, N, B, 1, "WRITE_WITH_IMM");
		rd[ph] = rate(total, R->t_first_post[ph], t1);
		barrier(11 + (uint32_t)ph * 10, "decode verified");
	}
	if (overlap)
		hicache_teardown(&h);
	dereg_mr(mr);
	dev_free(dst);
	if (!overlap) {
		fprintf(stderr, "pd-transfer decode: RDMA into gpu-decode %.2f GB/s\n", rd[0]);
		snprintf(extra, sizeof extra, "\"gbps\":{\"rdma_recv_alone\":%.3f}", rd[0]);
		return 0;
	}
	fprintf(stderr,
		"pd-overlap decode: RDMA into gpu-decode alone %.2f GB/s, with H2D %.2f GB/s (x%.2f); "
		"H2D alone %.2f GB/s, with RDMA %.2f GB/s (x%.2f)\n",
		rd[0], rd[1], rd[1] > 0 ? rd[0] / rd[1] : 0, h2d[0], h2d[1], h2d[1] > 0 ? h2d[0] / h2d[1] : 0);
	snprintf(extra, sizeof extra,
		 "\"gbps\":{\"rdma_recv_alone\":%.3f,\"h2d_alone\":%.3f,\"rdma_recv_concurrent\":%.3f,"
		 "\"h2d_concurrent\":%.3f},\"slowdown\":{\"rdma\":%.3f,\"h2d\":%.3f}",
		 rd[0], h2d[0], rd[1], h2d[1], rd[1] > 0 ? rd[0] / rd[1] : 0, h2d[1] > 0 ? h2d[0] / h2d[1] : 0);
	return 0;
}

/* pd-send-duplex: decode RDMA_WRITEs out of its GPU (plus a SEND to say done) while loading into it. */
static int sc_pd_send_duplex(void)
{
	size_t N = O.pages, B = O.page_bytes, total = N * B;
	double rd[2] = {0}, h2d[2] = {0};
	if (me == PREFILL) {
		char *dst = pool_mmap(total, 0); /* registered host memory: RDMA-only, no CUDA */
		char *msg = pool_mmap(4096, 0);
		struct ibv_mr *mr = reg_mr(PD, dst, total, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		struct ibv_mr *mm = reg_mr(PD, msg, 4096, IBV_ACCESS_LOCAL_WRITE);
		connect_qp(mr);
		for (int ph = 0; ph < 2; ph++) {
			memset(dst, 0, total);
			memset(msg, 0, 64);
			post_recvs(1, 0x30000 + (uint64_t)ph, mm, 4096);
			barrier(10 + (uint32_t)ph * 10, "recv posted");
			struct ibv_wc wc;
			poll_n(RCQ, 1, &wc, "the done SEND");
			if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV || wc.byte_len != 64 ||
			    strcmp(msg, "pages done"))
				die("done SEND: status %d opcode %d byte_len %u", wc.status, wc.opcode, wc.byte_len);
			/* a plain WRITE gave this side no completion; the SEND after it is the notice */
			verify(dst, N, B, 2, "RDMA_WRITE");
			barrier(11 + (uint32_t)ph * 10, "prefill verified");
		}
		dereg_mr(mr);
		dereg_mr(mm);
		snprintf(extra, sizeof extra, "\"verified_pages\":%zu", 2 * N);
		return 0;
	}
	char *src = dev_alloc(total);
	fill(src, N, B, 2);
	char *msg = pool_mmap(4096, 0);
	snprintf(msg, 64, "pages done");
	struct ibv_mr *mr = reg_mr(PD, src, total, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *mm = reg_mr(PD, msg, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct hicache h;
	hicache_setup(&h, N, B);
	connect_qp(NULL);
	for (int ph = 0; ph < 2; ph++) {
		barrier(10 + (uint32_t)ph * 10, "recv posted");
		if (ph == 1) {
			hicache_reset(&h);
			hicache_enqueue(&h, "alone");
			hicache_finish(&h, "alone");
			h2d[0] = h2d_gbps("alone");
			hicache_reset(&h);
			hicache_enqueue(&h, "concurrent");
		}
		uint64_t t0 = truth_now_ns();
		int sig = post_pages(IBV_WR_RDMA_WRITE, src, mr, N, B, ph, 0x40000 + (uint64_t)ph * 0x1000, 0);
		uint64_t t1 = reap_sends(sig, "RDMA_WRITE send completions");
		rd[ph] = rate(total, t0, t1);
		struct ibv_sge s = {(uintptr_t)msg, 64, mm->lkey};
		struct ibv_send_wr w = {.wr_id = 0x4f000 + (uint64_t)ph, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
					.send_flags = IBV_SEND_SIGNALED};
		post_send(&w, -1);
		reap_sends(1, "SEND completion");
		if (ph == 1) {
			hicache_finish(&h, "concurrent");
			h2d[1] = h2d_gbps("concurrent");
		}
		barrier(11 + (uint32_t)ph * 10, "prefill verified");
	}
	hicache_teardown(&h);
	dereg_mr(mr);
	dereg_mr(mm);
	dev_free(src);
	fprintf(stderr,
		"pd-send-duplex decode: RDMA out of gpu-decode alone %.2f GB/s, with H2D %.2f GB/s (x%.2f); "
		"H2D alone %.2f GB/s, with RDMA send %.2f GB/s (x%.2f)\n",
		rd[0], rd[1], rd[1] > 0 ? rd[0] / rd[1] : 0, h2d[0], h2d[1], h2d[1] > 0 ? h2d[0] / h2d[1] : 0);
	snprintf(extra, sizeof extra,
		 "\"gbps\":{\"rdma_send_alone\":%.3f,\"h2d_alone\":%.3f,\"rdma_send_concurrent\":%.3f,"
		 "\"h2d_concurrent\":%.3f},\"slowdown\":{\"rdma\":%.3f,\"h2d\":%.3f}",
		 rd[0], h2d[0], rd[1], h2d[1], rd[1] > 0 ? rd[0] / rd[1] : 0, h2d[1] > 0 ? h2d[0] / h2d[1] : 0);
	return 0;
}

/* rdma-read: decode pulls pages from prefill's GPU into its own; then one READ with a bad rkey. */
static int sc_rdma_read(void)
{
	size_t N = O.pages, B = O.page_bytes, total = N * B;
	if (me == PREFILL) {
		char *src = dev_alloc(total);
		fill(src, N, B, 3);
		struct ibv_mr *mr = reg_mr(PD, src, total, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
		connect_qp(mr);
		/* a READ gives the target nothing to poll: it just waits to be told */
		barrier(10, "reads done");
		dereg_mr(mr);
		dev_free(src);
		snprintf(extra, sizeof extra, "\"target_completions\":0");
		return 0;
	}
	char *dst = dev_alloc(total);
	memset(dst, 0, total);
	struct ibv_mr *mr = reg_mr(PD, dst, total, IBV_ACCESS_LOCAL_WRITE);
	connect_qp(NULL);
	uint64_t t0 = truth_now_ns();
	int sig = post_pages(IBV_WR_RDMA_READ, dst, mr, N, B, 0, 0x50000, 0);
	uint64_t t1 = reap_sends(sig, "RDMA_READ completions");
	verify(dst, N, B, 3, "RDMA_READ");
	double rd = rate(total, t0, t1);
	/* a READ with a wrong rkey: the responder refuses it */
	struct ibv_sge s = {(uintptr_t)dst, 4096, mr->lkey};
	struct ibv_send_wr w = {.wr_id = 0x5ffff, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
				.send_flags = IBV_SEND_SIGNALED};
	w.wr.rdma.remote_addr = R->addr[other];
	w.wr.rdma.rkey = R->rkey[other] ^ 0x5a5a00;
	post_send(&w, -1);
	struct ibv_wc wc;
	poll_n(SCQ, 1, &wc, "the bad-rkey READ");
	if (wc.status != IBV_WC_REM_ACCESS_ERR || wc.wr_id != 0x5ffff)
		die("bad-rkey READ: status %d (%s), want IBV_WC_REM_ACCESS_ERR", wc.status, ibv_wc_status_str(wc.status));
	barrier(10, "reads done");
	dereg_mr(mr);
	dev_free(dst);
	fprintf(stderr, "rdma-read decode: READ into gpu-decode %.2f GB/s; bad rkey -> %s\n", rd,
		ibv_wc_status_str(wc.status));
	snprintf(extra, sizeof extra, "\"gbps\":{\"rdma_read\":%.3f},\"expected_errors\":1", rd);
	return 0;
}

/*
 * rdma-write-serial and rdma-write-pipelined (seed 002 §8.3; docs/design.md 6): a
 * store's transfer engine writes 256 pages of 16 KiB from its registered host pool
 * into decode's GPU with RDMA_WRITEs on one QP (Mooncake's put).
 *   serial     posts one WR, polls its completion, posts the next: one in flight at
 *              a time, each paying the NIC's turnaround (provider.c WR_TURNAROUND_NS)
 *              with the links idle meanwhile: too-little-in-flight.
 *   pipelined  posts them all ahead in chains of 4 (post_pages) and then reaps the
 *              completions: the NIC overlaps each turnaround with earlier WRs' bytes.
 */
#define INFLIGHT_PAGES 256
#define INFLIGHT_PAGE_BYTES (16u * 1024u)

static int sc_rdma_write_inflight(int serial)
{
	size_t N = O.pages, B = O.page_bytes, total = N * B;
	if (me == DECODE) {
		char *dst = dev_alloc(total);
		memset(dst, 0, total);
		struct ibv_mr *mr = reg_mr(PD, dst, total, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		connect_qp(mr);
		/* a WRITE gives the target nothing to poll: it waits to be told */
		barrier(10, "writes done");
		verify(dst, N, B, 4, "RDMA_WRITE");
		dereg_mr(mr);
		dev_free(dst);
		snprintf(extra, sizeof extra, "\"target_completions\":0");
		return 0;
	}
	char *src = pinned_pool(total, 0);
	fill(src, N, B, 4);
	struct ibv_mr *mr = reg_mr(PD, src, total, IBV_ACCESS_LOCAL_WRITE);
	connect_qp(NULL);
	uint64_t t0 = truth_now_ns(), t1;
	if (serial) {
		for (size_t p = 0; p < N; p++) {
			struct ibv_sge sge = {(uintptr_t)src + p * B, (uint32_t)B, mr->lkey};
			struct ibv_send_wr w = {.wr_id = 0x60000 + p, .sg_list = &sge, .num_sge = 1,
						.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
			w.wr.rdma.remote_addr = R->addr[other] + p * B;
			w.wr.rdma.rkey = R->rkey[other];
			post_send(&w, 0);
			reap_sends(1, "the page's RDMA_WRITE completion");
		}
		t1 = truth_now_ns();
	} else {
		t1 = reap_sends(post_pages(IBV_WR_RDMA_WRITE, src, mr, N, B, 0, 0x60000, 0), "RDMA_WRITE completions");
	}
	barrier(10, "writes done");
	dereg_mr(mr);
	host_unregister(src);
	munmap(src, total);
	double gbps = rate(total, t0, t1);
	fprintf(stderr, "%s prefill: RDMA_WRITE into gpu-decode %.2f GB/s\n", O.scenario, gbps);
	snprintf(extra, sizeof extra, "\"gbps\":{\"rdma_write\":%.3f}", gbps);
	return 0;
}

/* ---------------- ordering: completed is not consumable (seed 002 §4.1, §5) ---------------- */

/*
 * A KV transfer from prefill's GPU into decode's, shaped like a Mooncake/NIXL
 * transfer: the pages go as plain RDMA WRITEs on the data QP (every second one
 * signaled), then decode is told the KV is ready:
 *   kv-notify-early   a SEND on the control QP (connected to the same peer) right after
 *                     posting the WRITEs, before polling their completions: QPs are not
 *                     ordered with each other, so the notice may overtake the data
 *                     (cross-qp-notify); decode records how many pages were intact when
 *                     the notice arrived
 *   kv-notify-imm     the last page goes as RDMA_WRITE_WITH_IMM on the data QP: the
 *                     notice follows its data on one QP
 *   kv-notify-polled  the SEND on the control QP after polling the WRITEs' completions
 *                     (for RC a successful WRITE completion includes the peer's ACK)
 * Decode verifies every page once prefill has polled its completions.
 */
enum { NOTIFY_EARLY, NOTIFY_IMM, NOTIFY_POLLED };

static size_t intact_pages(const char *p, size_t pages, size_t pb, int seed)
{
	char *want = malloc(pb);
	size_t n = 0;
	if (!want)
		die("out of memory");
	for (size_t pg = 0; pg < pages; pg++) {
		for (size_t off = 0; off < pb; off += 4096) {
			size_t k = pb - off < 4096 ? pb - off : 4096;
			memset(want + off, (int)((pg * 131 + off / 4096 * 7 + (size_t)seed) & 0xff), k);
		}
		n += !memcmp(p + pg * pb, want, pb);
	}
	free(want);
	return n;
}

static int sc_kv_notify(int mode)
{
	size_t N = O.pages, B = O.page_bytes, total = N * B;
	if (N < 2)
		die("kv-notify-* needs at least 2 pages");
	if (me == PREFILL) {
		char *src = dev_alloc(total);
		fill(src, N, B, 4);
		char *msg = pool_mmap(4096, 0);
		snprintf(msg, 64, "kv ready");
		struct ibv_mr *mr = reg_mr(PD, src, total, IBV_ACCESS_LOCAL_WRITE);
		struct ibv_mr *mm = reg_mr(PD, msg, 4096, IBV_ACCESS_LOCAL_WRITE);
		connect_qp(NULL);
		barrier(10, "decode's receive posted");
		size_t writes = mode == NOTIFY_IMM ? N - 1 : N;
		int sig = post_pages(IBV_WR_RDMA_WRITE, src, mr, writes, B, 0, 0x60000, 0);
		if (mode == NOTIFY_IMM) {
			struct ibv_sge s = {(uintptr_t)src + writes * B, (uint32_t)B, mr->lkey};
			struct ibv_send_wr w = {.wr_id = 0x60000 + writes, .sg_list = &s, .num_sge = 1,
						.opcode = IBV_WR_RDMA_WRITE_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
						.imm_data = htonl((uint32_t)N)};
			w.wr.rdma.remote_addr = R->addr[other] + writes * B;
			w.wr.rdma.rkey = R->rkey[other];
			post_send(&w, -1);
			reap_sends(sig + 1, "WRITE and WRITE_WITH_IMM completions");
		} else {
			if (mode == NOTIFY_POLLED)
				reap_sends(sig, "RDMA_WRITE completions");
			struct ibv_sge s = {(uintptr_t)msg, 64, mm->lkey};
			struct ibv_send_wr w = {.wr_id = 0x6f000, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
						.send_flags = IBV_SEND_SIGNALED};
			post_send_on(QP2, &w, -1);
			/* the shared send CQ returns the WRITEs' and the SEND's completions */
			reap_sends(mode == NOTIFY_POLLED ? 1 : sig + 1, "send completions");
		}
		barrier(11, "prefill's completions polled");
		barrier(12, "decode verified");
		dereg_mr(mr);
		dereg_mr(mm);
		dev_free(src);
		snprintf(extra, sizeof extra, "\"notify\":\"%s\"",
			 mode == NOTIFY_EARLY ? "send_on_control_qp_before_completions"
			 : mode == NOTIFY_IMM ? "write_with_imm_on_data_qp"
					       : "send_on_control_qp_after_completions");
		return 0;
	}
	char *dst = dev_alloc(total);
	memset(dst, 0, total);
	char *msg = pool_mmap(4096, 0);
	struct ibv_mr *mr = reg_mr(PD, dst, total, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_mr *mm = reg_mr(PD, msg, 4096, IBV_ACCESS_LOCAL_WRITE);
	connect_qp(mr);
	if (mode == NOTIFY_IMM)
		post_recvs_on(QP, 1, 0x61000, NULL, 0);
	else
		post_recvs_on(QP2, 1, 0x61000, mm, 4096);
	barrier(10, "decode's receive posted");
	struct ibv_wc wc;
	poll_n(RCQ, 1, &wc, "the ready notice");
	if (wc.status != IBV_WC_SUCCESS)
		die("ready notice: %s", ibv_wc_status_str(wc.status));
	/* what a consumer trusting the notice would have read */
	size_t intact = intact_pages(dst, N, B, 4);
	barrier(11, "prefill's completions polled");
	verify(dst, N, B, 4, "the WRITEs");
	barrier(12, "decode verified");
	dereg_mr(mr);
	dereg_mr(mm);
	dev_free(dst);
	fprintf(stderr, "%s decode: %zu of %zu pages intact when the notice arrived\n", O.scenario, intact, N);
	snprintf(extra, sizeof extra, "\"pages_intact_at_notice\":%zu", intact);
	return 0;
}

/*
 * kv-notify-concurrent: a PD server with concurrent requests. KVC_THREADS prefill
 * threads, each with its own data and control QP to decode (and its own send CQ),
 * send KVC_ROUNDS requests each: the request's pages as plain RDMA WRITEs on its data
 * QP, then — after polling their completions — a SEND on its control QP. The
 * requests go in steps s = round * KVC_THREADS + thread, each step's thread:
 *   posts its WRITEs once step s-1 polled its own (so no two requests' pages move
 *   at once: the lanes see one flow at a time, and no overlap rule has a say);
 *   polls them once step s-1 posted its notice;
 *   posts its notice once step s+1 posted its WRITEs.
 * So every notice but the last goes out after its own WRITEs completed while the
 * next request's WRITEs to the same decode port, from another thread, are
 * outstanding, by construction: healthy, cross-qp-notify must stay silent.
 */
static uint64_t kvc_posted, kvc_polled, kvc_noticed; /* steps that got so far */

struct kvc {
	int i;
	char *src, *msg;
	struct ibv_mr *mr, *mm;
};

static void *kvc_thread(void *arg)
{
	const struct kvc *k = arg;
	size_t P = O.pages / (KVC_THREADS * KVC_ROUNDS), B = O.page_bytes;
	for (int r = 0; r < KVC_ROUNDS; r++) {
		uint64_t step = (uint64_t)r * KVC_THREADS + (uint64_t)k->i;
		size_t page0 = (size_t)step * P;
		wait_count(&kvc_polled, step, "the previous request's poll");
		int sig = post_pages_on(TQP[k->i][0], IBV_WR_RDMA_WRITE, k->src + page0 * B, k->mr, P, B, -1, 0x80000 + page0, 0,
					page0);
		__atomic_store_n(&kvc_posted, step + 1, __ATOMIC_RELEASE);
		wait_count(&kvc_noticed, step, "the previous request's notice");
		reap_sends_on(TCQ[k->i], sig, "RDMA_WRITE completions");
		__atomic_store_n(&kvc_polled, step + 1, __ATOMIC_RELEASE);
		if (step + 1 < KVC_THREADS * KVC_ROUNDS)
			wait_count(&kvc_posted, step + 2, "the next request's WRITEs");
		struct ibv_sge s = {(uintptr_t)k->msg + (uint64_t)k->i * 64, 64, k->mm->lkey};
		struct ibv_send_wr w = {.wr_id = 0x8f000 + step, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
					.send_flags = IBV_SEND_SIGNALED};
		post_send_on(TQP[k->i][1], &w, -1);
		__atomic_store_n(&kvc_noticed, step + 1, __ATOMIC_RELEASE);
		reap_sends_on(TCQ[k->i], 1, "the notice's completion");
	}
	return NULL;
}

static int sc_kv_concurrent(void)
{
	size_t N = O.pages, B = O.page_bytes, total = N * B;
	if (N % (KVC_THREADS * KVC_ROUNDS))
		die("kv-notify-concurrent needs pages in multiples of %d", KVC_THREADS * KVC_ROUNDS);
	char *msg = pool_mmap(4096, 0);
	if (me == PREFILL) {
		char *src = dev_alloc(total);
		fill(src, N, B, 6);
		for (int i = 0; i < KVC_THREADS; i++)
			snprintf(msg + i * 64, 64, "kv ready %d", i);
		struct ibv_mr *mr = reg_mr(PD, src, total, IBV_ACCESS_LOCAL_WRITE);
		struct ibv_mr *mm = reg_mr(PD, msg, 4096, IBV_ACCESS_LOCAL_WRITE);
		connect_qp(NULL);
		barrier(10, "decode's receives posted");
		pthread_t th[KVC_THREADS];
		struct kvc k[KVC_THREADS];
		for (int i = 0; i < KVC_THREADS; i++) {
			k[i] = (struct kvc){i, src, msg, mr, mm};
			if (pthread_create(&th[i], NULL, kvc_thread, &k[i]))
				die("pthread_create");
		}
		for (int i = 0; i < KVC_THREADS; i++)
			pthread_join(th[i], NULL);
		barrier(11, "prefill's completions polled");
		barrier(12, "decode verified");
		dereg_mr(mr);
		dereg_mr(mm);
		dev_free(src);
		snprintf(extra, sizeof extra, "\"notify\":\"per_thread_send_after_own_completions\",\"threads\":%d,\"rounds\":%d",
			 KVC_THREADS, KVC_ROUNDS);
		return 0;
	}
	char *dst = dev_alloc(total);
	memset(dst, 0, total);
	struct ibv_mr *mr = reg_mr(PD, dst, total, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_mr *mm = reg_mr(PD, msg, 4096, IBV_ACCESS_LOCAL_WRITE);
	connect_qp(mr);
	for (int i = 0; i < KVC_THREADS; i++)
		post_recvs_on(TQP[i][1], KVC_ROUNDS, 0x81000 + (uint64_t)(i * KVC_ROUNDS), mm, 64);
	barrier(10, "decode's receives posted");
	struct ibv_wc wc[KVC_THREADS * KVC_ROUNDS];
	poll_n(RCQ, KVC_THREADS * KVC_ROUNDS, wc, "the ready notices");
	for (int i = 0; i < KVC_THREADS * KVC_ROUNDS; i++)
		if (wc[i].status != IBV_WC_SUCCESS)
			die("ready notice %d: %s", i, ibv_wc_status_str(wc[i].status));
	barrier(11, "prefill's completions polled");
	verify(dst, N, B, 6, "the WRITEs");
	barrier(12, "decode verified");
	dereg_mr(mr);
	dereg_mr(mm);
	dev_free(dst);
	return 0;
}

/*
 * A staging buffer registered per transfer: prefill SENDs decode a transfer request,
 * then RDMA WRITEs the pages from the staging buffer into decode's GPU:
 *   mr-dereg-early   the staging region is deregistered right after posting, before
 *                    polling (a KV block released while its transfer is in flight), and
 *                    before decode accepted the request (posted its RECV): the QP holds
 *                    every WRITE behind the request, so the first completes with
 *                    IBV_WC_LOC_PROT_ERR and the rest flush (IBV_WC_WR_FLUSH_ERR), as
 *                    on mlx5 (mr-dereg-in-flight)
 *   mr-dereg-polled  deregistered after polling every completion
 */
static int sc_mr_dereg(int early)
{
	size_t N = O.pages, B = O.page_bytes, total = N * B;
	uint64_t last = 0x70000 + N - 1;
	if (me == PREFILL) {
		char *stage = pool_mmap(total, 0);
		fill(stage, N, B, 5);
		char *req = pool_mmap(4096, 0);
		snprintf(req, 64, "kv request");
		struct ibv_mr *mr = reg_mr(PD, stage, total, IBV_ACCESS_LOCAL_WRITE);
		struct ibv_mr *mq = reg_mr(PD, req, 4096, IBV_ACCESS_LOCAL_WRITE);
		connect_qp(NULL);
		barrier(10, "decode ready");
		struct ibv_sge s = {(uintptr_t)req, 64, mq->lkey};
		struct ibv_send_wr w = {.wr_id = 0x6ffff, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
					.send_flags = IBV_SEND_SIGNALED};
		post_send(&w, -1);
		int sig = post_pages(IBV_WR_RDMA_WRITE, stage, mr, N, B, 0, 0x70000, 0);
		if (early) {
			dereg_mr(mr);
			barrier(11, "the staging region deregistered");
			/* every WR that fails completes, signaled or not: poll until the last one */
			struct ibv_wc wc = {0};
			unsigned prot = 0, flushed = 0, ok = 0;
			while (wc.wr_id != last) {
				poll_n(SCQ, 1, &wc, "the last WRITE's completion");
				prot += wc.status == IBV_WC_LOC_PROT_ERR;
				flushed += wc.status == IBV_WC_WR_FLUSH_ERR;
				ok += wc.status == IBV_WC_SUCCESS;
			}
			if (ok != 1 || prot != 1 || flushed != N - 1)
				die("after the early deregistration: %u successes, %u LOC_PROT_ERR, %u WR_FLUSH_ERR; want the "
				    "request's success, 1 and %zu", ok, prot, flushed, N - 1);
		} else {
			reap_sends(sig + 1, "SEND and RDMA_WRITE completions");
			dereg_mr(mr);
			barrier(11, "the staging region deregistered");
		}
		barrier(12, "decode done");
		dereg_mr(mq);
		munmap(stage, total);
		munmap(req, 4096);
		fprintf(stderr, "%s prefill: %u completions in error\n", O.scenario, S.errors);
		snprintf(extra, sizeof extra, "\"dereg\":\"%s\",\"expected_errors\":%u", early ? "before_poll" : "after_poll",
			 S.errors);
		return 0;
	}
	char *dst = dev_alloc(total);
	memset(dst, 0, total);
	char *msg = pool_mmap(4096, 0);
	struct ibv_mr *mr = reg_mr(PD, dst, total, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_mr *mm = reg_mr(PD, msg, 4096, IBV_ACCESS_LOCAL_WRITE);
	connect_qp(mr);
	if (!early)
		post_recvs(1, 0x71000, mm, 4096);
	barrier(10, "decode ready");
	if (early) {
		barrier(11, "the staging region deregistered");
		post_recvs(1, 0x71000, mm, 4096); /* accepts the request only now */
	}
	struct ibv_wc wc;
	poll_n(RCQ, 1, &wc, "the transfer request");
	if (wc.status != IBV_WC_SUCCESS || strcmp(msg, "kv request"))
		die("transfer request: %s", ibv_wc_status_str(wc.status));
	if (!early) {
		barrier(11, "the staging region deregistered");
		verify(dst, N, B, 5, "the WRITEs");
	}
	barrier(12, "decode done");
	dereg_mr(mr);
	dereg_mr(mm);
	dev_free(dst);
	munmap(msg, 4096);
	return 0;
}

static const char *scenario_names[] = {"pd-transfer", "pd-overlap", "pd-send-duplex", "rdma-read", "rdma-write-serial", "rdma-write-pipelined",
				       "kv-notify-early", "kv-notify-imm", "kv-notify-polled", "kv-notify-concurrent",
				       "mr-dereg-early", "mr-dereg-polled", NULL};

/* ---------------- truth file: CUDA lines from truth.c, verbs lines from here ---------------- */

static void write_truth(void)
{
	char path[4096], tmp[4200];
	snprintf(path, sizeof path, "%s/%s-%s.jsonl", O.dir, O.scenario, role_names[me]);
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	char end_extra[1400];
	snprintf(end_extra, sizeof end_extra,
		 "\"role\":\"%s\",\"peer_pid\":%d,\"pages\":%zu,\"page_bytes\":%zu,\"posted_send\":%u,\"signaled\":%u,"
		 "\"posted_recv\":%u,\"completions\":%u,\"completion_errors\":%u,\"verified\":true%s%s",
		 role_names[me], R->pid[other], O.pages, O.page_bytes, S.posted_send, S.signaled, S.posted_recv,
		 S.completions, S.errors, extra[0] ? "," : "", extra);
	if (truth_write(tmp, end_extra))
		die("cannot write %s", tmp);
	FILE *in = fopen(tmp, "r"), *out = fopen(path, "w");
	if (!in || !out)
		die("cannot rewrite %s", path);
	char *line = NULL;
	size_t cap = 0;
	char scen[128];
	snprintf(scen, sizeof scen, "\"scenario\":\"%s\"", O.scenario);
	while (getline(&line, &cap, in) > 0) {
		unsigned long long seq = 0;
		if (sscanf(line, "{\"seq\":%llu,", &seq) == 1 && seq < vcap && vjson[seq]) {
			const struct truth_rec *r = truth_at(seq - 1);
			fprintf(out, "{\"seq\":%llu,%s,\"role\":\"%s\",\"pid\":%d,\"tid\":%d,\"api\":\"%s\",\"op\":\"%s\",%s}\n",
				seq, scen, role_names[me], (int)getpid(), r->tid, r->api, r->op, vjson[seq]);
			continue;
		}
		char *at = strstr(line, scen);
		if (!at) {
			fputs(line, out);
			continue;
		}
		at += strlen(scen);
		fwrite(line, 1, (size_t)(at - line), out);
		fprintf(out, ",\"role\":\"%s\"", role_names[me]);
		fputs(at, out);
	}
	free(line);
	fclose(in);
	if (fclose(out))
		die("cannot write %s", path);
	unlink(tmp);
}

/* ---------------- roles and launcher ---------------- */

/* Waits, after opening the device, until O.settle_file exists: the observer
 * (the selftest) creates it once it probed both roles' provider, so no load on
 * the machine can make a role post before that (a fixed pause can). */
static void settle_until_file(void)
{
	uint64_t deadline = truth_now_ns() + (uint64_t)O.timeout_s * 1000000000ull;
	while (access(O.settle_file, F_OK) != 0) {
		if (__atomic_load_n(&R->failed, __ATOMIC_ACQUIRE))
			die("the %s role failed (waiting for %s)", role_names[other], O.settle_file);
		if (truth_now_ns() > deadline)
			die("timed out after %us waiting for %s", O.timeout_s, O.settle_file);
		nap_us(1000);
	}
}

static int run_role(void)
{
	me = O.role;
	other = 1 - me;
	truth_init(O.scenario, refcudaSetCopyRecords);
	struct wire *w = wire_open(wire_name());
	if (!w)
		die("cannot open wire %s: %s", wire_name(), strerror(errno));
	R = (struct rdv *)w->app;
	verbs_open();
	if (O.settle_ms)
		nap_us((long)O.settle_ms * 1000);
	if (O.settle_file)
		settle_until_file();
	int rc;
	if (!strcmp(O.scenario, "pd-transfer"))
		rc = sc_pd_write(0);
	else if (!strcmp(O.scenario, "pd-overlap"))
		rc = sc_pd_write(1);
	else if (!strcmp(O.scenario, "pd-send-duplex"))
		rc = sc_pd_send_duplex();
	else if (!strncmp(O.scenario, "rdma-write-", 11))
		rc = sc_rdma_write_inflight(!strcmp(O.scenario, "rdma-write-serial"));
	else if (!strcmp(O.scenario, "rdma-read"))
		rc = sc_rdma_read();
	else if (concurrent())
		rc = sc_kv_concurrent();
	else if (!strncmp(O.scenario, "kv-notify-", 10))
		rc = sc_kv_notify(!strcmp(O.scenario, "kv-notify-early") ? NOTIFY_EARLY
				  : !strcmp(O.scenario, "kv-notify-imm") ? NOTIFY_IMM
									  : NOTIFY_POLLED);
	else
		rc = sc_mr_dereg(!strcmp(O.scenario, "mr-dereg-early"));
	barrier(100, "the end");
	verbs_close();
	if (rc == 0)
		write_truth();
	return rc;
}

static int launch(char **argv)
{
	(void)argv;
	const char *wn = wire_name();
	setenv("LW_REF_WIRE", wn, 1);
	if (mkdir(O.dir, 0777) && errno != EEXIST)
		die("mkdir %s: %s", O.dir, strerror(errno));
	/* fresh wire and fresh GPU lanes for every run */
	wire_unlink(wn);
	shm_unlink("/lw-ref-gpu-prefill");
	shm_unlink("/lw-ref-gpu-decode");
	pid_t pids[2];
	char pages[32], pb[32], to[32], settle[32];
	snprintf(settle, sizeof settle, "%u", O.settle_ms);
	snprintf(pages, sizeof pages, "%zu", O.pages);
	snprintf(pb, sizeof pb, "%zu", O.page_bytes);
	snprintf(to, sizeof to, "%u", O.timeout_s);
	for (int r = 0; r < 2; r++) {
		pids[r] = fork();
		if (pids[r] < 0)
			die("fork: %s", strerror(errno));
		if (pids[r] == 0) {
			setenv("LW_REF_GPU", r == DECODE ? "gpu-decode" : "gpu-prefill", 1);
			char *args[] = {"rdmapath", "--role", (char *)role_names[r], "--scenario", (char *)O.scenario,
					"--truth-dir", (char *)O.dir, "--pages", pages, "--page-bytes", pb,
					"--timeout-s", to, "--settle-ms", settle, NULL, NULL, NULL};
			if (O.settle_file) {
				args[15] = "--settle-file";
				args[16] = (char *)O.settle_file;
			}
			execv("/proc/self/exe", args);
			perror("exec /proc/self/exe");
			_exit(127);
		}
	}
	int bad = 0, left = 2;
	uint64_t deadline = truth_now_ns() + (uint64_t)(O.timeout_s * 2 + 10) * 1000000000ull;
	while (left) {
		int st;
		pid_t p = waitpid(-1, &st, WNOHANG);
		if (p > 0) {
			int r = p == pids[0] ? 0 : 1;
			pids[r] = 0;
			left--;
			if (!WIFEXITED(st) || WEXITSTATUS(st)) {
				fprintf(stderr, "rdmapath: %s role failed (%s %d)\n", role_names[r],
					WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
				bad = 1;
			}
			continue;
		}
		if (truth_now_ns() > deadline) {
			fprintf(stderr, "rdmapath: roles did not finish in time; killing them\n");
			for (int r = 0; r < 2; r++)
				if (pids[r] > 0)
					kill(pids[r], SIGKILL);
			deadline = UINT64_MAX;
			bad = 1;
		}
		nap_us(2000);
	}
	wire_unlink(wn);
	shm_unlink("/lw-ref-gpu-prefill");
	shm_unlink("/lw-ref-gpu-decode");
	return bad ? 1 : 0;
}

static size_t num(const char *flag, const char *v)
{
	char *end;
	errno = 0;
	unsigned long long n = strtoull(v ? v : "", &end, 0);
	if (!v || errno || end == v || *end || n == 0) {
		fprintf(stderr, "rdmapath: %s wants a positive number, got %s\n", flag, v ? v : "nothing");
		exit(2);
	}
	return (size_t)n;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: rdmapath --scenario NAME --truth-dir DIR [--pages N] [--page-bytes B] [--timeout-s S] [--settle-ms MS] [--settle-file PATH]\n"
		   "scenarios: pd-transfer pd-overlap pd-send-duplex rdma-read rdma-write-serial rdma-write-pipelined\n"
		   "           kv-notify-early kv-notify-imm kv-notify-polled kv-notify-concurrent\n"
		   "           mr-dereg-early mr-dereg-polled\n");
}

int main(int argc, char **argv)
{
	int pages_given = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--scenario") && v)
			O.scenario = argv[++i];
		else if (!strcmp(a, "--truth-dir") && v)
			O.dir = argv[++i];
		else if (!strcmp(a, "--pages"))
			O.pages = num(a, v), i++, pages_given = 1;
		else if (!strcmp(a, "--page-bytes"))
			O.page_bytes = num(a, v), i++, pages_given = 1;
		else if (!strcmp(a, "--timeout-s"))
			O.timeout_s = (unsigned)num(a, v), i++;
		else if (!strcmp(a, "--settle-ms")) /* 0 (no pause) is what the parent passes by default */
			O.settle_ms = v && !strcmp(v, "0") ? 0 : (unsigned)num(a, v), i++;
		else if (!strcmp(a, "--settle-file") && v)
			O.settle_file = v, i++;
		else if (!strcmp(a, "--role") && v) {
			O.role = !strcmp(v, "prefill") ? PREFILL : !strcmp(v, "decode") ? DECODE : -2;
			i++;
		} else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage(stdout);
			return 0;
		} else {
			fprintf(stderr, "rdmapath: unknown or incomplete argument %s\n", a);
			usage(stderr);
			return 2;
		}
	}
	int known = 0;
	for (const char **s = scenario_names; O.scenario && *s; s++)
		known |= !strcmp(*s, O.scenario);
	if (!known || !O.dir || O.role == -2) {
		fprintf(stderr, "rdmapath: %s\n", !known ? "unknown or missing --scenario" : !O.dir ? "--truth-dir DIR is required" : "--role is prefill or decode");
		usage(stderr);
		return 2;
	}
	if (!strncmp(O.scenario, "rdma-write-", 11) && !pages_given) { /* small pages: their own defaults */
		O.pages = INFLIGHT_PAGES;
		O.page_bytes = INFLIGHT_PAGE_BYTES;
	}
	if (O.page_bytes > UINT32_MAX || O.pages > 100000) {
		fprintf(stderr, "rdmapath: --page-bytes must fit 32 bits and --pages at most 100000\n");
		return 2;
	}
	if (O.pages * O.page_bytes > 200 * MiB) {
		fprintf(stderr, "rdmapath: at most 200 MiB per buffer (pages x page-bytes)\n");
		return 2;
	}
	return O.role < 0 ? launch(argv) : run_role();
}

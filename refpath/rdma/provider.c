/*
 * The reference RDMA provider: build/rdma/libibverbs.so.1.
 *
 * Exports the libibverbs entry points the reference path uses, with the real ABI
 * of <infiniband/verbs.h> (rdma-core 44), so an application linked with -libverbs
 * gets it through its RUNPATH. Like a stripped Debian provider (libmlx5), the data
 * path — post_send, post_recv, poll_cq — is reachable only through the
 * context's ops table: static, hidden functions with no dynamic symbol. An observer
 * must read the function pointers out of struct ibv_context at run time.
 *
 * The "NIC" is one thread per process. It executes the WRs posted to this
 * process's QPs, in order per QP, against the peer's registered memory with
 * process_vm_writev/readv, validates keys, bounds and access, consumes the peer's
 * RECVs and pushes completions into CQ rings that live in the shared wire (see
 * wire.h). Bytes into or out of "GPU" memory take time on that GPU's shared lanes
 * (refcudaLaneReserve in the reference libcuda, looked up with dlsym so this
 * library does not depend on it); every transfer also takes time on the NIC links
 * (LW_REF_NIC_GBPS per direction, default 4).
 *
 * Written for lanewatch from the public verbs ABI; no rdma-core code.
 */
#include "wire.h"
#include <dlfcn.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <time.h>

#define API __attribute__((visibility("default"), noinline))

#define SQ_MAX_DEPTH 4096
#define SQ_MAX_SGE 8
#define CHUNK (256u * 1024u)
#define CATCH_UP_NS 2000000ull
#define RNR_TIMEOUT_NS 5000000000ull /* a WITH_IMM/SEND waits this long for a RECV */
#define CQ_FULL_TIMEOUT_NS 5000000000ull

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t)
{
	if (now_ns() >= t)
		return;
	struct timespec ts = {.tv_sec = (time_t)(t / 1000000000ull), .tv_nsec = (long)(t % 1000000000ull)};
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static void nap_us(long us)
{
	struct timespec ts = {0, us * 1000};
	nanosleep(&ts, NULL);
}

/* ---------------- process-local objects ---------------- */

struct ref_ctx {
	struct ibv_context ctx;
	struct wire *w;
	int nic; /* wire NIC slot */
};

struct ref_cq {
	struct ibv_cq cq;
	int idx;
};

struct sq_ent {
	struct ibv_send_wr wr; /* next and sg_list not used: see sge */
	struct ibv_sge sge[SQ_MAX_SGE];
	uint64_t ready_ns; /* its first byte moves no earlier: posted + WR_TURNAROUND_NS */
};

/*
 * A WR's turnaround: from the doorbell to its first byte on the wire (the NIC fetches
 * the WQE and its data over PCIe, the packet crosses the fabric and the ACK comes
 * back before the completion is written). WRs queued behind others overlap it with
 * their predecessors' bytes; one WR at a time, each polled before the next is
 * posted, pays it every time. Real RC WRITEs take a few us; 10 us against the
 * reference's 4 GB/s links is a bandwidth-delay product of 40 kB.
 */
#define WR_TURNAROUND_NS 10000ull

struct ref_qp {
	struct ibv_qp qp;
	int idx; /* wire QP slot */
	int sq_sig_all;
	uint32_t depth, max_sge;
	struct sq_ent *sq;
	uint64_t sq_head, sq_tail; /* under nic.mu */
	int busy;                  /* the NIC is executing its head WR */
	int err;                   /* in the error state: the rest flushes */
	struct ref_qp *next;
};

static struct ibv_device ref_device = {
	.node_type = IBV_NODE_CA,
	.transport_type = IBV_TRANSPORT_IB,
	.name = "refrdma0",
	.dev_name = "uverbs0",
	.dev_path = "/sys/class/infiniband_verbs/uverbs0",
	.ibdev_path = "/sys/class/infiniband/refrdma0",
};

/* The NIC: one thread per process serving every QP of the process. */
static struct {
	pthread_mutex_t mu;
	pthread_cond_t work, idle;
	struct ref_qp *qps;
	struct ref_qp *rr; /* round-robin position */
	int started;
	struct wire *w;
	int nic;
} nic = {.mu = PTHREAD_MUTEX_INITIALIZER, .work = PTHREAD_COND_INITIALIZER, .idle = PTHREAD_COND_INITIALIZER};

static int pd_handles;

/* ---------------- helpers ---------------- */

static int pid_alive(int32_t pid)
{
	return pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH);
}

static double env_gbps(const char *name, double def)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return def;
	char *end;
	double d = strtod(v, &end);
	return end != v && d > 0 ? d : def;
}

typedef int (*devptr_fn)(const void *, size_t, char *, size_t);
typedef uint64_t (*reserve_fn)(const char *, int, size_t, uint64_t *);

static devptr_fn cuda_devptr(void)
{
	return (devptr_fn)dlsym(RTLD_DEFAULT, "refcudaDevicePointer");
}

static reserve_fn cuda_reserve(void)
{
	static reserve_fn f;
	static int looked;
	if (!__atomic_load_n(&looked, __ATOMIC_ACQUIRE)) {
		f = (reserve_fn)dlsym(RTLD_DEFAULT, "refcudaLaneReserve");
		__atomic_store_n(&looked, 1, __ATOMIC_RELEASE);
	}
	return f;
}

static struct wire_mr *find_mr(struct wire *w, uint32_t key, int32_t owner)
{
	for (int i = 0; i < WIRE_MAX_MR; i++) {
		struct wire_mr *m = &w->mr[i];
		if (__atomic_load_n(&m->used, __ATOMIC_ACQUIRE) && m->key == key && m->owner == owner)
			return m;
	}
	return NULL;
}

static struct wire_qp *find_qp(struct wire *w, uint32_t qpn)
{
	for (int i = 0; i < WIRE_MAX_QP; i++) {
		struct wire_qp *q = &w->qp[i];
		if (__atomic_load_n(&q->used, __ATOMIC_ACQUIRE) && q->qp_num == qpn)
			return q;
	}
	return NULL;
}

/* A free slot (used == 0, or owned by a process that is gone); under w->mu. */
#define CLAIM(arr, n, out)                                                           \
	do {                                                                         \
		(out) = -1;                                                          \
		for (int i_ = 0; i_ < (n); i_++)                                     \
			if (!(arr)[i_].used || !pid_alive((arr)[i_].owner)) {        \
				(out) = i_;                                          \
				break;                                               \
			}                                                            \
	} while (0)

/* ---------------- lanes ---------------- */

static uint64_t wlane_reserve(struct wire_lane *l, size_t n, uint64_t *cursor)
{
	uint64_t now = now_ns(), start = now;
	if (*cursor && now > *cursor + CATCH_UP_NS)
		*cursor = 0;
	if (*cursor) {
		start = *cursor;
		if (now > start && now - start > CATCH_UP_NS)
			start = now - CATCH_UP_NS;
	}
	wire_lock(&l->mu);
	if (start < l->next_free)
		start = l->next_free;
	uint64_t end = start + (uint64_t)((double)n * l->ns_per_byte + 0.5);
	l->next_free = end;
	pthread_mutex_unlock(&l->mu);
	*cursor = end;
	return end;
}

/* The NIC thread's cursors: where its previous piece on each lane ended. */
#define NCUR 16
static struct {
	char key[WIRE_GPU_MAX + 8];
	uint64_t cur;
} cursors[NCUR];

static uint64_t *cursor_for(const char *kind, const char *name, int dir)
{
	char key[WIRE_GPU_MAX + 8];
	snprintf(key, sizeof key, "%s%d:%s", kind, dir, name);
	for (int i = 0; i < NCUR; i++) {
		if (!cursors[i].key[0])
			snprintf(cursors[i].key, sizeof cursors[i].key, "%s", key);
		if (!strcmp(cursors[i].key, key))
			return &cursors[i].cur;
	}
	static uint64_t spare;
	spare = 0;
	return &spare;
}

/* ---------------- completions ---------------- */

static void cq_push(struct wire *w, int idx, const struct ibv_wc *wc)
{
	if (idx < 0 || idx >= WIRE_MAX_CQ)
		return;
	struct wire_cq *c = &w->cq[idx];
	uint64_t deadline = now_ns() + CQ_FULL_TIMEOUT_NS;
	for (;;) {
		wire_lock(&c->mu);
		if (c->tail - c->head < WIRE_CQ_DEPTH) {
			c->ring[c->tail % WIRE_CQ_DEPTH] = *wc;
			__atomic_store_n(&c->tail, c->tail + 1, __ATOMIC_RELEASE);
			pthread_mutex_unlock(&c->mu);
			return;
		}
		pthread_mutex_unlock(&c->mu);
		if (now_ns() > deadline) {
			fprintf(stderr, "libibverbs (reference): CQ %d overrun, completion of wr_id %llu dropped\n", idx,
				(unsigned long long)wc->wr_id);
			return;
		}
		nap_us(50);
	}
}

/* ---------------- the NIC ---------------- */

/* One contiguous piece of a transfer: local and remote address and their memory. */
struct seg {
	uint64_t addr, len;
	const struct wire_mr *mr;
};

/*
 * Moves the bytes of one WR piece by piece. out: local -> remote (WRITE, SEND),
 * else remote -> local (READ). Every piece takes time on the NIC links of both
 * ends and on the GPU lane of each side whose memory is device memory.
 */
struct piece {
	uint64_t laddr, raddr, n, end;
};

static int copy_piece(int32_t peer, int out, const struct piece *p)
{
	sleep_until(p->end);
	struct iovec liov = {(void *)(uintptr_t)p->laddr, p->n};
	struct iovec riov = {(void *)(uintptr_t)p->raddr, p->n};
	ssize_t got = out ? process_vm_writev(peer, &liov, 1, &riov, 1, 0) : process_vm_readv(peer, &liov, 1, &riov, 1, 0);
	if (got != (ssize_t)p->n)
		return got < 0 ? errno : EIO;
	return 0;
}

/* The cursor of a lane for this WR: its first byte moves no earlier than ready. */
static uint64_t *wr_cursor(const char *kind, const char *name, int dir, uint64_t ready)
{
	uint64_t *c = cursor_for(kind, name, dir);
	if (*c && *c < ready)
		*c = ready;
	return c;
}

static int move_bytes(struct wire *w, int32_t peer, int peer_nic, int out, const struct seg *loc, int nloc,
		      const struct seg *rem, int nrem, uint64_t ready)
{
	sleep_until(ready); /* the turnaround: the lanes stay free for others meanwhile */
	struct piece pend = {0};
	int have_pend = 0;
	reserve_fn gpu_reserve = cuda_reserve();
	struct wire_nic *mine = &w->nic[nic.nic], *theirs = peer_nic >= 0 ? &w->nic[peer_nic] : NULL;
	int li = 0, ri = 0;
	uint64_t lo = 0, ro = 0;
	while (li < nloc && ri < nrem) {
		uint64_t n = loc[li].len - lo;
		if (rem[ri].len - ro < n)
			n = rem[ri].len - ro;
		if (n > CHUNK)
			n = CHUNK;
		if (n == 0) {
			if (loc[li].len == lo)
				li++, lo = 0;
			if (ri < nrem && rem[ri].len == ro)
				ri++, ro = 0;
			continue;
		}
		const struct wire_mr *lm = loc[li].mr, *rm = rem[ri].mr;
		uint64_t end = 0, e;
		/* NIC links: out = this NIC transmits, the peer's receives; READ the other way */
		e = wlane_reserve(out ? &mine->tx : &mine->rx, n, wr_cursor("n", "self", out, ready));
		end = e > end ? e : end;
		if (theirs) {
			e = wlane_reserve(out ? &theirs->rx : &theirs->tx, n, wr_cursor("p", "peer", out, ready));
			end = e > end ? e : end;
		}
		/* GPU lanes: data leaves the source's GPU (outbound), enters the target's (inbound) */
		if (gpu_reserve && lm->is_device) {
			e = gpu_reserve(lm->gpu, !out, n, wr_cursor("g", lm->gpu[0] ? lm->gpu : "-", !out, ready));
			end = e > end ? e : end;
		}
		if (gpu_reserve && rm->is_device && rm->gpu[0]) {
			e = gpu_reserve(rm->gpu, out, n, wr_cursor("g", rm->gpu, out, ready));
			end = e > end ? e : end;
		}
		/*
		 * Two pieces in flight, like a DMA engine: this piece's lane time is
		 * reserved before the previous one is waited for and copied, so the
		 * copy's CPU time does not cost the NIC its share of a contended lane.
		 */
		if (have_pend) {
			int rc = copy_piece(peer, out, &pend);
			if (rc)
				return rc;
		}
		pend = (struct piece){loc[li].addr + lo, rem[ri].addr + ro, n, end};
		have_pend = 1;
		lo += n;
		ro += n;
	}
	return have_pend ? copy_piece(peer, out, &pend) : 0;
}

static enum ibv_wc_opcode send_wc_opcode(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		return IBV_WC_RDMA_WRITE;
	case IBV_WR_RDMA_READ:
		return IBV_WC_RDMA_READ;
	default:
		return IBV_WC_SEND;
	}
}

/* Validates local SGEs against this process's MRs. */
static int local_segs(struct wire *w, const struct sq_ent *e, int need_write, struct seg *out, uint64_t *total)
{
	int32_t me = getpid();
	*total = 0;
	for (int i = 0; i < e->wr.num_sge; i++) {
		const struct ibv_sge *s = &e->sge[i];
		const struct wire_mr *m = find_mr(w, s->lkey, me);
		if (!m || s->addr < m->addr || s->length > m->length || s->addr - m->addr > m->length - s->length)
			return -1;
		if (need_write && !(m->access & IBV_ACCESS_LOCAL_WRITE))
			return -1;
		out[i] = (struct seg){s->addr, s->length, m};
		*total += s->length;
	}
	return 0;
}

/* Takes the head RECV of a QP's receive queue, waiting (RNR retry) up to the timeout. */
static int take_recv(struct wire_qp *q, struct wire_recv *r)
{
	uint64_t deadline = now_ns() + RNR_TIMEOUT_NS;
	for (;;) {
		wire_lock(&q->rq_mu);
		if (q->rq_head != q->rq_tail) {
			*r = q->rq[q->rq_head % WIRE_RQ_DEPTH];
			q->rq_head++;
			pthread_mutex_unlock(&q->rq_mu);
			return 0;
		}
		pthread_mutex_unlock(&q->rq_mu);
		if (now_ns() > deadline)
			return -1;
		nap_us(20);
	}
}

static void execute(struct ref_qp *qp, const struct sq_ent *e)
{
	struct wire *w = nic.w;
	struct wire_qp *wq = &w->qp[qp->idx];
	const struct ibv_send_wr *wr = &e->wr;
	int signaled = qp->sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
	struct ibv_wc wc = {.wr_id = wr->wr_id, .status = IBV_WC_SUCCESS, .opcode = send_wc_opcode(wr->opcode),
			    .qp_num = qp->qp.qp_num};
	struct seg loc[SQ_MAX_SGE], rem[WIRE_RECV_SGE];
	int nrem = 0;
	uint64_t total = 0;
	struct wire_qp *pq = NULL;
	int is_read = wr->opcode == IBV_WR_RDMA_READ;
	int needs_recv = wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM || wr->opcode == IBV_WR_SEND ||
			 wr->opcode == IBV_WR_SEND_WITH_IMM;
	int is_send = wr->opcode == IBV_WR_SEND || wr->opcode == IBV_WR_SEND_WITH_IMM;
	struct wire_recv rv;
	int have_recv = 0;

	if (qp->err) {
		wc.status = IBV_WC_WR_FLUSH_ERR;
		goto done;
	}
	pq = find_qp(w, wq->peer_qpn);
	if (!pq || !pid_alive(pq->owner)) {
		wc.status = IBV_WC_RETRY_EXC_ERR; /* nobody answers */
		goto done;
	}
	if (local_segs(w, e, is_read, loc, &total)) {
		wc.status = IBV_WC_LOC_PROT_ERR;
		goto done;
	}
	if (wr->opcode == IBV_WR_RDMA_WRITE || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM || is_read) {
		const struct wire_mr *m = find_mr(w, wr->wr.rdma.rkey, pq->owner);
		uint64_t ra = wr->wr.rdma.remote_addr;
		unsigned need = is_read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
		if (!m || !(m->access & need) || ra < m->iova || total > m->length || ra - m->iova > m->length - total) {
			wc.status = IBV_WC_REM_ACCESS_ERR;
			goto done;
		}
		rem[0] = (struct seg){m->addr + (ra - m->iova), total, m};
		nrem = 1;
	}
	if (needs_recv) {
		if (take_recv(pq, &rv)) {
			wc.status = IBV_WC_RNR_RETRY_EXC_ERR;
			goto done;
		}
		have_recv = 1;
	}
	if (is_send) {
		/* scatter into the RECV's buffers, validated against the receiver's MRs */
		uint64_t room = 0;
		for (uint32_t i = 0; i < rv.num_sge && i < WIRE_RECV_SGE; i++) {
			const struct ibv_sge *s = &rv.sge[i];
			const struct wire_mr *m = find_mr(w, s->lkey, pq->owner);
			if (!m || !(m->access & IBV_ACCESS_LOCAL_WRITE) || s->addr < m->addr || s->length > m->length ||
			    s->addr - m->addr > m->length - s->length) {
				wc.status = IBV_WC_REM_OP_ERR;
				goto recv_done;
			}
			rem[nrem++] = (struct seg){s->addr, s->length, m};
			room += s->length;
		}
		if (room < total) {
			wc.status = IBV_WC_REM_INV_REQ_ERR;
			goto recv_done;
		}
	}
	if (total) {
		int rc = move_bytes(w, pq->owner, pq->nic, !is_read, loc, wr->num_sge, rem, nrem, e->ready_ns);
		if (rc) {
			wc.status = IBV_WC_REM_ACCESS_ERR;
			wc.vendor_err = (uint32_t)rc;
		}
	}
	wc.byte_len = (uint32_t)total;
recv_done:
	if (have_recv) {
		struct ibv_wc rwc = {.wr_id = rv.wr_id,
				     .status = wc.status == IBV_WC_REM_INV_REQ_ERR ? IBV_WC_LOC_LEN_ERR
										: wc.status == IBV_WC_REM_OP_ERR ? IBV_WC_LOC_PROT_ERR
														  : wc.status,
				     .opcode = is_send ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM,
				     .byte_len = (uint32_t)total,
				     .qp_num = pq->qp_num,
				     .src_qp = qp->qp.qp_num};
		if (wr->opcode != IBV_WR_SEND) {
			rwc.imm_data = wr->imm_data;
			rwc.wc_flags = IBV_WC_WITH_IMM;
		}
		cq_push(w, pq->recv_cq, &rwc);
	}
done:
	if (wc.status != IBV_WC_SUCCESS) {
		wc.byte_len = 0;
		if (!qp->err) {
			qp->err = 1;
			qp->qp.state = IBV_QPS_ERR;
			wq->state = IBV_QPS_ERR;
		}
	}
	if (signaled || wc.status != IBV_WC_SUCCESS)
		cq_push(w, wq->send_cq, &wc);
}

static void *nic_main(void *arg)
{
	(void)arg;
	/* the NIC is hardware: no CPU scheduler delays it (refpath/driver/mover.c) */
	struct sched_param sp = {.sched_priority = 2};
	(void)pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp);
	prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
	prctl(PR_SET_NAME, "refrdma-nic", 0, 0, 0);
	pthread_mutex_lock(&nic.mu);
	for (;;) {
		/* round robin over the QPs, one WR at a time, in order per QP */
		struct ref_qp *pick = NULL, *start = nic.rr && nic.rr->next ? nic.rr->next : nic.qps;
		for (struct ref_qp *q = start; q && !pick; q = q->next)
			if (q->sq_head != q->sq_tail)
				pick = q;
		for (struct ref_qp *q = nic.qps; q && q != start && !pick; q = q->next)
			if (q->sq_head != q->sq_tail)
				pick = q;
		if (!pick) {
			pthread_cond_wait(&nic.work, &nic.mu);
			continue;
		}
		nic.rr = pick;
		struct sq_ent e = pick->sq[pick->sq_head % pick->depth];
		pick->busy = 1;
		pthread_mutex_unlock(&nic.mu);
		execute(pick, &e);
		pthread_mutex_lock(&nic.mu);
		pick->sq_head++;
		pick->busy = 0;
		pthread_cond_broadcast(&nic.idle);
	}
	return NULL;
}

/* ---------------- the data path: hidden, reachable only through ctx->ops ---------------- */

static int ref_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	struct ref_qp *qp = (struct ref_qp *)ibqp;
	int rc = 0;
	pthread_mutex_lock(&nic.mu);
	for (; wr; wr = wr->next) {
		switch (wr->opcode) {
		case IBV_WR_RDMA_WRITE:
		case IBV_WR_RDMA_WRITE_WITH_IMM:
		case IBV_WR_SEND:
		case IBV_WR_SEND_WITH_IMM:
		case IBV_WR_RDMA_READ:
			break;
		default:
			rc = EINVAL;
		}
		if (!rc && (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->max_sge || (wr->num_sge && !wr->sg_list) ||
			    (wr->send_flags & IBV_SEND_INLINE)))
			rc = EINVAL;
		if (!rc && qp->qp.state != IBV_QPS_RTS)
			rc = EINVAL;
		if (!rc && qp->sq_tail - qp->sq_head >= qp->depth)
			rc = ENOMEM;
		if (rc) {
			if (bad_wr)
				*bad_wr = wr;
			break;
		}
		struct sq_ent *e = &qp->sq[qp->sq_tail % qp->depth];
		e->wr = *wr;
		e->wr.next = NULL;
		e->wr.sg_list = e->sge;
		memcpy(e->sge, wr->sg_list, (size_t)wr->num_sge * sizeof *e->sge);
		e->ready_ns = now_ns() + WR_TURNAROUND_NS;
		qp->sq_tail++;
	}
	pthread_cond_signal(&nic.work);
	pthread_mutex_unlock(&nic.mu);
	return rc;
}

static int ref_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct ref_qp *qp = (struct ref_qp *)ibqp;
	struct wire_qp *wq = &nic.w->qp[qp->idx];
	int rc = 0;
	wire_lock(&wq->rq_mu);
	for (; wr; wr = wr->next) {
		if (wr->num_sge < 0 || wr->num_sge > WIRE_RECV_SGE || (wr->num_sge && !wr->sg_list) ||
		    qp->qp.state == IBV_QPS_RESET || qp->qp.state == IBV_QPS_ERR)
			rc = EINVAL;
		else if (wq->rq_tail - wq->rq_head >= WIRE_RQ_DEPTH)
			rc = ENOMEM;
		if (rc) {
			if (bad_wr)
				*bad_wr = wr;
			break;
		}
		struct wire_recv *r = &wq->rq[wq->rq_tail % WIRE_RQ_DEPTH];
		r->wr_id = wr->wr_id;
		r->num_sge = (uint32_t)wr->num_sge;
		memcpy(r->sge, wr->sg_list, (size_t)wr->num_sge * sizeof *r->sge);
		wq->rq_tail++;
	}
	pthread_mutex_unlock(&wq->rq_mu);
	return rc;
}

static int ref_poll_cq(struct ibv_cq *ibcq, int num_entries, struct ibv_wc *wc)
{
	struct ref_cq *cq = (struct ref_cq *)ibcq;
	struct wire_cq *c = &nic.w->cq[cq->idx];
	if (num_entries <= 0)
		return 0;
	if (__atomic_load_n(&c->tail, __ATOMIC_ACQUIRE) == c->head)
		return 0; /* empty: no lock */
	int n = 0;
	wire_lock(&c->mu);
	while (n < num_entries && c->head != c->tail) {
		wc[n++] = c->ring[c->head % WIRE_CQ_DEPTH];
		c->head++;
	}
	pthread_mutex_unlock(&c->mu);
	return n;
}

static int ref_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	(void)cq;
	(void)solicited_only;
	return 0; /* no completion channels: callers poll */
}

/* ---------------- exported verbs ---------------- */

API const char *ibv_wc_status_str(enum ibv_wc_status status)
{
	switch (status) {
	case IBV_WC_SUCCESS: return "success";
	case IBV_WC_LOC_LEN_ERR: return "local length error";
	case IBV_WC_LOC_QP_OP_ERR: return "local QP operation error";
	case IBV_WC_LOC_PROT_ERR: return "local protection error";
	case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
	case IBV_WC_REM_INV_REQ_ERR: return "remote invalid request error";
	case IBV_WC_REM_ACCESS_ERR: return "remote access error";
	case IBV_WC_REM_OP_ERR: return "remote operation error";
	case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
	case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
	default: return "unknown";
	}
}

API struct ibv_device **ibv_get_device_list(int *num_devices)
{
	struct ibv_device **l = calloc(2, sizeof *l);
	if (!l) {
		errno = ENOMEM;
		return NULL;
	}
	l[0] = &ref_device;
	if (num_devices)
		*num_devices = 1;
	return l;
}

API void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

API const char *ibv_get_device_name(struct ibv_device *device)
{
	return device ? device->name : NULL;
}

API struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	if (device != &ref_device) {
		errno = ENODEV;
		return NULL;
	}
	struct wire *w = wire_open(wire_name());
	if (!w) {
		fprintf(stderr, "libibverbs (reference): cannot open wire %s: %s\n", wire_name(), strerror(errno));
		return NULL;
	}
	/* the peer's NIC thread writes into this process's memory (Yama ptrace_scope 1) */
	prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
	pthread_mutex_lock(&nic.mu);
	if (!nic.w) {
		int slot;
		wire_lock(&w->mu);
		CLAIM(w->nic, WIRE_MAX_NIC, slot);
		if (slot >= 0) {
			struct wire_nic *n = &w->nic[slot];
			double gbps = env_gbps("LW_REF_NIC_GBPS", 4);
			n->owner = getpid();
			n->tx.next_free = n->rx.next_free = 0;
			n->tx.ns_per_byte = n->rx.ns_per_byte = 1.0 / gbps;
			__atomic_store_n(&n->used, 1, __ATOMIC_RELEASE);
		}
		pthread_mutex_unlock(&w->mu);
		if (slot < 0) {
			pthread_mutex_unlock(&nic.mu);
			errno = ENOSPC;
			return NULL;
		}
		nic.w = w;
		nic.nic = slot;
	}
	pthread_mutex_unlock(&nic.mu);
	struct ref_ctx *c = calloc(1, sizeof *c);
	if (!c) {
		errno = ENOMEM;
		return NULL;
	}
	c->w = nic.w;
	c->nic = nic.nic;
	c->ctx.device = device;
	c->ctx.ops.poll_cq = ref_poll_cq;
	c->ctx.ops.req_notify_cq = ref_req_notify_cq;
	c->ctx.ops.post_send = ref_post_send;
	c->ctx.ops.post_recv = ref_post_recv;
	c->ctx.cmd_fd = -1;
	c->ctx.async_fd = -1;
	c->ctx.num_comp_vectors = 1;
	c->ctx.abi_compat = NULL; /* not an extended context: the *_ex inlines answer EOPNOTSUPP */
	pthread_mutex_init(&c->ctx.mutex, NULL);
	return &c->ctx;
}

API int ibv_close_device(struct ibv_context *context)
{
	if (!context)
		return EINVAL;
	free(context); /* the NIC slot stays with the process (reclaimed when it exits) */
	return 0;
}

API int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *attr)
{
	if (!context || !attr)
		return EINVAL;
	memset(attr, 0, sizeof *attr);
	snprintf(attr->fw_ver, sizeof attr->fw_ver, "1.0.0 (lanewatch reference)");
	attr->vendor_id = 0x4c57; /* "LW" */
	attr->max_mr_size = UINT64_MAX;
	attr->max_qp = WIRE_MAX_QP;
	attr->max_qp_wr = SQ_MAX_DEPTH;
	attr->max_sge = SQ_MAX_SGE;
	attr->max_cq = WIRE_MAX_CQ;
	attr->max_cqe = WIRE_CQ_DEPTH;
	attr->max_mr = WIRE_MAX_MR;
	attr->max_pd = 1 << 16;
	attr->max_qp_rd_atom = 16;
	attr->max_qp_init_rd_atom = 16;
	attr->phys_port_cnt = 1;
	return 0;
}

API struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	struct ibv_pd *pd = calloc(1, sizeof *pd);
	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	pd->context = context;
	pd->handle = (uint32_t)__atomic_add_fetch(&pd_handles, 1, __ATOMIC_RELAXED);
	return pd;
}

API int ibv_dealloc_pd(struct ibv_pd *pd)
{
	free(pd);
	return 0;
}

/* The funnel: every registration ends here, as in rdma-core. */
API struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
				    unsigned int access)
{
	if (!pd || !addr || !length) {
		errno = EINVAL;
		return NULL;
	}
	/* remote write or atomic access requires local write, as on real HCAs */
	if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE)) {
		errno = EINVAL;
		return NULL;
	}
	struct ref_ctx *c = (struct ref_ctx *)pd->context;
	struct wire *w = c->w;
	struct ibv_mr *mr = calloc(1, sizeof *mr);
	if (!mr) {
		errno = ENOMEM;
		return NULL;
	}
	char gpu[WIRE_GPU_MAX] = "";
	devptr_fn dp = cuda_devptr();
	int is_dev = dp ? dp(addr, length, gpu, sizeof gpu) : 0;
	int slot;
	wire_lock(&w->mu);
	CLAIM(w->mr, WIRE_MAX_MR, slot);
	if (slot >= 0) {
		struct wire_mr *m = &w->mr[slot];
		m->owner = getpid();
		/* like mlx5: index in the upper bits, a variant byte below */
		m->key = ((uint32_t)slot << 8) | (w->next_key++ & 0xff);
		m->access = access;
		m->addr = (uintptr_t)addr;
		m->iova = iova;
		m->length = length;
		m->is_device = (uint32_t)is_dev;
		snprintf(m->gpu, sizeof m->gpu, "%s", is_dev ? gpu : "");
		__atomic_store_n(&m->used, 1, __ATOMIC_RELEASE);
		mr->lkey = mr->rkey = m->key;
	}
	pthread_mutex_unlock(&w->mu);
	if (slot < 0) {
		free(mr);
		errno = ENOMEM;
		return NULL;
	}
	mr->context = pd->context;
	mr->pd = pd;
	mr->addr = addr;
	mr->length = length;
	mr->handle = (uint32_t)slot;
	return mr;
}

#undef ibv_reg_mr
API struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned int)access);
}

#undef ibv_reg_mr_iova
API struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, iova, (unsigned int)access);
}

API struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
				     int access)
{
	(void)pd, (void)offset, (void)length, (void)iova, (void)fd, (void)access;
	errno = EOPNOTSUPP; /* no dma-buf exporters on the reference path */
	return NULL;
}

/*
 * Port 1's GID 0: a RoCE-style link-local GID naming this process's NIC (the wire has
 * no subnet manager), fe80::<nic slot>:<pid>, which an application exchanges with
 * its peer and puts in the address vector it connects its QPs with.
 */
API int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid)
{
	if (!context || !gid || port_num != 1 || index != 0)
		return -1;
	struct ref_ctx *c = (struct ref_ctx *)context;
	uint32_t pid = (uint32_t)getpid();
	memset(gid, 0, sizeof *gid);
	gid->raw[0] = 0xfe;
	gid->raw[1] = 0x80;
	gid->raw[10] = (uint8_t)(c->nic >> 8);
	gid->raw[11] = (uint8_t)c->nic;
	gid->raw[12] = (uint8_t)(pid >> 24);
	gid->raw[13] = (uint8_t)(pid >> 16);
	gid->raw[14] = (uint8_t)(pid >> 8);
	gid->raw[15] = (uint8_t)pid;
	return 0;
}

/*
 * Like mlx5, deregistering succeeds whatever still uses the region: the NIC checks keys
 * when it starts a WR, so WRs not yet started complete with IBV_WC_LOC_PROT_ERR (the QP
 * then enters the error state and flushes the rest, IBV_WC_WR_FLUSH_ERR); the one in
 * progress finishes.
 */
API int ibv_dereg_mr(struct ibv_mr *mr)
{
	if (!mr)
		return EINVAL;
	struct wire *w = ((struct ref_ctx *)mr->context)->w;
	wire_lock(&w->mu);
	struct wire_mr *m = &w->mr[mr->handle % WIRE_MAX_MR];
	if (m->used && m->key == mr->lkey && m->owner == getpid())
		__atomic_store_n(&m->used, 0, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&w->mu);
	free(mr);
	return 0;
}

API struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
				 struct ibv_comp_channel *channel, int comp_vector)
{
	(void)comp_vector;
	if (!context || cqe < 1 || cqe > WIRE_CQ_DEPTH) {
		errno = EINVAL;
		return NULL;
	}
	struct wire *w = ((struct ref_ctx *)context)->w;
	struct ref_cq *cq = calloc(1, sizeof *cq);
	if (!cq) {
		errno = ENOMEM;
		return NULL;
	}
	int slot;
	wire_lock(&w->mu);
	CLAIM(w->cq, WIRE_MAX_CQ, slot);
	if (slot >= 0) {
		struct wire_cq *c = &w->cq[slot];
		c->owner = getpid();
		c->head = c->tail = 0;
		__atomic_store_n(&c->used, 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&w->mu);
	if (slot < 0) {
		free(cq);
		errno = ENOMEM;
		return NULL;
	}
	cq->idx = slot;
	cq->cq.context = context;
	cq->cq.channel = channel;
	cq->cq.cq_context = cq_context;
	cq->cq.handle = (uint32_t)slot;
	cq->cq.cqe = WIRE_CQ_DEPTH;
	pthread_mutex_init(&cq->cq.mutex, NULL);
	pthread_cond_init(&cq->cq.cond, NULL);
	return &cq->cq;
}

API int ibv_destroy_cq(struct ibv_cq *ibcq)
{
	if (!ibcq)
		return EINVAL;
	struct ref_cq *cq = (struct ref_cq *)ibcq;
	struct wire *w = ((struct ref_ctx *)ibcq->context)->w;
	wire_lock(&w->mu);
	__atomic_store_n(&w->cq[cq->idx].used, 0, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&w->mu);
	free(cq);
	return 0;
}

API struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	if (!pd || !attr || !attr->send_cq || !attr->recv_cq || attr->srq) {
		errno = EINVAL;
		return NULL;
	}
	if (attr->qp_type != IBV_QPT_RC) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	uint32_t depth = attr->cap.max_send_wr ? attr->cap.max_send_wr : 1;
	uint32_t sge = attr->cap.max_send_sge ? attr->cap.max_send_sge : 1;
	if (depth > SQ_MAX_DEPTH || sge > SQ_MAX_SGE || attr->cap.max_recv_wr > WIRE_RQ_DEPTH ||
	    attr->cap.max_recv_sge > WIRE_RECV_SGE || attr->cap.max_inline_data) {
		errno = EINVAL;
		return NULL;
	}
	struct ref_ctx *c = (struct ref_ctx *)pd->context;
	struct wire *w = c->w;
	struct ref_qp *qp = calloc(1, sizeof *qp);
	struct sq_ent *sq = calloc(depth, sizeof *sq);
	if (!qp || !sq) {
		free(qp);
		free(sq);
		errno = ENOMEM;
		return NULL;
	}
	int slot;
	uint32_t qpn = 0;
	wire_lock(&w->mu);
	CLAIM(w->qp, WIRE_MAX_QP, slot);
	if (slot >= 0) {
		struct wire_qp *q = &w->qp[slot];
		qpn = w->next_qpn++ & 0xffffff;
		q->owner = getpid();
		q->qp_num = qpn;
		q->peer_qpn = 0;
		q->state = IBV_QPS_RESET;
		q->send_cq = ((struct ref_cq *)attr->send_cq)->idx;
		q->recv_cq = ((struct ref_cq *)attr->recv_cq)->idx;
		q->nic = c->nic;
		q->rq_head = q->rq_tail = 0;
		__atomic_store_n(&q->used, 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&w->mu);
	if (slot < 0) {
		free(qp);
		free(sq);
		errno = ENOMEM;
		return NULL;
	}
	qp->idx = slot;
	qp->sq = sq;
	qp->depth = depth;
	qp->max_sge = sge;
	qp->sq_sig_all = attr->sq_sig_all;
	qp->qp.context = pd->context;
	qp->qp.qp_context = attr->qp_context;
	qp->qp.pd = pd;
	qp->qp.send_cq = attr->send_cq;
	qp->qp.recv_cq = attr->recv_cq;
	qp->qp.handle = (uint32_t)slot;
	qp->qp.qp_num = qpn;
	qp->qp.state = IBV_QPS_RESET;
	qp->qp.qp_type = IBV_QPT_RC;
	pthread_mutex_init(&qp->qp.mutex, NULL);
	pthread_cond_init(&qp->qp.cond, NULL);
	attr->cap.max_send_wr = depth;
	attr->cap.max_send_sge = sge;
	attr->cap.max_recv_wr = WIRE_RQ_DEPTH;
	attr->cap.max_recv_sge = WIRE_RECV_SGE;

	pthread_mutex_lock(&nic.mu);
	qp->next = nic.qps;
	nic.qps = qp;
	if (!nic.started) {
		pthread_t t;
		pthread_attr_t ta;
		pthread_attr_init(&ta);
		pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&t, &ta, nic_main, NULL) == 0)
			nic.started = 1;
		pthread_attr_destroy(&ta);
	}
	int ok = nic.started;
	pthread_mutex_unlock(&nic.mu);
	if (!ok) {
		fprintf(stderr, "libibverbs (reference): cannot start the NIC thread\n");
		errno = EAGAIN;
		return NULL; /* the QP stays listed but is never used */
	}
	return &qp->qp;
}

API int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask)
{
	if (!ibqp || !attr)
		return EINVAL;
	struct ref_qp *qp = (struct ref_qp *)ibqp;
	struct wire_qp *wq = &nic.w->qp[qp->idx];
	if (!(attr_mask & IBV_QP_STATE))
		return 0;
	enum ibv_qp_state s = attr->qp_state;
	if (s == IBV_QPS_RTR) {
		if (!(attr_mask & IBV_QP_DEST_QPN))
			return EINVAL;
		wq->peer_qpn = attr->dest_qp_num;
	} else if (s == IBV_QPS_RTS && ibqp->state != IBV_QPS_RTR && ibqp->state != IBV_QPS_RTS &&
		   ibqp->state != IBV_QPS_SQD) {
		return EINVAL;
	}
	pthread_mutex_lock(&nic.mu);
	ibqp->state = s;
	wq->state = s;
	if (s == IBV_QPS_RESET || s == IBV_QPS_INIT)
		qp->err = 0;
	if (s == IBV_QPS_ERR)
		qp->err = 1;
	pthread_mutex_unlock(&nic.mu);
	return 0;
}

API int ibv_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask, struct ibv_qp_init_attr *init_attr)
{
	(void)attr_mask;
	if (!ibqp || !attr)
		return EINVAL;
	struct ref_qp *qp = (struct ref_qp *)ibqp;
	memset(attr, 0, sizeof *attr);
	attr->qp_state = attr->cur_qp_state = ibqp->state;
	attr->dest_qp_num = nic.w->qp[qp->idx].peer_qpn;
	attr->cap.max_send_wr = qp->depth;
	attr->cap.max_send_sge = qp->max_sge;
	attr->cap.max_recv_wr = WIRE_RQ_DEPTH;
	attr->cap.max_recv_sge = WIRE_RECV_SGE;
	attr->path_mtu = IBV_MTU_4096;
	attr->port_num = 1;
	if (init_attr) {
		memset(init_attr, 0, sizeof *init_attr);
		init_attr->send_cq = ibqp->send_cq;
		init_attr->recv_cq = ibqp->recv_cq;
		init_attr->qp_context = ibqp->qp_context;
		init_attr->cap = attr->cap;
		init_attr->qp_type = IBV_QPT_RC;
		init_attr->sq_sig_all = qp->sq_sig_all;
	}
	return 0;
}

API int ibv_destroy_qp(struct ibv_qp *ibqp)
{
	if (!ibqp)
		return EINVAL;
	struct ref_qp *qp = (struct ref_qp *)ibqp;
	pthread_mutex_lock(&nic.mu);
	while (qp->busy)
		pthread_cond_wait(&nic.idle, &nic.mu);
	for (struct ref_qp **pp = &nic.qps; *pp; pp = &(*pp)->next)
		if (*pp == qp) {
			*pp = qp->next;
			break;
		}
	if (nic.rr == qp)
		nic.rr = NULL;
	pthread_mutex_unlock(&nic.mu);
	struct wire *w = nic.w;
	wire_lock(&w->mu);
	__atomic_store_n(&w->qp[qp->idx].used, 0, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&w->mu);
	free(qp->sq);
	free(qp);
	return 0;
}

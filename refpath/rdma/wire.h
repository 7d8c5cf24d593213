/*
 * The "wire" of the reference RDMA provider: one POSIX shared-memory segment,
 * /dev/shm/lw-ref-wire-<name> (LW_REF_WIRE, default wire0), shared by every process
 * on this machine that opens the reference device. It holds what a real fabric and
 * the peer's HCA would know: registered MRs (by key), QPs with their receive
 * queues and peers, completion queue rings (so the peer's NIC can push completions
 * into them), per-process NIC link lanes, and a small rendezvous area the scenario
 * driver uses to exchange qp_num/addr/rkey and phase flags (no sockets).
 *
 * Shared by the provider (rdma/provider.c) and the scenario driver (rdma/rdmapath.c).
 */
#ifndef REFPATH_RDMA_WIRE_H
#define REFPATH_RDMA_WIRE_H

#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define WIRE_MAGIC 0x6c77726477697231ull /* "lwrdwir1" */
#define WIRE_VERSION 1
#define WIRE_NAME_MAX 32
#define WIRE_GPU_MAX 48

#define WIRE_MAX_MR 256
#define WIRE_MAX_QP 32
#define WIRE_MAX_CQ 16
#define WIRE_MAX_NIC 16
#define WIRE_RQ_DEPTH 1024 /* receive WRs per QP */
#define WIRE_RECV_SGE 4
#define WIRE_CQ_DEPTH 4096 /* completions per CQ ring */
#define WIRE_APP_BYTES 8192

/* A lane: next free time and rate, as in the CUDA reference library's lane model. */
struct wire_lane {
	pthread_mutex_t mu;
	uint64_t next_free;
	double ns_per_byte;
};

struct wire_mr {
	uint32_t used;
	int32_t owner; /* pid */
	uint32_t key;  /* lkey == rkey */
	uint32_t access;
	uint64_t addr, iova, length;
	uint32_t is_device;
	char gpu[WIRE_GPU_MAX];
};

struct wire_recv {
	uint64_t wr_id;
	uint32_t num_sge;
	uint32_t pad;
	struct ibv_sge sge[WIRE_RECV_SGE];
};

struct wire_qp {
	uint32_t used;
	int32_t owner;
	uint32_t qp_num;
	uint32_t peer_qpn; /* dest_qp_num once RTR */
	uint32_t state;    /* enum ibv_qp_state */
	int32_t send_cq, recv_cq; /* wire CQ indexes */
	int32_t nic;              /* the owner's NIC slot */
	pthread_mutex_t rq_mu;
	uint64_t rq_head, rq_tail; /* head: next to consume; tail: next free */
	struct wire_recv rq[WIRE_RQ_DEPTH];
};

struct wire_cq {
	uint32_t used;
	int32_t owner;
	pthread_mutex_t mu;
	uint64_t head, tail;
	struct ibv_wc ring[WIRE_CQ_DEPTH];
};

/* A process's NIC: one link lane per direction. */
struct wire_nic {
	uint32_t used;
	int32_t owner;
	struct wire_lane tx, rx;
};

struct wire {
	uint64_t magic;
	uint32_t version;
	uint32_t state; /* 0 uninit, 1 initialising, 2 ready */
	pthread_mutex_t mu; /* allocation of table entries */
	uint32_t next_key, next_qpn;
	struct wire_mr mr[WIRE_MAX_MR];
	struct wire_qp qp[WIRE_MAX_QP];
	struct wire_cq cq[WIRE_MAX_CQ];
	struct wire_nic nic[WIRE_MAX_NIC];
	/* rendezvous for the scenario driver (its own layout) */
	unsigned char app[WIRE_APP_BYTES] __attribute__((aligned(64)));
};

static inline void wire_mutex_init(pthread_mutex_t *m)
{
	pthread_mutexattr_t a;
	pthread_mutexattr_init(&a);
	pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(m, &a);
	pthread_mutexattr_destroy(&a);
}

static inline void wire_lock(pthread_mutex_t *m)
{
	if (pthread_mutex_lock(m) == EOWNERDEAD)
		pthread_mutex_consistent(m);
}

static inline const char *wire_name(void)
{
	const char *n = getenv("LW_REF_WIRE");
	return n && *n ? n : "wire0";
}

/* Maps (creating if needed) /dev/shm/lw-ref-wire-<name>; NULL with errno on failure. */
static inline struct wire *wire_open(const char *name)
{
	char path[WIRE_NAME_MAX + 32];
	if (!name || !*name || strlen(name) >= WIRE_NAME_MAX || strchr(name, '/')) {
		errno = EINVAL;
		return NULL;
	}
	snprintf(path, sizeof path, "/lw-ref-wire-%s", name);
	int fd = shm_open(path, O_RDWR | O_CREAT, 0666);
	if (fd < 0)
		return NULL;
	struct stat st;
	if (fstat(fd, &st) != 0 || ((size_t)st.st_size < sizeof(struct wire) && ftruncate(fd, sizeof(struct wire)) != 0)) {
		int e = errno;
		close(fd);
		errno = e;
		return NULL;
	}
	void *p = mmap(NULL, sizeof(struct wire), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return NULL;
	struct wire *w = p;
	uint32_t expect = 0;
	if (__atomic_compare_exchange_n(&w->state, &expect, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
		wire_mutex_init(&w->mu);
		for (int i = 0; i < WIRE_MAX_QP; i++)
			wire_mutex_init(&w->qp[i].rq_mu);
		for (int i = 0; i < WIRE_MAX_CQ; i++)
			wire_mutex_init(&w->cq[i].mu);
		for (int i = 0; i < WIRE_MAX_NIC; i++) {
			wire_mutex_init(&w->nic[i].tx.mu);
			wire_mutex_init(&w->nic[i].rx.mu);
		}
		w->next_key = 0x1000;
		w->next_qpn = 0x100;
		w->version = WIRE_VERSION;
		w->magic = WIRE_MAGIC;
		__atomic_store_n(&w->state, 2, __ATOMIC_RELEASE);
	} else {
		for (int i = 0; i < 200000 && __atomic_load_n(&w->state, __ATOMIC_ACQUIRE) != 2; i++)
			usleep(10);
		if (__atomic_load_n(&w->state, __ATOMIC_ACQUIRE) != 2 || w->magic != WIRE_MAGIC ||
		    w->version != WIRE_VERSION) {
			munmap(p, sizeof(struct wire));
			errno = EPROTO;
			return NULL;
		}
	}
	return w;
}

/* Removes the segment (the next opener creates a fresh one). */
static inline void wire_unlink(const char *name)
{
	char path[WIRE_NAME_MAX + 32];
	snprintf(path, sizeof path, "/lw-ref-wire-%s", name);
	shm_unlink(path);
}

#endif

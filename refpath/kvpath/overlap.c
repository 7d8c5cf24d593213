/*
 * The shapes of same-direction overlap (docs/design.md 1.1 and 6, issue 11): what
 * must and must not make the agent's same-direction-overlap finding. Each shape is
 * produced by construction, not by timing luck: the reference copy engines run as
 * movers (driver/mover.c), and where two flows must be in flight together they are
 * submitted in lockstep, so neither can run alone for more than a few copies however
 * late its submitter is scheduled.
 *
 *   no-overlap       two streams of one process on one GPU, in phases A, B, A, B, each
 *                    synchronised before the next starts: each flow's first-to-last
 *                    interval covers the other's phases, yet they are never in flight
 *                    together (no finding).
 *   big-and-trickle  one stream loads `layers` x layer_bytes while another makes four
 *                    4 KiB copies, each synchronised, a millisecond apart (no finding:
 *                    the trickle never carries a real share of the lane).
 *   two-proc-lane    two processes on one reference GPU (LW_REF_GPU=<name> in both,
 *                    shared lanes), each loading `layers` x layer_bytes, in lockstep
 *                    through /dev/shm/lw-ref-<name>-pair: neither submits more than
 *                    PAIR_AHEAD copies ahead of the other (finding: the inbound lane is
 *                    saturated by both). Run both with --hold and release them together.
 *                    Each submits and synchronises as a mover (submit_as_mover).
 *
 * End lines: the engine-time facts each shape relies on (overlap_ns between the two
 * flows' engine intervals; for the pair, the peer and what the shared inbound lane
 * carried while this process loaded).
 */
#include "calls.h"
#include "kvpath.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define OV_KiB 1024ull

static void ov_unpool(char *p, size_t n)
{
	host_unregister(p);
	munmap(p, n);
}

static void ov_copy(void *dst, const void *src, size_t n, cudaStream_t s, const char *phase)
{
	struct truth_rec *r = truth_copy("cudaMemcpyAsync", "copy", dst, src, n, cudaMemcpyHostToDevice, s, -1);
	r->phase = phase;
	TCALL(r, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s));
}

static cudaStream_t ov_stream(void)
{
	cudaStream_t s;
	CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	return s;
}

static void ov_nap_us(long us)
{
	struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
	nanosleep(&ts, NULL);
}

/* The engine interval [lo, hi] of the copies on stream s (all phases). */
static void engine_span(cudaStream_t s, uint64_t *lo, uint64_t *hi)
{
	*lo = UINT64_MAX;
	*hi = 0;
	for (size_t i = 0; i < truth_count(); i++) {
		const struct truth_rec *r = truth_at(i);
		if (strcmp(r->op, "copy") || r->stream != (uintptr_t)s || !r->eng || !r->eng->end_ns)
			continue;
		*lo = r->eng->start_ns < *lo ? r->eng->start_ns : *lo;
		*hi = r->eng->end_ns > *hi ? r->eng->end_ns : *hi;
	}
}

/* How long copies on stream a and stream b ran on their engines at the same time. */
static uint64_t engine_overlap_ns(cudaStream_t a, cudaStream_t b)
{
	uint64_t sum = 0;
	for (size_t i = 0; i < truth_count(); i++) {
		const struct truth_rec *x = truth_at(i);
		if (strcmp(x->op, "copy") || x->stream != (uintptr_t)a || !x->eng || !x->eng->end_ns)
			continue;
		for (size_t j = 0; j < truth_count(); j++) {
			const struct truth_rec *y = truth_at(j);
			if (strcmp(y->op, "copy") || y->stream != (uintptr_t)b || !y->eng || !y->eng->end_ns)
				continue;
			uint64_t lo = x->eng->start_ns > y->eng->start_ns ? x->eng->start_ns : y->eng->start_ns;
			uint64_t hi = x->eng->end_ns < y->eng->end_ns ? x->eng->end_ns : y->eng->end_ns;
			sum += hi > lo ? hi - lo : 0;
		}
	}
	return sum;
}

int sc_no_overlap(const struct opts *o, struct result *res)
{
	size_t lb = o->layer_bytes, total = lb * (size_t)o->layers;
	char *a = pinned_pool(total, 0x61), *b = pinned_pool(total, 0x62);
	char *da = dev_alloc(total), *db = dev_alloc(total);
	cudaStream_t sa = ov_stream(), sb = ov_stream();
	hold_point(o);

	for (int phase = 0; phase < 4; phase++) {
		cudaStream_t s = phase % 2 ? sb : sa;
		char *dst = phase % 2 ? db : da, *src = phase % 2 ? b : a;
		for (int i = 0; i < o->layers; i++)
			ov_copy(dst + (size_t)i * lb, src + (size_t)i * lb, lb, s, phase % 2 ? "b" : "a");
		stream_sync(s, phase % 2 ? "b" : "a"); /* the next phase starts only after this one is done */
	}
	int bad = memcmp(da, a, total) || memcmp(db, b, total);
	uint64_t overlap = engine_overlap_ns(sa, sb);
	if (overlap) {
		fprintf(stderr, "no-overlap: the two streams' copies ran together for %llu ns\n", (unsigned long long)overlap);
		bad = 1;
	}
	snprintf(res->extra, sizeof res->extra, "\"phases\":4,\"overlap_ns\":%llu", (unsigned long long)overlap);

	CHECK(cudaStreamDestroy(sa));
	CHECK(cudaStreamDestroy(sb));
	dev_free(da);
	dev_free(db);
	ov_unpool(a, total);
	ov_unpool(b, total);
	return bad;
}

int sc_big_and_trickle(const struct opts *o, struct result *res)
{
	size_t lb = o->layer_bytes, total = lb * (size_t)o->layers, tn = 4 * OV_KiB;
	char *a = pinned_pool(total, 0x63), *t = pinned_pool(4 * tn, 0x64);
	char *da = dev_alloc(total), *dt = dev_alloc(4 * tn);
	cudaStream_t big = ov_stream(), trickle = ov_stream();
	hold_point(o);

	for (int i = 0; i < o->layers; i++)
		ov_copy(da + (size_t)i * lb, a + (size_t)i * lb, lb, big, "big");
	for (int k = 0; k < 4; k++) {
		ov_copy(dt + (size_t)k * tn, t + (size_t)k * tn, tn, trickle, "trickle");
		stream_sync(trickle, "trickle");
		ov_nap_us(1000);
	}
	stream_sync(big, "big");
	int bad = memcmp(da, a, total) || memcmp(dt, t, 4 * tn);
	/* how many trickle copies the engine ran while the big flow was on the lane */
	uint64_t lo, hi;
	engine_span(big, &lo, &hi);
	int during = 0;
	for (size_t i = 0; i < truth_count(); i++) {
		const struct truth_rec *r = truth_at(i);
		if (!strcmp(r->op, "copy") && r->stream == (uintptr_t)trickle && r->eng && r->eng->end_ns &&
		    r->eng->start_ns >= lo && r->eng->end_ns <= hi)
			during++;
	}
	snprintf(res->extra, sizeof res->extra, "\"trickle_copies\":4,\"trickle_during_big\":%d", during);

	CHECK(cudaStreamDestroy(big));
	CHECK(cudaStreamDestroy(trickle));
	dev_free(da);
	dev_free(dt);
	ov_unpool(a, total);
	ov_unpool(t, 4 * tn);
	return bad;
}

/* ---------------- two-proc-lane: two processes in lockstep on one GPU ---------------- */

/* A process submits copy i only once its peer has submitted copy i - PAIR_AHEAD. */
#define PAIR_AHEAD 2
#define PAIR_TIMEOUT_NS (30ull * 1000000000ull)

struct pair {
	uint32_t joined, done, failed, pad;
	int32_t pid[2];
	uint64_t submitted[2];
};

static struct pair *pair_open(const char *gpu, char *name, size_t len)
{
	snprintf(name, len, "/lw-ref-%s-pair", gpu);
	int fd = shm_open(name, O_RDWR | O_CREAT, 0666);
	if (fd < 0) {
		fprintf(stderr, "two-proc-lane: shm_open %s: %s\n", name, strerror(errno));
		return NULL;
	}
	struct stat st;
	if (fstat(fd, &st) || ((size_t)st.st_size < sizeof(struct pair) && ftruncate(fd, sizeof(struct pair)))) {
		fprintf(stderr, "two-proc-lane: size %s: %s\n", name, strerror(errno));
		close(fd);
		return NULL;
	}
	void *p = mmap(NULL, sizeof(struct pair), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	return p == MAP_FAILED ? NULL : p;
}

/* Waits until cond() holds, the peer failed, or the timeout passed (then fails). */
static int pair_wait(struct pair *p, int (*cond)(struct pair *, int, uint64_t), int me, uint64_t arg, const char *what)
{
	uint64_t deadline = truth_now_ns() + PAIR_TIMEOUT_NS;
	while (!cond(p, me, arg)) {
		if (__atomic_load_n(&p->failed, __ATOMIC_ACQUIRE)) {
			fprintf(stderr, "two-proc-lane: the peer failed (waiting for %s)\n", what);
			return -1;
		}
		if (truth_now_ns() > deadline) {
			__atomic_store_n(&p->failed, 1, __ATOMIC_RELEASE);
			fprintf(stderr, "two-proc-lane: timed out waiting for %s\n", what);
			return -1;
		}
		ov_nap_us(50);
	}
	return 0;
}

static int both_joined(struct pair *p, int me, uint64_t arg)
{
	(void)me, (void)arg;
	return __atomic_load_n(&p->joined, __ATOMIC_ACQUIRE) >= 2;
}

static int peer_caught_up(struct pair *p, int me, uint64_t i)
{
	return __atomic_load_n(&p->submitted[1 - me], __ATOMIC_ACQUIRE) + PAIR_AHEAD > i;
}

int sc_two_proc_lane(const struct opts *o, struct result *res)
{
	const char *gpu = getenv("LW_REF_GPU");
	if (!gpu || !*gpu) {
		fprintf(stderr, "two-proc-lane: run both processes with LW_REF_GPU=<name> (one shared reference GPU)\n");
		return 2;
	}
	size_t lb = o->layer_bytes, total = lb * (size_t)o->layers;
	char *a = pinned_pool(total, 0x65);
	char *da = dev_alloc(total);
	cudaStream_t s = ov_stream();
	char name[128];
	struct pair *p = pair_open(gpu, name, sizeof name);
	if (!p)
		return 1;
	hold_point(o);

	int me = (int)__atomic_fetch_add(&p->joined, 1, __ATOMIC_ACQ_REL);
	if (me > 1) {
		fprintf(stderr, "two-proc-lane: a third process joined %s\n", name);
		return 1;
	}
	p->pid[me] = (int32_t)getpid();
	if (pair_wait(p, both_joined, me, 0, "the peer to join"))
		return 1;
	uint64_t lane0 = refcudaLaneBytes(1);
	submit_as_mover(1);
	for (int i = 0; i < o->layers; i++) {
		if (pair_wait(p, peer_caught_up, me, (uint64_t)i, "the peer's copies"))
			return 1;
		ov_copy(da + (size_t)i * lb, a + (size_t)i * lb, lb, s, "pair");
		__atomic_store_n(&p->submitted[me], (uint64_t)i + 1, __ATOMIC_RELEASE);
	}
	stream_sync(s, "pair");
	submit_as_mover(0);
	uint64_t lane = refcudaLaneBytes(1) - lane0;
	int bad = memcmp(da, a, total) != 0;
	int32_t peer = __atomic_load_n(&p->pid[1 - me], __ATOMIC_ACQUIRE);
	if (__atomic_add_fetch(&p->done, 1, __ATOMIC_ACQ_REL) == 2)
		shm_unlink(name); /* the last one out */
	munmap(p, sizeof *p);
	/* the shared inbound lane carried our bytes and the peer's while we loaded */
	snprintf(res->extra, sizeof res->extra, "\"pair_role\":%d,\"peer_pid\":%d,\"copy_bytes\":%zu,\"lane_bytes\":%llu",
		 me, peer, total, (unsigned long long)lane);

	CHECK(cudaStreamDestroy(s));
	dev_free(da);
	ov_unpool(a, total);
	return bad;
}

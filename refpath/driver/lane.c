/*
 * The lane model: one "GPU" per process with two independent directional lanes,
 * inbound (H2D) and outbound (D2H), each with its own rate. Every chunk of a copy
 * reserves time on its direction's lane, so two same-direction copies share that
 * lane's rate (each slows down ~2x) while H2D and D2H run at full rate each
 * (PCIe is full duplex). D2D and H2H do not touch the lanes.
 */
#include "internal.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>

struct lane {
	pthread_mutex_t mu;
	uint64_t next_free; /* ns, CLOCK_MONOTONIC */
	double ns_per_byte;
};

static struct lane lanes[2] = {{.mu = PTHREAD_MUTEX_INITIALIZER}, {.mu = PTHREAD_MUTEX_INITIALIZER}};

/*
 * A chunk that directly follows the previous one of the same engine (same copy, or
 * the next copy already queued) starts where that one ended even if the thread
 * woke up late: a DMA engine has the next descriptor queued and no gap appears on
 * the wire. Without this, wake-up latency and memcpy time (scheduling on 2 vCPUs)
 * would be charged to the link. The catch-up is bounded so a long stall does not
 * turn into a burst above the lane rate.
 */
#define CATCH_UP_NS 2000000ull

void rc_lane_init(double h2d_gbps, double d2h_gbps)
{
	/* 1 GB/s is 1 byte per ns */
	lanes[0].ns_per_byte = 1.0 / h2d_gbps;
	lanes[1].ns_per_byte = 1.0 / d2h_gbps;
}

/* Reserves the lane for n bytes after *cursor; returns when the chunk is on the far side. */
static uint64_t lane_reserve(struct lane *l, size_t n, uint64_t *cursor)
{
	uint64_t now = rc_now_ns(), start = now;
	if (*cursor) {
		start = *cursor;
		if (now > start && now - start > CATCH_UP_NS)
			start = now - CATCH_UP_NS;
	}
	pthread_mutex_lock(&l->mu);
	if (start < l->next_free)
		start = l->next_free;
	uint64_t end = start + (uint64_t)((double)n * l->ns_per_byte + 0.5);
	l->next_free = end;
	pthread_mutex_unlock(&l->mu);
	*cursor = end;
	return end;
}

static void sleep_until(uint64_t t)
{
	if (rc_now_ns() >= t)
		return; /* small chunks: no syscall */
	struct timespec ts = {.tv_sec = (time_t)(t / 1000000000ull), .tv_nsec = (long)(t % 1000000000ull)};
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* Per-thread pinned bounce buffer for pageable copies, like the real driver's staging. */
static pthread_key_t stage_key;
static pthread_once_t stage_once = PTHREAD_ONCE_INIT;
static __thread char *stage_buf;
static __thread int slack_set;

static void stage_free(void *p)
{
	munmap(p, RC_CHUNK);
}

static void stage_key_init(void)
{
	pthread_key_create(&stage_key, stage_free);
}

static char *staging_buffer(void)
{
	if (!stage_buf) {
		pthread_once(&stage_once, stage_key_init);
		void *p = mmap(NULL, RC_CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
		if (p == MAP_FAILED)
			return NULL;
		stage_buf = p;
		pthread_setspecific(stage_key, p);
	}
	return stage_buf;
}

/* Chunks of a (2D) copy in order: at most RC_CHUNK bytes, never across a row. */
struct chunk_iter {
	const struct rc_xfer *x;
	size_t row, off;
};

static int chunk_next(struct chunk_iter *it, char **d, const char **s, size_t *n)
{
	const struct rc_xfer *x = it->x;
	if (it->off >= x->width) {
		it->row++;
		it->off = 0;
	}
	if (it->row >= x->height)
		return 0;
	*n = x->width - it->off < RC_CHUNK ? x->width - it->off : RC_CHUNK;
	*d = x->dst + it->row * x->dpitch + it->off;
	*s = x->src + it->row * x->spitch + it->off;
	it->off += *n;
	return 1;
}

void rc_xfer_run(const struct rc_xfer *x, uint64_t *cursor)
{
	struct lane *lane = x->dir == RC_H2D ? &lanes[0] : x->dir == RC_D2H ? &lanes[1] : NULL;
	char *stage = (x->staged && lane) ? staging_buffer() : NULL;
	struct chunk_iter it = {.x = x};
	char *d;
	const char *s;
	size_t n;

	if (x->times)
		x->times->start_ns = rc_now_ns();
	if (!lane) {
		/* D2D and H2H: no PCIe lane */
		while (chunk_next(&it, &d, &s, &n))
			memmove(d, s, n);
		goto out;
	}
	if (!slack_set) {
		/* The default 50 us timer slack would stretch every 65 us chunk sleep. */
		prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
		slack_set = 1;
	}
	/*
	 * Pipelined like a DMA engine with two descriptors in flight: the next chunk's
	 * lane time is reserved before waiting for the current one, so an engine thread
	 * that wakes up late keeps its share of a contended lane.
	 */
	if (!chunk_next(&it, &d, &s, &n))
		goto out;
	uint64_t end = lane_reserve(lane, n, cursor);
	for (;;) {
		char *nd;
		const char *ns;
		size_t nn;
		int more = chunk_next(&it, &nd, &ns, &nn);
		uint64_t next_end = more ? lane_reserve(lane, nn, cursor) : 0;
		sleep_until(end);
		if (stage) {
			/* pageable: bounce through the pinned staging buffer */
			memcpy(stage, s, n);
			memcpy(d, stage, n);
		} else {
			memcpy(d, s, n);
		}
		if (!more)
			break;
		d = nd, s = ns, n = nn, end = next_end;
	}
out:
	if (x->times)
		x->times->end_ns = rc_now_ns();
}

/*
 * The lane model: each "GPU" of a process has two independent directional lanes,
 * inbound (H2D) and outbound (D2H), each with its own rate. Every chunk of a copy
 * reserves time on its direction's lane, so two same-direction copies share that
 * lane's rate (each slows down ~2x) while H2D and D2H run at full rate each
 * (PCIe is full duplex). D2D and H2H do not touch the lanes. Each lane also counts
 * the bytes it carried (cumulative, like a PCIe byte counter); for a shared GPU the
 * counters sit in the file's head (struct refcudaLaneHead) where the NVML stand-in
 * reads them, with the end of each lane's last reserved time (busy_until_ns: the
 * stand-in's idle test).
 */
#include "internal.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

struct lane {
	pthread_mutex_t mu;
	uint64_t next_free; /* ns, CLOCK_MONOTONIC */
	double ns_per_byte;
};

/* Private lanes: the default, one "GPU" per process. */
static struct lane private_lanes[2] = {{.mu = PTHREAD_MUTEX_INITIALIZER}, {.mu = PTHREAD_MUTEX_INITIALIZER}};
static uint64_t private_bytes[2], private_busy[2];
/* The lanes this process's copies use: private_lanes, or the shared ones of LW_REF_GPU,
 * their byte counters and busy-until stamps ([0] inbound, [1] outbound). */
static struct lane *lanes = private_lanes;
static uint64_t *lane_bytes = private_bytes;
static uint64_t *lane_busy = private_busy;

/*
 * Shared lanes (LW_REF_GPU=<name>): the GPU's two lanes live in POSIX shared memory
 * /dev/shm/lw-ref-<name>, so another process's "NIC" moving bytes into or out of this
 * GPU's memory (refcudaLaneTransfer) competes on the same per-direction lanes. The
 * mutexes are process-shared and robust: a process that dies holding one does not
 * wedge the others.
 */
#define SHM_MAGIC REFCUDA_LANE_MAGIC
#define SHM_NAME_MAX REFCUDA_LANE_NAME_MAX
enum { SHM_UNINIT = 0, SHM_INITIALIZING = 1, SHM_READY = REFCUDA_LANE_READY };
struct shm_gpu {
	struct refcudaLaneHead h; /* magic, state, name, byte counters: public layout */
	struct lane l[2];         /* [0] inbound (H2D), [1] outbound (D2H) */
};

/* GPUs this process has mapped (its own and any it moves bytes for). */
#define MAX_GPUS 8
static struct {
	pthread_mutex_t mu;
	struct {
		char name[SHM_NAME_MAX];
		struct shm_gpu *g;
	} v[MAX_GPUS];
	int n;
} gpus = {.mu = PTHREAD_MUTEX_INITIALIZER};
static char own_gpu[SHM_NAME_MAX]; /* LW_REF_GPU, "" for private lanes */

static void lane_lock(struct lane *l)
{
	if (pthread_mutex_lock(&l->mu) == EOWNERDEAD)
		pthread_mutex_consistent(&l->mu); /* lane state is a time stamp: always usable */
}

static int valid_gpu_name(const char *name)
{
	size_t n = strlen(name);
	if (!n || n >= SHM_NAME_MAX)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
		      c == '_' || c == '.'))
			return 0;
	}
	return 1;
}

/*
 * Maps /dev/shm/lw-ref-<name>, creating and initialising it if needed. Rates are
 * set by whoever initialises it, and reset by a process that owns it (own != 0),
 * so a file left by an earlier run with other rates does not keep them.
 */
static struct shm_gpu *gpu_map(const char *name, int own, double h2d_gbps, double d2h_gbps)
{
	if (!valid_gpu_name(name))
		return NULL;
	pthread_mutex_lock(&gpus.mu);
	struct shm_gpu *g = NULL;
	for (int i = 0; i < gpus.n; i++)
		if (!strcmp(gpus.v[i].name, name))
			g = gpus.v[i].g;
	if (g || gpus.n == MAX_GPUS)
		goto out;
	char path[SHM_NAME_MAX + 16];
	snprintf(path, sizeof path, "/lw-ref-%s", name);
	int stale_retry = 1;
again:;
	int fd = shm_open(path, O_RDWR | O_CREAT, 0666);
	if (fd < 0)
		goto out;
	struct stat st;
	if (fstat(fd, &st) == 0 && (size_t)st.st_size < sizeof *g && ftruncate(fd, sizeof *g) != 0) {
		close(fd);
		goto out;
	}
	void *p = mmap(NULL, sizeof *g, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		goto out;
	g = p;
	uint32_t expect = SHM_UNINIT;
	if (__atomic_compare_exchange_n(&g->h.state, &expect, SHM_INITIALIZING, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
		pthread_mutexattr_t a;
		pthread_mutexattr_init(&a);
		pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
		pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
		for (int i = 0; i < 2; i++) {
			pthread_mutex_init(&g->l[i].mu, &a);
			g->l[i].next_free = 0;
		}
		pthread_mutexattr_destroy(&a);
		g->l[0].ns_per_byte = 1.0 / h2d_gbps;
		g->l[1].ns_per_byte = 1.0 / d2h_gbps;
		g->h.bytes[0] = g->h.bytes[1] = 0;
		g->h.busy_until_ns[0] = g->h.busy_until_ns[1] = 0;
		snprintf(g->h.name, sizeof g->h.name, "%s", name);
		g->h.magic = SHM_MAGIC;
		__atomic_store_n(&g->h.state, SHM_READY, __ATOMIC_RELEASE);
	} else {
		/* another process is initialising it: wait (bounded) */
		for (int i = 0; i < 100000 && __atomic_load_n(&g->h.state, __ATOMIC_ACQUIRE) != SHM_READY; i++)
			usleep(10);
		if (__atomic_load_n(&g->h.state, __ATOMIC_ACQUIRE) == SHM_READY && g->h.magic != SHM_MAGIC &&
		    stale_retry) {
			/* a file of an older layout (left by an earlier build): replace it once */
			munmap(p, sizeof *g);
			shm_unlink(path);
			stale_retry = 0;
			goto again;
		}
		if (__atomic_load_n(&g->h.state, __ATOMIC_ACQUIRE) != SHM_READY || g->h.magic != SHM_MAGIC) {
			munmap(p, sizeof *g);
			g = NULL;
			goto out;
		}
		if (own) {
			for (int i = 0; i < 2; i++) {
				lane_lock(&g->l[i]);
				g->l[i].ns_per_byte = 1.0 / (i == 0 ? h2d_gbps : d2h_gbps);
				pthread_mutex_unlock(&g->l[i].mu);
			}
		}
	}
	snprintf(gpus.v[gpus.n].name, SHM_NAME_MAX, "%s", name);
	gpus.v[gpus.n++].g = g;
out:
	pthread_mutex_unlock(&gpus.mu);
	return g;
}

/*
 * A chunk that directly follows the previous one of the same engine (same copy, or
 * the next copy already queued) starts where that one ended even if the thread
 * woke up late: a DMA engine has the next descriptor queued and no gap appears on
 * the wire. Without this, wake-up latency and memcpy time (scheduling on 2 vCPUs)
 * would be charged to the link. The catch-up is bounded so a long stall does not
 * turn into a burst above the lane rate.
 */
#define CATCH_UP_NS 2000000ull

/*
 * The process's devices, by ordinal: their names and lanes. Device 0 is the lanes
 * above (private, or LW_REF_GPU's) unless LW_REF_GPUS names the devices: then each is
 * a shared GPU, in the PCI order of their identities (refcudaGPUIdentity), which is
 * CUDA's order on a host of one GPU model.
 */
static struct dev_lanes {
	char name[SHM_NAME_MAX];
	struct lane *l;
	uint64_t *bytes, *busy;
} devs[MAX_GPUS];
static int ndevs = 1;

static uint32_t identity_key(const char *name)
{
	unsigned int domain, bus;
	refcudaGPUIdentity(name, &domain, &bus);
	return domain << 8 | bus;
}

static int by_identity(const void *a, const void *b)
{
	uint32_t x = identity_key(((const struct dev_lanes *)a)->name), y = identity_key(((const struct dev_lanes *)b)->name);
	return x < y ? -1 : x > y;
}

/* LW_REF_GPUS=<name>,<name>...: the devices; 0 when unset or unusable (told why). */
static int devices_init(double h2d_gbps, double d2h_gbps)
{
	const char *v = getenv("LW_REF_GPUS");
	if (!v || !*v)
		return 0;
	char buf[MAX_GPUS * SHM_NAME_MAX];
	snprintf(buf, sizeof buf, "%s", v);
	int n = 0;
	for (char *save = NULL, *name = strtok_r(buf, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
		struct shm_gpu *g = n < MAX_GPUS ? gpu_map(name, 1, h2d_gbps, d2h_gbps) : NULL;
		if (!g) {
			fprintf(stderr, "libcuda (reference): LW_REF_GPUS=%s: cannot map GPU %s (at most %d, names of [A-Za-z0-9._-])\n",
				v, name, MAX_GPUS);
			return 0;
		}
		snprintf(devs[n].name, SHM_NAME_MAX, "%s", name);
		devs[n].l = g->l;
		devs[n].bytes = g->h.bytes;
		devs[n].busy = g->h.busy_until_ns;
		n++;
	}
	qsort(devs, (size_t)n, sizeof devs[0], by_identity);
	for (int i = 1; i < n; i++)
		if (identity_key(devs[i].name) == identity_key(devs[i - 1].name))
			fprintf(stderr, "libcuda (reference): GPUs %s and %s have one PCI identity\n", devs[i - 1].name, devs[i].name);
	return n;
}

int rc_device_count(void)
{
	rc_init();
	return ndevs;
}

const char *rc_device_name(int dev)
{
	return dev >= 0 && dev < ndevs ? devs[dev].name : NULL;
}

/* The device whose lanes a copy takes: the owner of its device side, else 0. */
static const struct dev_lanes *xfer_device(const struct rc_xfer *x)
{
	int d = rc_device_of(x->dir == RC_H2D ? (const void *)x->dst : (const void *)x->src);
	return &devs[d >= 0 && d < ndevs ? d : 0];
}

void rc_lane_init(double h2d_gbps, double d2h_gbps)
{
	/* 1 GB/s is 1 byte per ns */
	private_lanes[0].ns_per_byte = 1.0 / h2d_gbps;
	private_lanes[1].ns_per_byte = 1.0 / d2h_gbps;
	const char *name = getenv("LW_REF_GPU");
	if (name && *name) {
		struct shm_gpu *g = gpu_map(name, 1, h2d_gbps, d2h_gbps);
		if (g) {
			lanes = g->l;
			lane_bytes = g->h.bytes;
			lane_busy = g->h.busy_until_ns;
			snprintf(own_gpu, sizeof own_gpu, "%s", name);
		} else {
			fprintf(stderr, "libcuda (reference): LW_REF_GPU=%s: cannot map /dev/shm/lw-ref-%s, "
					"using private lanes\n", name, name);
		}
	}
	int n = devices_init(h2d_gbps, d2h_gbps);
	if (n > 0) {
		ndevs = n;
		lanes = devs[0].l;
		lane_bytes = devs[0].bytes;
		lane_busy = devs[0].busy;
		snprintf(own_gpu, sizeof own_gpu, "%s", devs[0].name);
	} else {
		snprintf(devs[0].name, SHM_NAME_MAX, "%s", own_gpu);
		devs[0].l = lanes;
		devs[0].bytes = lane_bytes;
		devs[0].busy = lane_busy;
	}
}

/* Reserves the lane for n bytes after *cursor, counts them in *count and stamps *busy
 * with the reservation's end; returns when the chunk is on the far side. */
static uint64_t lane_reserve(struct lane *l, uint64_t *count, uint64_t *busy, size_t n, uint64_t *cursor)
{
	uint64_t now = rc_now_ns(), start = now;
	if (*cursor) {
		start = *cursor;
		if (now > start && now - start > CATCH_UP_NS)
			start = now - CATCH_UP_NS;
	}
	lane_lock(l);
	if (start < l->next_free)
		start = l->next_free;
	uint64_t end = start + (uint64_t)((double)n * l->ns_per_byte + 0.5);
	l->next_free = end;
	/* atomic: readers (the NVML stand-in) do not take the lane's lock */
	__atomic_fetch_add(count, (uint64_t)n, __ATOMIC_RELAXED);
	__atomic_store_n(busy, end, __ATOMIC_RELAXED); /* next_free only grows: so does this */
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
	int li = x->dir == RC_H2D ? 0 : 1;
	const struct dev_lanes *dv = xfer_device(x);
	struct lane *lane = x->dir == RC_H2D || x->dir == RC_D2H ? &dv->l[li] : NULL;
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
	if (x->ready_ns) {
		/* the engine's turnaround (internal.h): the first byte moves no earlier */
		sleep_until(x->ready_ns);
		if (*cursor && *cursor < x->ready_ns)
			*cursor = x->ready_ns;
	}
	uint64_t end = lane_reserve(lane, &dv->bytes[li], &dv->busy[li], n, cursor);
	for (;;) {
		char *nd;
		const char *ns;
		size_t nn;
		int more = chunk_next(&it, &nd, &ns, &nn);
		uint64_t next_end = more ? lane_reserve(lane, &dv->bytes[li], &dv->busy[li], nn, cursor) : 0;
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

/* ---- reference-only helpers for the RDMA provider (exported, never probed) ---- */

RC_API int refcudaDevicePointer(const void *p, size_t n, char *gpu, size_t gpulen)
{
	rc_init();
	if (!rc_is_device(p, n ? n : 1))
		return 0;
	if (gpu && gpulen) {
		int d = rc_device_of(p);
		snprintf(gpu, gpulen, "%s", d >= 0 && d < ndevs ? devs[d].name : own_gpu);
	}
	return 1;
}

/* The lane of a GPU by name, its byte counter and busy stamp: "" (or this process's
 * LW_REF_GPU) is this process's own. */
static struct lane *lane_of(const char *gpu, int inbound, uint64_t **count, uint64_t **busy)
{
	int i = inbound ? 0 : 1;
	if (!gpu || !*gpu || !strcmp(gpu, own_gpu)) {
		*count = &lane_bytes[i];
		*busy = &lane_busy[i];
		return &lanes[i];
	}
	for (int d = 1; d < ndevs; d++) /* another of this process's devices */
		if (!strcmp(gpu, devs[d].name)) {
			*count = &devs[d].bytes[i];
			*busy = &devs[d].busy[i];
			return &devs[d].l[i];
		}
	/* another process's GPU: map it with the default rates (its owner resets them) */
	struct shm_gpu *g = gpu_map(gpu, 0, 4, 4);
	if (!g)
		return NULL;
	*count = &g->h.bytes[i];
	*busy = &g->h.busy_until_ns[i];
	return &g->l[i];
}

RC_API uint64_t refcudaLaneReserve(const char *gpu, int inbound, size_t bytes, uint64_t *cursor)
{
	rc_init();
	uint64_t *count, *busy;
	struct lane *l = lane_of(gpu, inbound, &count, &busy);
	uint64_t zero = 0;
	if (!cursor)
		cursor = &zero;
	if (!l)
		return rc_now_ns();
	if (*cursor && rc_now_ns() > *cursor + CATCH_UP_NS)
		*cursor = 0; /* idle since: a new burst starts now, not in the past */
	return lane_reserve(l, count, busy, bytes, cursor);
}

/* Per calling thread: where its previous transfer on each (gpu, direction) ended. */
static __thread struct {
	int used;
	char gpu[SHM_NAME_MAX];
	uint64_t cur[2];
} tl_cursors[MAX_GPUS];

RC_API void refcudaLaneTransfer(const char *gpu, int inbound, size_t bytes)
{
	rc_init();
	if (!slack_set) {
		prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
		slack_set = 1;
	}
	const char *key = gpu ? gpu : "";
	uint64_t local = 0, *cur = &local;
	for (int i = 0; i < MAX_GPUS; i++) {
		if (!tl_cursors[i].used) {
			tl_cursors[i].used = 1;
			snprintf(tl_cursors[i].gpu, SHM_NAME_MAX, "%s", key);
		}
		if (!strcmp(tl_cursors[i].gpu, key)) {
			cur = &tl_cursors[i].cur[inbound ? 0 : 1];
			break;
		}
	}
	/* chunk by chunk, like the copy engine; returns when the last chunk is across */
	size_t left = bytes;
	while (left) {
		size_t n = left < RC_CHUNK ? left : RC_CHUNK;
		uint64_t end = refcudaLaneReserve(gpu, inbound, n, cur);
		left -= n;
		sleep_until(end);
	}
}

RC_API uint64_t refcudaLaneBytes(int inbound)
{
	rc_init();
	return __atomic_load_n(&lane_bytes[inbound ? 0 : 1], __ATOMIC_RELAXED);
}

/*
 * An SM's loads and stores (refcuda.h): a kernel that reads host memory over PCIe (or
 * writes it) moves its bytes over the same lane as a copy engine, so they are paced
 * and counted by the lane model like a copy's chunks. It runs on the kernel's stream
 * engine, in the engine's lane cursor: no copy entry point is on its path.
 */
RC_API CUresult refcudaSMCopy(const struct refcudaKernelLaunch *l, void *dst, const void *src, size_t n)
{
	rc_init();
	if (!n)
		return CUDA_SUCCESS;
	if (!l || !dst || !src)
		return CUDA_ERROR_INVALID_VALUE;
	int dd = rc_is_device(dst, n), sd = rc_is_device(src, n);
	if (!dd && !sd)
		return CUDA_ERROR_INVALID_VALUE;
	struct rc_xfer x = {
		.dst = dst, .src = src, .dpitch = n, .spitch = n, .width = n, .height = 1,
		.dir = dd && sd ? RC_D2D : dd ? RC_H2D : RC_D2H,
	};
	rc_xfer_run(&x, l->cursor);
	return CUDA_SUCCESS;
}

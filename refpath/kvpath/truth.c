/* Ground-truth recorder and JSONL writer shared by kvpath and kvdl. */
#include "truth.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BLOCK 1024u
#define MAX_BLOCKS 65536u

static struct {
	pthread_mutex_t mu;
	const char *scenario;
	truth_set_records_fn set_records;
	struct truth_rec *blocks[MAX_BLOCKS]; /* records never move: engines write into them */
	size_t n;
} T = {.mu = PTHREAD_MUTEX_INITIALIZER};

struct mrange {
	uintptr_t base;
	size_t len;
	enum mem_class c;
	int before_attach;
};
static struct {
	struct mrange v[256];
	size_t n;
} M;

uint64_t truth_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void truth_init(const char *scenario, truth_set_records_fn set_records)
{
	T.scenario = scenario;
	T.set_records = set_records;
}

void truth_note_mem(const void *p, size_t len, enum mem_class c, int before_attach)
{
	if (M.n == sizeof M.v / sizeof M.v[0]) {
		fprintf(stderr, "truth: too many memory ranges\n");
		exit(1);
	}
	M.v[M.n++] = (struct mrange){(uintptr_t)p, len, c, before_attach};
}

void truth_forget_mem(const void *p)
{
	for (size_t i = 0; i < M.n; i++)
		if (M.v[i].base == (uintptr_t)p) {
			M.v[i] = M.v[--M.n];
			return;
		}
}

static const struct mrange *find(const void *p)
{
	uintptr_t a = (uintptr_t)p;
	for (size_t i = 0; i < M.n; i++)
		if (a >= M.v[i].base && a < M.v[i].base + M.v[i].len)
			return &M.v[i];
	return NULL;
}

static const char *mem_name(enum mem_class c)
{
	switch (c) {
	case MEM_PINNED:
		return "pinned";
	case MEM_DEVICE:
		return "device";
	case MEM_MANAGED:
		return "managed";
	case MEM_PAGEABLE:
		break;
	}
	return "pageable";
}

/* What an observer must report of memory r placed by its address (NULL: host memory
 * not noted, mapped while observed): its kind, or "unknown" for memory mapped,
 * allocated or registered before the observer attached — it cannot know, and must say
 * so. (A side a call states to be device memory is "device" whatever r is.) */
static const char *expect_mem(const struct mrange *r)
{
	if (!r)
		return "pageable";
	if (r->before_attach)
		return "unknown";
	return mem_name(r->c);
}

int truth_is_device(const void *p)
{
	const struct mrange *r = find(p);
	return r && r->c == MEM_DEVICE;
}

int truth_is_pinned(const void *p)
{
	const struct mrange *r = find(p);
	return r && r->c == MEM_PINNED;
}

struct truth_rec *truth_new(const char *api, const char *op)
{
	pthread_mutex_lock(&T.mu);
	size_t i = T.n;
	if (i / BLOCK >= MAX_BLOCKS) {
		fprintf(stderr, "truth: too many records\n");
		exit(1);
	}
	if (!T.blocks[i / BLOCK]) {
		T.blocks[i / BLOCK] = calloc(BLOCK, sizeof(struct truth_rec));
		if (!T.blocks[i / BLOCK]) {
			fprintf(stderr, "truth: out of memory\n");
			exit(1);
		}
	}
	T.n++;
	pthread_mutex_unlock(&T.mu);
	struct truth_rec *r = &T.blocks[i / BLOCK][i % BLOCK];
	r->seq = i + 1;
	r->api = api;
	r->op = op;
	r->tid = (int)gettid();
	r->layer = -1;
	r->batch_index = -1;
	r->kind = -1;
	return r;
}

size_t truth_count(void)
{
	return T.n;
}

struct truth_rec *truth_at(size_t i)
{
	return &T.blocks[i / BLOCK][i % BLOCK];
}

struct truth_rec *truth_copy(const char *api, const char *op, const void *dst, const void *src, uint64_t bytes,
			     int kind, void *stream, int layer)
{
	struct truth_rec *r = truth_copy_unarmed(api, op, dst, src, bytes, kind, stream, layer);
	truth_arm_times(&r, 1);
	return r;
}

struct truth_rec *truth_copy_unarmed(const char *api, const char *op, const void *dst, const void *src,
				     uint64_t bytes, int kind, void *stream, int layer)
{
	struct truth_rec *r = truth_new(api, op);
	r->dst = (uintptr_t)dst;
	r->src = (uintptr_t)src;
	r->bytes = bytes;
	r->kind = kind;
	r->stream = (uintptr_t)stream;
	r->has_stream = 1;
	r->layer = layer;
	const struct mrange *d = find(dst), *s = find(src);
	int dd = d && d->c == MEM_DEVICE, sd = s && s->c == MEM_DEVICE;
	int stated = kind >= cudaMemcpyHostToDevice && kind <= cudaMemcpyDeviceToDevice;
	if (stated) {
		/* the requested direction, even where a pointer is not what it claims */
		dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
		sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
	}
	r->expect_dst_mem = stated && dd ? "device" : expect_mem(d);
	r->expect_src_mem = stated && sd ? "device" : expect_mem(s);
	if (!stated && ((d && d->c == MEM_MANAGED) || (s && s->c == MEM_MANAGED))) {
		r->direction = "unknown";
		r->host_mem = r->expect_host_mem = "managed";
		return r;
	}
	const struct mrange *host = NULL;
	if (dd && sd) {
		r->direction = "D2D";
	} else if (dd) {
		r->direction = "H2D";
		host = s;
	} else if (sd) {
		r->direction = "D2H";
		host = d;
	} else {
		r->direction = "H2H";
		host = s;
	}
	if (dd && sd) {
		r->host_mem = r->expect_host_mem = "device";
	} else {
		r->host_mem = host ? mem_name(host->c) : "pageable";
		r->expect_host_mem = expect_mem(host);
	}
	return r;
}

void truth_disarm(void)
{
	if (T.set_records)
		T.set_records(NULL, 0);
}

void truth_arm_times(struct truth_rec **recs, size_t n)
{
	if (!T.set_records || !n)
		return;
	if (n == 1) {
		recs[0]->eng = &recs[0]->own;
		T.set_records(recs[0]->eng, 1);
		return;
	}
	/* a batch needs its slots contiguous; freed at exit */
	struct refcudaCopyTimes *v = calloc(n, sizeof *v);
	if (!v)
		return;
	for (size_t i = 0; i < n; i++)
		recs[i]->eng = &v[i];
	T.set_records(v, n);
}

static void json_str(FILE *f, const char *k, const char *v)
{
	/* all our strings are identifiers: no escaping needed */
	fprintf(f, ",\"%s\":\"%s\"", k, v);
}

static void json_u(FILE *f, const char *k, uint64_t v)
{
	fprintf(f, ",\"%s\":%llu", k, (unsigned long long)v);
}

static void json_i(FILE *f, const char *k, long long v)
{
	fprintf(f, ",\"%s\":%lld", k, v);
}

static int is_copy(const char *op)
{
	return !strcmp(op, "copy") || !strcmp(op, "copy2d") || !strcmp(op, "copy_peer") || !strcmp(op, "copy_batch");
}

int truth_write(const char *path, const char *extra)
{
	FILE *f = fopen(path, "w");
	if (!f) {
		perror(path);
		return -1;
	}
	int pid = (int)getpid();
	for (size_t i = 0; i < T.n; i++) {
		const struct truth_rec *r = truth_at(i);
		fprintf(f, "{\"seq\":%llu", (unsigned long long)r->seq);
		json_str(f, "scenario", T.scenario);
		json_i(f, "pid", pid);
		json_i(f, "tid", r->tid);
		json_str(f, "api", r->api);
		json_str(f, "op", r->op);
		json_i(f, "result", r->ret);
		if (is_copy(r->op)) {
			if (r->gpu)
				json_str(f, "gpu", r->gpu);
			json_u(f, "dst", r->dst);
			json_u(f, "src", r->src);
			json_u(f, "bytes", r->bytes);
			json_i(f, "kind", r->kind);
			json_str(f, "direction", r->direction);
			json_u(f, "stream", r->stream);
			json_str(f, "host_mem", r->host_mem);
			json_str(f, "expect_host_mem", r->expect_host_mem);
			json_str(f, "expect_src_mem", r->expect_src_mem);
			json_str(f, "expect_dst_mem", r->expect_dst_mem);
			if (r->batch_index >= 0)
				json_i(f, "batch_index", r->batch_index);
			if (r->is2d) {
				json_u(f, "dpitch", r->dpitch);
				json_u(f, "spitch", r->spitch);
				json_u(f, "width", r->width);
				json_u(f, "height", r->height);
			}
		} else if (!strcmp(r->op, "kernel_copy")) {
			/* a copy kernel's launch: its bytes cross the lanes, moved by SMs,
			 * in the direction the scenario knows (the kernel's name does not say) */
			json_str(f, "kernel", r->kernel);
			json_str(f, "mover", "sm");
			if (r->gpu)
				json_str(f, "gpu", r->gpu);
			json_u(f, "dst", r->dst);
			json_u(f, "src", r->src);
			json_u(f, "bytes", r->bytes);
			json_str(f, "direction", r->direction);
			json_str(f, "host_mem", r->host_mem);
			json_u(f, "stream", r->stream);
		} else if (!strcmp(r->op, "captured_copy")) {
			/* a copy recorded into a graph by stream capture: it moves nothing at
			 * its call (no record expected), its bytes move at each graph launch */
			json_u(f, "dst", r->dst);
			json_u(f, "src", r->src);
			json_u(f, "bytes", r->bytes);
			json_i(f, "kind", r->kind);
			json_str(f, "direction", r->direction);
			json_str(f, "host_mem", r->host_mem);
			json_u(f, "stream", r->stream);
		} else {
			if (r->kernel)
				json_str(f, "kernel", r->kernel);
			if (r->ptr)
				json_u(f, "ptr", r->ptr);
			if (r->size)
				json_u(f, "bytes", r->size);
			if (r->has_stream)
				json_u(f, "stream", r->stream);
			if (r->has_event)
				json_u(f, "event", r->event);
			if (r->has_flags)
				json_u(f, "flags", r->flags);
		}
		json_i(f, "layer", r->layer);
		if (r->phase)
			json_str(f, "phase", r->phase);
		json_u(f, "t_call_ns", r->t_call_ns);
		json_u(f, "t_return_ns", r->t_return_ns);
		if (r->eng && r->eng->end_ns) {
			json_u(f, "engine_start_ns", r->eng->start_ns);
			json_u(f, "engine_end_ns", r->eng->end_ns);
		}
		fputs("}\n", f);
	}
	fprintf(f, "{\"end\":true,\"scenario\":\"%s\",\"pid\":%d,\"calls\":%zu%s%s}\n", T.scenario, pid, T.n,
		extra && *extra ? "," : "", extra ? extra : "");
	if (fclose(f) != 0) {
		perror(path);
		return -1;
	}
	return 0;
}
